"""Browser test: headless Chromium against a running `dagster dev` with the demo's code location.

The demo pipeline runs against the embedded broker; its trainer is the
local trainer service wrapping a recording launcher (the real workers are
exercised in test_trainer.py).  The plan job is launched through GraphQL,
the allocation sensor (a real daemon tick) requests the rescale run, and
the UI pages are rendered by Chromium: the asset graph shows the Kale
assets, the sensors are running, the rescale run succeeded.  Screenshots
land in artifacts/ui/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from test_local_service import RecordingLauncher

from kale_dagster.demo.run import write_dagster_yaml
from kale_dagster.launchers.service import LauncherService
from kale_dagster.processes import stop_process_group
from kale_dagster.sim.trace import synth_trace
from kale_dagster.stream.broker import free_loopback_port
from kale_dagster.stream.history import MetricsHistory
from kale_dagster.stream.producer import ensure_topic

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts" / "ui"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LOCATION, REPOSITORY = "kale_dagster.demo.definitions", "__repository__"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (bash .ci/install installs it)"),
]


def _graphql(port: int, query: str, variables: dict | None = None) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["data"]


def _runs(port: int, job: str) -> list[dict]:
    data = _graphql(port, """query($f: RunsFilter) { runsOrError(filter: $f) { ... on Runs { results { runId status tags { key value } } } } }""",
                    {"f": {"pipelineName": job}})
    return data["runsOrError"]["results"]


def _chromium(url: str, *args: str) -> str:
    profile = tempfile.mkdtemp(prefix="kale-chromium-")
    try:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=20000",
             "--window-size=1600,1000", *args, url],
            capture_output=True, text=True, timeout=120,
        )
        return proc.stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def _page(url: str, shot: str) -> str:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _chromium(url, f"--screenshot={ARTIFACTS / shot}")
    return _chromium(url, "--dump-dom")


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_dagster_ui_shows_kale_and_a_sensor_triggered_rescale(kafka_broker, tmp_path):
    home = tmp_path / "dagster-home"
    (home / "kale").mkdir(parents=True)
    write_dagster_yaml(home)
    ensure_topic(kafka_broker.bootstrap_servers, "samples", 4)
    # Three days of recorded arrivals, as the metrics sensor would have written them.
    history = MetricsHistory(f"sqlite:///{home / 'kale' / 'metrics.db'}")
    trace = synth_trace(days=3, seed=5, step_s=300, peak_rate=600)
    now = time.time()
    for i, value in enumerate(trace.value):
        history.append_stream("demo", now - (len(trace) - 1 - i) * 300, {"arrival_rate": value / 300, "sample_lag": 0, "time_lag_s": 20.0}, workers=1)
    history.dispose()

    launcher = RecordingLauncher(workers=1)
    service = LauncherService(launcher, port=0).start()
    port = free_loopback_port()
    env = dict(os.environ, DAGSTER_HOME=str(home), KALE_DEMO_BOOTSTRAP=kafka_broker.bootstrap_servers, KALE_DEMO_TRAINER_URL=service.url)
    log = open(tmp_path / "dagster-dev.log", "wb")
    dagster = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-m", LOCATION, "-h", "127.0.0.1", "-p", str(port)],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        _wait(lambda: _ok(f"http://127.0.0.1:{port}/server_info"), 180, "dagster dev to answer")
        launched = _graphql(port, """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) { __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
                            {"p": {"selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "jobName": "demo_plan"}}})
        assert launched["launchRun"]["__typename"] == "LaunchRunSuccess", launched
        _wait(lambda: any(r["status"] == "SUCCESS" for r in _runs(port, "demo_plan")), 240, "the plan run to succeed")
        # The allocation sensor ticks on the daemon and requests the rescale run.
        rescale = _wait(lambda: [r for r in _runs(port, "demo_rescale") if r["status"] == "SUCCESS"], 240, "a sensor-triggered rescale run to succeed")
        tags = {t["key"]: t["value"] for t in rescale[0]["tags"]}
        assert tags.get("dagster/sensor_name") == "demo_allocation_changed"
        assert launcher.workers == int(tags["kale/target_workers"])

        graph = _page(f"http://127.0.0.1:{port}/locations/{LOCATION}/asset-groups/demo", "asset_graph.png")
        for asset in ("stream_metrics", "traffic_forecast", "throughput_model", "gpu_allocation", "policy_backtest"):
            assert asset in graph, f"{asset} not on the asset graph page"
        automation = _page(f"http://127.0.0.1:{port}/overview/automation", "automation.png")
        for sensor in ("demo_stream_metrics", "demo_allocation_changed"):
            assert sensor in automation
        sensor_page = _page(f"http://127.0.0.1:{port}/locations/{LOCATION}/sensors/demo_allocation_changed", "sensor.png")
        assert "Running" in sensor_page
        runs = _page(f"http://127.0.0.1:{port}/runs", "runs.png")
        assert "demo_rescale" in runs and "demo_plan" in runs
        assert (ARTIFACTS / "asset_graph.png").stat().st_size > 10_000
    finally:
        stop_process_group(dagster, 30)
        service.close()


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False
