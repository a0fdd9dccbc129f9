"""Which code location declares the pipelines a command works on, found the way Dagster's own commands find it:
``-m`` a module, ``-f`` a Python file, ``-w`` a workspace file (its ``python_module`` and ``python_file``
entries), by default the ``workspace.yaml`` in the working directory.  Loading a location builds its
definitions, YAML components and ``@definitions`` functions included: every pipeline built is found, and every
``OnlineTrainingPipeline`` the location's modules declare."""

from __future__ import annotations

import importlib
import runpy
import sys
from pathlib import Path

from kale_dagster.errors import CommandError


def add_pipeline_arguments(parser) -> None:
    """``--pipeline NAME`` and where it is declared (``-m``, ``-f``, ``-w``): what ``find_pipeline`` reads."""
    parser.add_argument("--pipeline", required=True, help="pipeline name")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-m", "--module", help="a module whose definitions declare the pipelines")
    where.add_argument("-f", "--python-file", help="a Python file whose definitions declare the pipelines")
    where.add_argument(
        "-w", "--workspace", help="a workspace file (python_module and python_file entries); default: workspace.yaml"
    )


def find_pipeline(args, name: str):
    """The pipeline ``name`` from the code location the arguments name."""
    from kale_dagster.definitions.build import built_pipelines

    try:
        where, declared = _load(args)
    except CommandError:
        raise
    except Exception as exc:  # the location's own code failed to load: its first line, not a traceback
        first = (str(exc).strip().splitlines() or [""])[0]
        raise CommandError(f"loading the code location failed: {type(exc).__name__}: {first}") from exc
    found = {**declared, **built_pipelines()}
    if name not in found:
        raise CommandError(f"no pipeline {name!r} in {where}; found: {', '.join(sorted(found)) or 'none'}")
    return found[name]


def _load(args) -> tuple[str, dict]:
    """Load the location's definitions: what was loaded (for messages), and the pipelines its modules declare."""
    if args.module:
        return f"module {args.module}", _build(_import(args.module, None))
    if args.python_file:
        return f"file {args.python_file}", _build(_run_file(Path(args.python_file)))
    workspace = Path(args.workspace or "workspace.yaml")
    if not workspace.is_file():
        raise CommandError(
            f"no {workspace}: name the code location with -m MODULE, -f FILE or -w WORKSPACE"
            if not args.workspace
            else f"no workspace file {workspace}"
        )
    declared: dict = {}
    for kind, target, working_directory in _workspace_entries(workspace):
        declared.update(
            _build(_import(target, working_directory) if kind == "python_module" else _run_file(Path(target)))
        )
    return f"workspace {workspace}", declared


#: A workspace entry's kind, and the key that names its target (a string entry is that key's value).
_ENTRY_TARGET = {"python_module": "module_name", "python_file": "relative_path"}


def _workspace_entries(workspace: Path) -> list[tuple[str, str, str]]:
    """(kind, module name or file path, working directory) for each Python entry of a workspace file."""
    import yaml

    base = workspace.parent.resolve()
    entries = []
    for entry in (yaml.safe_load(workspace.read_text()) or {}).get("load_from") or []:
        for kind, key in _ENTRY_TARGET.items():
            spec = entry.get(kind) if isinstance(entry, dict) else None
            if spec is None:
                continue
            spec = {key: spec} if isinstance(spec, str) else spec
            target = spec[key] if kind == "python_module" else str(base / spec[key])
            entries.append((kind, target, str((base / spec.get("working_directory", ".")).resolve())))
    if not entries:
        raise CommandError(f"{workspace} loads no python_module or python_file")
    return entries


def _import(module_name: str, working_directory: str | None):
    if working_directory and working_directory not in sys.path:
        sys.path.insert(0, working_directory)
    elif "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return vars(importlib.import_module(module_name))
    except ImportError as exc:
        raise CommandError(f"cannot import {module_name}: {exc}") from exc


def _run_file(path: Path) -> dict:
    if not path.is_file():
        raise CommandError(f"no file {path}")
    sys.path.insert(0, str(path.resolve().parent))
    return runpy.run_path(str(path))


def _build(namespace: dict) -> dict:
    """Build what the location defines lazily (``@dagster.definitions`` functions; the rest is built at import);
    the pipelines the namespace declares, by name."""
    from dagster import Definitions, definitions

    from kale_dagster.definitions.pipeline import OnlineTrainingPipeline

    lazy: type = type(definitions(lambda: Definitions()))  # the type @definitions returns, as it is today
    for value in list(namespace.values()):
        if type(value) is lazy:
            value()
    return {v.name: v for v in namespace.values() if isinstance(v, OnlineTrainingPipeline)}
