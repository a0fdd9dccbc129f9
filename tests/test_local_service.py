"""The local trainer service: HTTP control of a launcher, and the Dagster rescale job driving it."""

from __future__ import annotations

import threading
import time

import pytest
from dagster import AssetKey, AssetMaterialization, instance_for_test

from kale_dagster import KaleConfigError, build_definitions
from kale_dagster.launchers import RescaleRecord
from kale_dagster.launchers.base import LauncherStatus
from kale_dagster.launchers.service import LauncherService, LocalTrainerClient
from support import local_trainer_pipeline, wait_for


class RecordingLauncher:
    """Stands in for LocalLauncher (whose processes test_trainer.py exercises) behind the real HTTP service."""

    def __init__(self, workers=2, delay=0.0):
        self.workers, self.delay, self.records = workers, delay, []

    def rescale(self, m, reason="rescale"):
        if m == self.workers:
            return None
        time.sleep(self.delay)
        record = RescaleRecord(
            time=time.time(), from_workers=self.workers, to_workers=m, downtime_s=self.delay, reason=reason
        )
        self.workers = m
        self.records.append(record)
        return record

    def status(self):
        return LauncherStatus(workers=self.workers, downtimes_s=tuple(r.downtime_s for r in self.records))


@pytest.fixture
def service():
    svc = LauncherService(RecordingLauncher(delay=0.3), port=0).start()
    yield svc
    svc.close()


def test_client_rescales_over_http_and_is_idempotent(service):
    client = LocalTrainerClient(service.url)
    assert client.workers == 2
    record = client.rescale(4, reason="forecast")
    assert (record.from_workers, record.to_workers, record.reason) == (2, 4, "forecast")
    assert client.rescale(4) is None
    assert client.workers == 4


