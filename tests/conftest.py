"""Shared fixtures: a real embedded broker per test, a guard against leaked processes, the fault table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kale_dagster.model.limits import Limits
from kale_dagster.stream.broker import embedded_broker, free_loopback_port
from support import S3_BUCKET, StandInWorkers, descendants, wait_for

FIXTURES = Path(__file__).parent / "fixtures"

# A suite started as a background job inherits SIGINT ignored. Dagster maps SIGTERM to SIGINT's handler whenever it
# sets that handler, so SIGTERM would be ignored too, and so would it be in every process started afterwards: the
# tail that mirrors a run's logs then outlives its SIGTERM, and the run waits Dagster's 30 s for it to exit.
for _sig, _default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
    if signal.getsignal(_sig) is signal.SIG_IGN:
        signal.signal(_sig, _default)


@pytest.fixture(scope="session", autouse=True)
def no_leaked_processes():
    """Fail the run if any test left a child process (broker, worker, dagster) behind."""
    before = descendants(os.getpid())
    yield
    leaked = descendants(os.getpid()) - before
    details = []
    for pid in sorted(leaked):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            details.append(f"{pid}: {cmdline[:200]}")
        except OSError:
            pass
    assert not details, "processes left behind by the test suite:\n" + "\n".join(details)


@pytest.fixture
def kafka_broker():
    """A fresh, empty Tansu broker on a free loopback port, stopped after the test."""
    with embedded_broker() as broker:
        yield broker


@pytest.fixture
def controlled(kafka_broker, tmp_path, request):
    """A pipeline on the embedded broker, an HPA with a 300-second (10 s wall) scale-down window, 30x pipeline
    time, its workers stand-ins behind the real trainer service; tick its metrics sensor with
    ``support.sensor_tick``.  Parametrized indirectly, a dict replaces pipeline fields (another policy)."""
    from dagster import instance_for_test

    from kale_dagster import (
        KafkaSource,
        LocalLauncherConfig,
        OnlineTrainingPipeline,
        ThroughputModel,
        build_definitions,
    )
    from kale_dagster.control.clock import PipelineClock
    from kale_dagster.launchers.service import LauncherService
    from kale_dagster.stream.producer import ensure_topic

    ensure_topic(kafka_broker.bootstrap_servers, "events", 2)
    workers = StandInWorkers()
    service = LauncherService(workers, port=0).start()
    p = OnlineTrainingPipeline(
        name="ctl",
        source=KafkaSource(kafka_broker.bootstrap_servers, ("events",), "ctl-trainer", request_timeout_ms=3000),
        limits=Limits(min_workers=1, max_workers=8),
        policy="hpa",
        throughput_prior=ThroughputModel.linear(100.0),
        policy_options={
            "behavior": {
                "scaleDown": {
                    "stabilizationWindowSeconds": 300,
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
                }
            }
        },
        clock=PipelineClock(30.0, wall_start=time.time()),
        record_every_minutes=0,  # every decision an event: the tests read each one
        launcher=LocalLauncherConfig(service.url),
        advisory=False,
        history_url=f"sqlite:///{tmp_path / 'm.db'}",
    )
    p = replace(p, **getattr(request, "param", {}))
    defs = build_definitions(p)
    with instance_for_test() as instance:
        yield {
            "p": p,
            "defs": defs,
            "instance": instance,
            "workers": workers,
            "service": service,
            "servers": kafka_broker.bootstrap_servers,
        }
    service.close()


FAULT_ROWS = pytest.StashKey[list]()
FAULT_COLUMNS = ("fault", "injected", "survived", "produced", "trained", "lost", "duplicated", "recovery_s")


@pytest.fixture
def s3_server():
    """moto's S3 server on a loopback port with the bucket ``S3_BUCKET``: the process, its endpoint and a boto3 client
    (keys ``test``/``test``)."""
    import boto3

    port = free_loopback_port()
    server = subprocess.Popen(
        ["moto_server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    )

    def up() -> bool:
        try:
            client.list_buckets()
            return True
        except Exception:
            return False

    try:
        wait_for(up, 30, "moto's S3 server", poll_s=0.1)
        client.create_bucket(Bucket=S3_BUCKET)
        yield server, endpoint, client
    finally:
        server.send_signal(signal.SIGCONT)  # a test that stopped it may have failed before it went on
        server.kill()
        server.wait()


@pytest.fixture
def fault_record(request):
    """Record one row of the fault table (tests marked ``faults``): what was injected and what it cost."""
    rows = request.config.stash.setdefault(FAULT_ROWS, [])

    def record(**row):
        unknown = set(row) - set(FAULT_COLUMNS)
        assert not unknown, f"unknown fault-table columns {unknown}"
        rows.append({column: row.get(column) for column in FAULT_COLUMNS})

    return record


def pytest_sessionfinish(session):
    """In a test process of pytest-xdist: hand its fault rows to the controller, which prints the table."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fault_rows"] = json.dumps(session.config.stash.get(FAULT_ROWS, []))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: a test process finished; keep its fault rows."""
    rows = json.loads(getattr(node, "workeroutput", {}).get("fault_rows", "[]"))
    node.config.stash.setdefault(FAULT_ROWS, []).extend(rows)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The fault table, printed and written to artifacts/faults.json (bench/faults.py reads it)."""
    rows = config.stash.get(FAULT_ROWS, [])
    if not rows:
        return
    out = Path(__file__).resolve().parents[1] / "artifacts" / "faults.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    terminalreporter.section("faults injected")
    terminalreporter.write_line(" | ".join(FAULT_COLUMNS))
    for row in rows:
        terminalreporter.write_line(" | ".join("-" if row[c] is None else str(row[c]) for c in FAULT_COLUMNS))
