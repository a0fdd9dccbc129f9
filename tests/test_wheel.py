"""The installable wheel, without a source checkout: build it, install it in a fresh virtual environment
(no system packages, nothing of this repository on the path), and run what the README promises.

pip downloads the dependencies the wheel declares (from its cache after .ci/install), so a
dependency that is imported but not declared fails here.  torch is installed first, pinned to the
CPU build .ci/install uses, as a user would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kale_dagster import __version__
from kale_dagster.stream.broker import free_loopback_port

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]


def run(cmd: list, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> dict:
    """A fresh virtual environment with only the built wheel (and its declared dependencies) installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from what git would commit, in a copy: the wheel must not depend on build leftovers here.
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    source = tmp / "source"
    for name in files:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    # As on a user's machine: no PYTHONDONTWRITEBYTECODE, so what one command compiles the next one reuses, and
    # pip need not byte-compile all of torch and dagster up front (--no-compile: 40% of this setup).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    run([sys.executable, "-m", "build", "--wheel", "--outdir", tmp / "dist", source], cwd=tmp, env=env, timeout=600)
    wheels = list((tmp / "dist").glob("kale_dagster-*.whl"))
    assert len(wheels) == 1, wheels

    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", venv], cwd=tmp, env=env)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    run([*pip, "torch==2.13.0"], cwd=tmp, env=env, timeout=900)
    run([*pip, wheels[0]], cwd=tmp, env=env, timeout=900)

    work = tmp / "work"  # not the repository: nothing of the checkout is importable from here
    work.mkdir()
    env = dict(
        env, PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", DAGSTER_HOME=str(tmp / "home"), HOME=str(tmp / "user")
    )
    (tmp / "home").mkdir()
    (tmp / "user").mkdir()
    return {"bin": venv / "bin", "work": work, "env": env}


def test_the_wheel_installs_its_commands_and_code_locations(venv):
    bin_, work, env = venv["bin"], venv["work"], venv["env"]
    assert run([bin_ / "kale", "--version"], work, env).stdout.split()[-1] == __version__
    where = run(
        [
            bin_ / "python",
            "-c",
            "import kale_dagster, pipelines, sensors; print(kale_dagster.__file__, sensors.__file__)",
        ],
        work,
        env,
    ).stdout
    assert all(str(bin_.parent) in path for path in where.split()), where
    assert str(ROOT) not in where

    # The code locations `dagster dev -m ...` serves: the demo's and the production example's.
    for module in ("kale_dagster.demo.definitions", "pipelines.definitions"):
        out = run([bin_ / "dagster", "definitions", "validate", "-m", module], work, env)
        assert "passed validation" in out.stdout + out.stderr, module


def test_forecast_and_backtest_run_from_the_wheel(venv):
    bin_, work, env = venv["bin"], venv["work"], venv["env"]
    run([bin_ / "kale", "trace", "synth", "--days", "5", "--step-seconds", "600", "--out", "t.csv"], work, env)
    forecast = json.loads(
        run(
            [bin_ / "kale", "forecast", "--trace", "t.csv", "--horizon", "120", "--eval-days", "1", "--json"], work, env
        ).stdout
    )
    assert forecast["model"] == "prophet" and forecast["relative_mae"] > 0  # Prophet's Stan backend ships in the venv
    backtest = json.loads(
        run(
            [
                bin_ / "kale",
                "backtest",
                "--trace",
                "t.csv",
                "--warmup-days",
                "3",
                "--no-sweeps",
                "--no-variants",
                "--no-optimum",
                "--json",
            ],
            work,
            env,
        ).stdout
    )
    assert set(backtest["policies"]) == {"kale", "hpa", "keda", "static"}
    assert backtest["policies"]["kale"]["gpu_hours"] > 0


def test_the_demo_runs_from_the_wheel(venv):
    bin_, work, env = venv["bin"], venv["work"], venv["env"]
    out = run(
        [
            bin_ / "kale",
            "demo",
            "--max-minutes",
            "1",
            "--port",
            free_loopback_port(),
            "--ui-port",
            free_loopback_port(),
        ],
        work,
        env,
        timeout=600,
    ).stdout
    assert "Dagster decided:" in out, out[-3000:]
    summary = json.loads(out.split("summary: ", 1)[1].splitlines()[0].replace("'", '"'))
    assert summary["failed_runs"] == 0, summary
