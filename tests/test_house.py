"""The house's size limits: no library module over 500 lines, no function over 60 (outside bench/ and tests/).

A module or a function that grows past its limit fails here, naming it: split the module, name the function's
steps."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES, FUNCTION_LINES = 500, 60


def _sources() -> list[Path]:
    return sorted(p for part in ("kale_dagster", "sensors", "pipelines") for p in (ROOT / part).rglob("*.py"))


def test_no_module_grows_past_its_limit():
    over = {}
    for path in _sources():
        lines = len(path.read_text().splitlines())
        name = path.relative_to(ROOT).as_posix()
        if lines > MODULE_LINES:
            over[name] = lines
    assert not over, f"modules over {MODULE_LINES} lines: split them: {over}"


def test_no_function_grows_past_its_limit():
    over = {}
    for path in _sources():
        name = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                key = f"{name}:{node.name}"
                if length > FUNCTION_LINES:
                    over[key] = length
    assert not over, f"functions over {FUNCTION_LINES} lines: name their steps: {over}"
