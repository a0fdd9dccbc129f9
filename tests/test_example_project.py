"""examples/demand_forecaster as a team copies it: its walk-through stays within 10 commands, its declaration
loads where ``kale`` and Dagster load it, and a trial's compressed clock is one clock in every process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1] / "examples" / "demand_forecaster"


def _walk_through() -> list[str]:
    text = (PROJECT / "README.md").read_text()
    block = re.search(r"## From clone to the first savings report.*?```bash\n(.*?)```", text, re.S)
    assert block, "the README's walk-through block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_walk_through_is_at_most_ten_commands_each_explained():
    commands = _walk_through()
    assert len(commands) <= 10
    explained = re.findall(r"^ ?(\d+)\. ", (PROJECT / "README.md").read_text(), re.M)
    assert len(commands) == len(set(explained)) == max(map(int, explained))


def _kale(tmp_path: Path, scale: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        DAGSTER_HOME=str(tmp_path),
        DEMAND_TIME_SCALE=scale,
        DEMAND_KAFKA="127.0.0.1:9",
        PYTHONPATH=os.pathsep.join([str(PROJECT / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    command = [sys.executable, "-m", "kale_dagster.cli", *args, "-m", "demand_forecaster.definitions"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_the_declaration_loads_and_a_trial_keeps_one_clock(tmp_path):
    first = _kale(tmp_path, "300", "report", "--pipeline", "demand")
    # Loaded and built: an advisory pipeline with no history yet, said in one line.
    assert first.returncode == 2 and "no savings report for 'demand'" in first.stderr, first.stderr
    trial = tmp_path / "demand-trial.json"
    started = trial.read_text()
    assert _kale(tmp_path, "300", "report", "--pipeline", "demand").returncode == 2
    assert trial.read_text() == started  # the second process joined the trial the first began
    other = _kale(tmp_path, "100", "report", "--pipeline", "demand")
    assert other.returncode == 2 and "began a trial at DEMAND_TIME_SCALE=300: use it, or remove it" in other.stderr