def test_concurrent_rescales_are_refused(service):
    client = LocalTrainerClient(service.url)
    results = []
    threads = [threading.Thread(target=lambda m=m: results.append(_try(client, m))) for m in (3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(type(r).__name__ for r in results) == ["RescaleRecord", "RuntimeError"]
    assert any("409" in str(r) for r in results)


def _try(client, m):
    try:
        return client.rescale(m)
    except RuntimeError as exc:
        return exc


def _raw(service, method="GET", path="/status", host=None, token=None, content_type="application/json", body=None):
    """One request as an outsider would send it, header by header."""
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    headers = {"Host": host or f"127.0.0.1:{service.port}"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if content_type:
        headers["Content-Type"] = content_type
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    answer = json.loads(resp.read() or b"{}")
    conn.close()
    return resp.status, answer.get("error", "")


def test_the_token_file_is_the_users_alone(service):
    import stat

    mode = stat.S_IMODE(service.token_file.stat().st_mode)
    assert mode == 0o600 and stat.S_IMODE(service.token_file.parent.stat().st_mode) == 0o700
    assert len(service.token_file.read_text()) >= 32


@pytest.mark.parametrize(
    "name, request_kwargs, status, error",
    [
        ("no token", dict(), 401, "bearer token"),
        ("wrong token", dict(token="guess"), 401, "bearer token"),
        ("rebound host name (DNS rebinding)", dict(host="attacker.example:8765", token="TOKEN"), 403, "DNS rebinding"),
        ("right token, foreign Host", dict(host="192.168.1.2", token="TOKEN"), 403, "not this service's address"),
        (
            "cross-site form post",
            dict(
                method="POST",
                path="/rescale",
                token="TOKEN",
                content_type="application/x-www-form-urlencoded",
                body="workers=9",
            ),
            415,
            "application/json",
        ),
        (
            "text/plain post (a no-preflight fetch)",
            dict(method="POST", path="/rescale", token="TOKEN", content_type="text/plain", body='{"workers": 9}'),
            415,
            "application/json",
        ),
        ("post without a token", dict(method="POST", path="/rescale", body='{"workers": 9}'), 401, "bearer token"),
        ("the token's holder is served", dict(token="TOKEN"), 200, ""),
        ("localhost names the service too", dict(host="localhost:PORT", token="TOKEN"), 200, ""),
    ],
)
def test_the_service_refuses_strangers(service, name, request_kwargs, status, error):
    token = service.token_file.read_text()
    kwargs = {
        k: (v.replace("TOKEN", token).replace("PORT", str(service.port)) if isinstance(v, str) else v)
        for k, v in request_kwargs.items()
    }
    got, message = _raw(service, **kwargs)
    assert (got, error in message) == (status, True), message
    assert service.launcher.workers == 2  # nothing refused changed the workers


def test_the_service_binds_loopback_only_and_forgets_its_token_on_close(tmp_path):
    with pytest.raises(KaleConfigError, match="loopback only"):
        LauncherService(RecordingLauncher(), port=0, host="0.0.0.0")
    svc = LauncherService(RecordingLauncher(), port=0, token_file=tmp_path / "t" / "token").start()
    client = LocalTrainerClient(svc.url, token_file=tmp_path / "t" / "token")
    assert client.workers == 2
    svc.close()
    assert not (tmp_path / "t" / "token").exists()
    with pytest.raises(RuntimeError, match="no token at"):
        _ = client.workers


def test_unreachable_service_and_non_loopback_urls_are_clear_errors():
    from kale_dagster.stream.broker import free_loopback_port

    with pytest.raises(RuntimeError, match="no trainer service"):
        LocalTrainerClient(f"http://127.0.0.1:{free_loopback_port()}").rescale(2)
    with pytest.raises(KaleConfigError, match="loopback"):
        LocalTrainerClient("http://10.0.0.5:8765")


@pytest.mark.integration
def test_rescale_job_drives_the_local_trainer(service, tmp_path):
    p = local_trainer_pipeline(tmp_path, service.url)
    defs = build_definitions(p)
    with instance_for_test() as instance:
        instance.report_runless_asset_event(
            AssetMaterialization(AssetKey(["demo", "gpu_allocation"]), metadata={"workers": 3, "reason": "r"})
        )
        assert defs.resolve_job_def("demo_rescale").execute_in_process(instance=instance).success
        assert service.launcher.workers == 3
        obs = instance.fetch_observations(AssetKey(["demo", "gpu_allocation"]), limit=1).records[0].asset_observation
        assert obs.metadata["from_workers"].value == 2 and obs.metadata["downtime_s"].value == pytest.approx(
            0.3, abs=0.05
        )
        service.close()  # trainer gone: the run fails and says why
        result = defs.resolve_job_def("demo_rescale").execute_in_process(instance=instance, raise_on_error=False)
        assert not result.success


@pytest.mark.integration
def test_failed_rescale_is_recorded_on_the_allocation(tmp_path):
    from dagster import DagsterEventType, build_run_status_sensor_context

    p = local_trainer_pipeline(tmp_path, "http://127.0.0.1:9")
    defs = build_definitions(p)
    sensor = {s.name: s for s in defs.get_repository_def().sensor_defs}["demo_run_failure"]
    key = AssetKey(["demo", "gpu_allocation"])
    with instance_for_test() as instance:
        instance.report_runless_asset_event(AssetMaterialization(key, metadata={"workers": 3}))
        result = defs.resolve_job_def("demo_rescale").execute_in_process(instance=instance, raise_on_error=False)
        assert not result.success  # nothing listens on port 9
        failure = next(e for e in result.all_events if e.event_type == DagsterEventType.RUN_FAILURE)
        ctx = build_run_status_sensor_context(
            sensor_name="demo_run_failure",
            dagster_instance=instance,
            dagster_run=result.dagster_run,
            dagster_event=failure,
        ).for_run_failure()
        sensor(ctx)
        obs = instance.fetch_observations(key, limit=1).records[0].asset_observation
        assert obs.metadata["failed_job"].value == "demo_rescale"


@pytest.mark.integration
@pytest.mark.slow
def test_trainer_serve_rescales_real_workers_and_reports_their_throughput(kafka_broker, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    import pandas as pd

    from kale_dagster.stream.broker import free_loopback_port
    from kale_dagster.stream.producer import ReplaySettings, ensure_topic, replay_in_background

    servers = kafka_broker.bootstrap_servers
    ensure_topic(servers, "s", 2)
    # More than two workers capped at 100 samples/s can take: they stay busy throughout.
    stop = threading.Event()
    producer = replay_in_background(
        servers,
        pd.DataFrame({"timestamp": pd.date_range("2026-01-01", periods=2, freq="1min", tz="UTC"), "rate": 300.0}),
        ReplaySettings(topic="s", partitions=2),
        stop,
        max_wall_s=120,
    )
    port = free_loopback_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kale_dagster.cli",
            "trainer",
            "serve",
            "--bootstrap-servers",
            servers,
            "--topic",
            "s",
            "--group-id",
            "g",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--workers",
            "1",
            "--emulate-gpu-rate",
            "100",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        client = LocalTrainerClient(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if client.workers == 1:
                    break
            except RuntimeError:
                time.sleep(0.5)
        record = client.rescale(2, reason="test")
        assert record.to_workers == 2 and record.downtime_s < 30
        time.sleep(6)  # two metrics windows
        status = client.status()
        assert (status.workers, status.reported, status.rescaling, status.emulated) == (2, 2, False, True)
        assert 0 < status.samples_per_s <= 2 * 100 * 1.05 and 0 < status.busy_share <= 1  # capped at the EMULATED rate
        assert status.saturated is True  # arrivals above capacity: no step waited for data
        assert status.downtimes_s[-1] == pytest.approx(record.downtime_s)
        stop.set()  # arrivals end: once the backlog is trained, the workers wait and their rate is no capacity
        assert wait_for(lambda: client.status().saturated is False, 60, "the drained group to report it waited")
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        stop.set()
        producer.join()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-2000:]


@pytest.mark.integration
def test_trainer_serve_on_a_missing_topic_exits_with_the_workers_reason(kafka_broker, tmp_path):
    import subprocess
    import sys

    from kale_dagster.stream.broker import free_loopback_port

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kale_dagster.cli",
            "trainer",
            "serve",
            "--bootstrap-servers",
            kafka_broker.bootstrap_servers,
            "--topic",
            "nowhere",
            "--group-id",
            "g",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--port",
            str(free_loopback_port()),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(
        "kale trainer: error: could not start 1 workers: worker exited with code 1 before 'started': "
    )
    assert "topic 'nowhere' has no partitions" in lines[0] and "(log: " in lines[0]


def test_any_body_gets_an_answer_and_only_a_valid_one_acts(service):
    """Property-based: whatever JSON (or not) the holder of the token posts, the service answers 200 or 400,
    never fails, and changes the workers only for a whole number of workers in range."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    token = service.token_file.read_text()
    values = st.one_of(
        st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(allow_nan=True), st.text(max_size=20)
    )
    bodies = st.one_of(
        st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
        st.dictionaries(st.sampled_from(["workers", "reason", "x"]), values, max_size=3).map(__import__("json").dumps),
        values.map(__import__("json").dumps),
    )

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(bodies)
    def check(body):
        before = service.launcher.workers
        status, error = _raw(
            service, method="POST", path="/rescale", token=token, body=body.encode("utf-8", "surrogatepass")
        )
        assert status in (200, 400), (status, error, body)
        if status == 400:
            assert service.launcher.workers == before and error
        else:
            assert 0 <= service.launcher.workers <= 1024  # 0: stopped (min_workers: 0)

    check()
