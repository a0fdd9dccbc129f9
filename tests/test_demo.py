"""`kale demo` as the README runs it, checked while it runs and when it stops.

One demo (a day compressed into 10 minutes: long enough for the UI checks to
finish before the day ends on a loaded machine) serves both tests of this
module.  While it runs, headless Chromium renders the Dagster UI and the
test reads the same instance and trainer service the demo uses: Dagster is
the only controller (its latest decision is what the launcher runs), a
rescale run requested by the metrics sensor succeeded, the forecast is
Prophet's, and no run failed.  Then Ctrl-C stops everything cleanly.
Screenshots land in artifacts/ui/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from kale_dagster.stream.broker import free_loopback_port
from support import prerequisite_missing, wait_for

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts" / "ui"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LOCATION = "kale_dagster.demo.definitions"

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("demo")]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A running `kale demo`: its process, Dagster home and UI port; stopped after the module."""
    cwd = tmp_path_factory.mktemp("demo")
    ui_port, broker_port = free_loopback_port(), free_loopback_port()
    out = cwd / "demo.out"  # a file, not a pipe: an unread pipe would fill up and block the status line
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kale_dagster.cli",
            "demo",
            "--day-minutes",
            "10",
            "--max-minutes",
            "14",
            "--port",
            str(broker_port),
            "--ui-port",
            str(ui_port),
        ],
        cwd=cwd,
        stdout=open(out, "w"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    home = cwd / ".kale" / "demo-home"
    yield {"proc": proc, "home": home, "ui_port": ui_port, "out": out}
    if proc.poll() is None:  # a test failed before stopping it: Ctrl-C first, so it stops what it started
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _get(url: str):
    """The JSON an HTTP GET answers, or None while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def _chromium(url: str, *args: str, timeout_s: float = 90.0) -> tuple[str, str]:
    """(stdout, what went wrong) of one headless Chromium; one that hangs is killed with its children."""
    profile = tempfile.mkdtemp(prefix="kale-chromium-")
    proc = subprocess.Popen(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--no-first-run",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=20000",
            "--window-size=1600,1000",
            *args,
            url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return out, f"exit {proc.returncode}: {err[-2000:]}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "", f"no answer within {timeout_s:.0f} s"
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def _page(url: str, shot: str) -> str:
    """The page's DOM once rendered, with a screenshot of it.  A browser that exits without a DOM or hangs
    (seen in CI when the demo's workers and Dagster's runs share 2 cores with it) is started again; the
    page's content is what is checked."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        dom, why = _chromium(url, f"--screenshot={ARTIFACTS / shot}", "--dump-dom")  # one render, both outputs
        if dom.strip():
            return dom
    raise AssertionError(f"chromium rendered no DOM for {url} ({why})")


def test_dagster_is_the_one_controller_and_the_ui_shows_it(demo):
    if CHROMIUM is None:
        prerequisite_missing("Debian's chromium is not installed (bash .ci/install installs it)")
    from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter

    home, port = demo["home"], demo["ui_port"]
    wait_for(lambda: _get(f"http://127.0.0.1:{port}/server_info") is not None, 240, "dagster dev to answer")
    trainer_url = json.loads((home / "kale" / "demo.json").read_text())["trainer_url"]
    instance = DagsterInstance.from_config(str(home))
    try:

        def rescaled_by_the_sensor():
            runs = instance.get_run_records(RunsFilter(job_name="demo_rescale", statuses=[DagsterRunStatus.SUCCESS]))
            return [r for r in runs if r.dagster_run.tags.get("dagster/sensor_name") == "demo_stream_metrics"]

        runs = wait_for(rescaled_by_the_sensor, 360, "a rescale run requested by the metrics sensor to succeed")
        from kale_dagster.definitions.decision import RescaleConfig

        assert RescaleConfig.of(runs[0].dagster_run.run_config).workers
        forecast = wait_for(
            lambda: instance.get_latest_materialization_event(AssetKey(["demo", "traffic_forecast"])), 60, "a forecast"
        )
        meta = forecast.asset_materialization.metadata
        assert meta["model"].value == "prophet" and meta["fallback"].value == "none" and meta["seeded_points"].value > 0
        plot = Path(meta["plot"].value)  # a file beside the instance's storage; the event keeps its path
        assert plot.parent.name == "demo" and plot.read_bytes()[:4] == b"\x89PNG"

        from kale_dagster.launchers.service import LocalTrainerClient

        trainer = LocalTrainerClient(trainer_url)  # with the token the demo's trainer service wrote

        def decision_matches_what_runs():
            status = trainer.status()
            decision = instance.get_latest_materialization_event(
                AssetKey(["demo", "gpu_allocation"])
            ).asset_materialization.metadata
            return (
                not status.rescaling
                and decision["workers"].value == status.workers == decision["running_workers"].value
            )

        wait_for(decision_matches_what_runs, 120, "the latest decision to equal the workers the launcher runs")

        # The operator's view of the demo: `kale status` and the Prometheus collector, from the instance alone.
        import subprocess
        import sys

        from prometheus_client import CollectorRegistry, generate_latest

        from kale_dagster.definitions.prometheus import PipelineCollector

        done = subprocess.run(
            [sys.executable, "-m", "kale_dagster.cli", "status", "--json", "--pipeline", "demo"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DAGSTER_HOME": str(home)},
        )
        assert done.returncode == 0, done.stderr
        (shown,) = json.loads(done.stdout)["pipelines"]
        assert shown["sensor_running"] and shown["running_workers"] is not None, shown
        assert sum(shown["decisions"].values()) > 0, shown
        registry = CollectorRegistry()
        registry.register(PipelineCollector(lambda: DagsterInstance.from_config(str(home))))
        scraped = generate_latest(registry).decode()
        assert (
            'kale_sensor_running{pipeline="demo"} 1.0' in scraped
            and 'kale_decisions_total{outcome="keep",pipeline="demo"}' in scraped
        )
        assert not instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.FAILURE])), (
            "a run failed during the demo"
        )

        assert demo["proc"].poll() is None, "the demo's day ended before its UI was checked"
        graph = _page(f"http://127.0.0.1:{port}/locations/{LOCATION}/asset-groups/demo", "asset_graph.png")
        for asset in ("stream_metrics", "traffic_forecast", "throughput_model", "gpu_allocation", "policy_backtest"):
            assert asset in graph, f"{asset} not on the asset graph page"
        _page(f"http://127.0.0.1:{port}/assets/demo/gpu_allocation", "gpu_allocation.png")
        _page(f"http://127.0.0.1:{port}/assets/demo/traffic_forecast", "traffic_forecast.png")
        automation = _page(f"http://127.0.0.1:{port}/overview/automation", "automation.png")
        assert "demo_stream_metrics" in automation and "demo_run_failure" in automation
        run_list = _page(f"http://127.0.0.1:{port}/runs", "runs.png")
        assert "demo_rescale" in run_list and "demo_refit" in run_list
        assert (ARTIFACTS / "asset_graph.png").stat().st_size > 10_000
    finally:
        instance.dispose()


def test_demo_shows_dagsters_decisions_and_stops_cleanly_on_ctrl_c(demo):
    proc = demo["proc"]
    wait_for(lambda: (demo["home"] / "kale" / "demo.json").is_file(), 240, "the demo to start")
    # A status line that shows a decision Dagster recorded ("none yet" until the first).
    wait_for(
        lambda: re.search(r"Dagster decided: \d", demo["out"].read_text()), 180, "Dagster's first decision", poll_s=0.5
    )
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends
    proc.wait(timeout=120)
    out = demo["out"].read_text()
    assert proc.returncode == 0, out[-3000:]
    assert "EMULATING one GPU" in out and "time scale 144x" in out
    assert "Dagster decided:" in out and "lag" in out and "training" in out
    summary = json.loads(out.split("summary: ", 1)[1].splitlines()[0].replace("'", '"'))
    assert summary["decisions"] > 0 and summary["failed_runs"] == 0
