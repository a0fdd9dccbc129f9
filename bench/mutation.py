"""Mutation testing of the decision logic: do the unit tests fail when the code is wrong?

mutmut (PyPI) changes one thing at a time in ``kale_dagster/model/``, ``kale_dagster/policies/``,
``kale_dagster/rules.py`` and ``kale_dagster/control/`` (an operator, a constant, a comparison, an argument) and runs
the unit tests that reach the changed function.  A mutant the tests fail on (or hang on: a timeout) is killed; one
they pass on survived, and one no test reaches has no tests.  The score is killed / (killed + survived + no tests);
the target is at least 85%.

It runs on a copy of the checkout (committed files only) in a scratch folder, so the working tree is never touched,
and prints the score per module and every survivor (``--diffs``: with its change).  Minutes to hours: a bench, not
part of CI.

    pip install mutmut==3.8.1
    python bench/mutation.py [--max-children 2] [--only 'kale_dagster/model/*'] [--diffs FILE] [--keep DIR]

With ``--keep DIR`` the run's folder stays, and running again with the same folder goes on where it stopped (mutmut
keeps each mutant's result there); ``--report-only`` prints the score of what that folder has judged so far (a
run stopped part way: the mutants not yet checked are left out of the score, and counted).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTATED = ["kale_dagster/model/*", "kale_dagster/policies/*", "kale_dagster/rules.py", "kale_dagster/control/*"]
#: The unit tests of what is mutated.  Left out: the integration tests (Kafka, Dagster, processes: minutes each) and
#: tests/test_simulate.py, whose backtests run every policy through whole traces (280 s of the 330 s these files
#: take): run per mutant they would take the bench from about an hour to about ten, and a unit test should catch
#: what they catch.
TESTS = [
    "tests/test_control.py",
    "tests/test_declared_fields.py",
    "tests/test_hpa.py",
    "tests/test_kale_policy.py",
    "tests/test_keda.py",
    "tests/test_limits.py",
    "tests/test_oracle.py",
    "tests/test_projection.py",
    "tests/test_record_time.py",
    "tests/test_registries.py",
    "tests/test_rules.py",
    "tests/test_schedule.py",
    "tests/test_stabilizer.py",
    "tests/test_throughput.py",
]
#: A pytest plugin for every mutant's test run.  mutmut forks each mutant's run from the process that ran the clean
#: tests, so a result that process cached (a cached function's, a throughput model's table kept by a test module)
#: would be read instead of computed again, and a mutant in the function that computes it would "survive".
FRESH_STATE = """
import functools, gc, sys

def pytest_sessionstart(session):
    from kale_dagster.model.throughput import ThroughputModel
    for name, module in list(sys.modules.items()):
        if name.startswith("kale_dagster"):
            for value in list(vars(module).values()):
                if isinstance(value, functools._lru_cache_wrapper):
                    value.cache_clear()
    for obj in gc.get_objects():
        if isinstance(obj, ThroughputModel):
            obj._cache.clear()
"""
PYTEST_ARGS = ["-m", "not integration and not slow", "-p", "no:randomly", "-p", "kale_fresh_state", "-q"]
KILLED = {"killed", "caught by type check", "timeout"}
MISSED = {"survived", "no tests"}


def _config(only: list[str]) -> str:
    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["kale_dagster"]\n'
        # kale_dagster/sensors links to the top-level sensors/, which mutmut's copy of the package would leave out.
        'also_copy = ["kale_dagster/sensors", "kale_fresh_state.py"]\n'
        f"only_mutate = {toml_list(only)}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(TESTS)}\n"
        f"pytest_add_cli_args = {toml_list(PYTEST_ARGS)}\n"
    )


def _copy(into: Path) -> None:
    """The committed tree, as a fresh clone would have it."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def _statuses(work: Path) -> dict[str, str]:
    """Each mutant's status, as ``mutmut results --all`` prints them."""
    out = subprocess.run(
        ["mutmut", "results", "--all", "true"], cwd=work, check=True, capture_output=True, text=True
    ).stdout
    return {
        name.strip(): status.strip()
        for name, _, status in (line.rpartition(":") for line in out.splitlines() if ":" in line)
    }


def _module(mutant: str) -> str:
    """``kale_dagster.model.schedule.x_plan_from_now__mutmut_3`` -> ``kale_dagster.model.schedule``."""
    return mutant.split(".x", 1)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--only", action="append", help="glob of the files to mutate (repeatable); default: all four")
    parser.add_argument("--diffs", type=Path, help="write each survivor's change to this file")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a scratch folder)")
    parser.add_argument("--report-only", action="store_true", help="with --keep: the score of what it has judged")
    args = parser.parse_args()
    if args.report_only and args.keep is None:
        parser.error("--report-only reads the folder of an earlier run: give it with --keep")
    if shutil.which("mutmut") is None:
        print("mutmut is not installed: pip install mutmut==3.8.1", file=sys.stderr)
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="kale-mutation-"))
    started = time.perf_counter()
    if not args.report_only:
        work.mkdir(parents=True, exist_ok=True)
        _copy(work)
        with (work / "pyproject.toml").open("a") as f:
            f.write(_config(args.only or MUTATED))
        (work / "kale_fresh_state.py").write_text(FRESH_STATE)
        subprocess.run(["mutmut", "run", "--max-children", str(args.max_children)], cwd=work, check=True)
    wall = time.perf_counter() - started
    statuses = _statuses(work)
    per_module: dict[str, Counter] = defaultdict(Counter)
    for mutant, status in statuses.items():
        per_module[_module(mutant)][status] += 1
    total: Counter = Counter(statuses.values())

    def score(counts: Counter) -> str:
        killed = sum(counts[s] for s in KILLED)
        judged = killed + sum(counts[s] for s in MISSED)
        return f"{killed / judged:6.1%} of {judged}" if judged else "   n/a"

    print(
        f"\nmutation score (killed / killed + survived + no tests), {wall / 60:.0f} min on {args.max_children} children"
    )
    if total["not checked"]:
        print(f"  {total['not checked']} of {len(statuses)} mutants not checked yet: left out of the score")
    for module in sorted(per_module):
        counts = per_module[module]
        rest = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if s not in KILLED)
        print(f"  {module:45s} {score(counts)}  {rest}")
    print(f"  {'all':45s} {score(total)}  {dict(total)}")
    survivors = sorted(m for m, s in statuses.items() if s in MISSED)
    print(f"\nsurvivors ({len(survivors)}):")
    for mutant in survivors:
        print(f"  {mutant}")
    if args.diffs:
        diffs = [
            subprocess.run(["mutmut", "show", m], cwd=work, capture_output=True, text=True).stdout for m in survivors
        ]
        args.diffs.write_text("\n".join(diffs))
        print(f"their changes: {args.diffs}")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
