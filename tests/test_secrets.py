"""The Kafka password is read from the environment where it is used, and written nowhere.

A pipeline declared with a SASL password from an environment variable runs its metrics sensor, its
refit, decide and rescale jobs (the refit fails: the embedded broker does not speak SASL, so no
history exists), a failing rescale run, a local worker that fails to connect, and renders its
Kubernetes manifests; then every file the Dagster instance, the metrics history and the worker wrote
is searched byte by byte for the password.
"""

from __future__ import annotations

import logging
import secrets

import pytest
import yaml
from dagster import AssetKey, AssetMaterialization, build_sensor_context, instance_for_test

from kale_dagster import KafkaSource, LocalLauncherConfig, OnlineTrainingPipeline, ThroughputModel, build_definitions
from kale_dagster.errors import KaleConfigError
from kale_dagster.launchers import LocalLauncher, TrainerSettings
from kale_dagster.launchers.kubernetes import KubernetesLauncherConfig, render
from kale_dagster.launchers.service import LauncherService
from kale_dagster.model.limits import Limits
from test_local_service import RecordingLauncher

pytestmark = pytest.mark.integration
ENV = "KALE_TEST_KAFKA_PASSWORD"


def test_the_kafka_password_is_found_nowhere(kafka_broker, tmp_path, monkeypatch, caplog):
    secret = "kale-secret-" + secrets.token_hex(12)
    monkeypatch.setenv(ENV, secret)
    caplog.set_level(logging.DEBUG)  # kafka-python logs its clients' whole configuration at DEBUG
    source = KafkaSource(
        kafka_broker.bootstrap_servers,
        ("samples",),
        "sec-trainer",
        request_timeout_ms=2000,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="trainer",
        sasl_password_env=ENV,
    )
    service = LauncherService(RecordingLauncher(workers=2), port=0).start()
    p = OnlineTrainingPipeline(
        name="sec",
        source=source,
        history_url=f"sqlite:///{tmp_path / 'history.db'}",
        limits=Limits(max_workers=8),
        throughput_prior=ThroughputModel.linear(100.0),
        launcher=LocalLauncherConfig(service.url),
        advisory=False,
    )
    defs = build_definitions(p)
    repo = defs.get_repository_def()
    (tmp_path / "dagster").mkdir()
    try:
        with instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
            sensor = {s.name: s for s in repo.sensor_defs}["sec_stream_metrics"]
            tick = sensor(build_sensor_context(instance=instance))
            assert "could not read the stream" in getattr(tick, "skip_message", "")  # SASL to a broker without it
            refit = defs.resolve_job_def("sec_refit").execute_in_process(instance=instance, raise_on_error=False)
            assert not refit.success  # nothing recorded to fit on: a failing run, its error in the event log
            defs.resolve_job_def("sec_decide").execute_in_process(instance=instance, raise_on_error=False)
            instance.report_runless_asset_event(
                AssetMaterialization(AssetKey(["sec", "gpu_allocation"]), metadata={"workers": 3, "reason": "test"})
            )
            assert defs.resolve_job_def("sec_rescale").execute_in_process(instance=instance).success
            assert service.launcher.workers == 3
    finally:
        service.close()
    # A worker gets the password in its environment (it must log in) and fails to connect: its log must not show it.
    launcher = LocalLauncher(TrainerSettings(source, str(tmp_path / "ckpt")), pool_size=1, ready_timeout_s=120)
    with pytest.raises((RuntimeError, TimeoutError)):
        launcher.start(1)
    launcher.stop()
    rendered = yaml.safe_dump_all(
        render(
            "sec",
            KubernetesLauncherConfig(image="trainer:1", checkpoint_pvc="ckpt", kafka_secret="sec-kafka"),
            source,
            2,
        )
    )
    assert secret not in rendered and "secretRef" in rendered
    (tmp_path / "probe").write_text(f"a control the search must find: {secret}")
    searched = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert any(path.suffix == ".log" for path in searched) and any("history" in path.name for path in searched)
    assert any(
        path.suffix == ".db" and "dagster" in path.parts for path in searched
    )  # the instance's runs and event log
    leaks = [path.name for path in searched if secret.encode() in path.read_bytes()]
    assert leaks == ["probe"], f"the password was written to {leaks}"
    assert not [r.name for r in caplog.records if secret in r.getMessage()]  # no log line at DEBUG holds it


def test_kafka_clients_log_their_configuration_without_the_password(monkeypatch, caplog):
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    from kale_dagster.definitions.resources import KafkaStreamResource
    from kale_dagster.stream.broker import free_loopback_port

    secret = "kale-secret-" + secrets.token_hex(12)
    monkeypatch.setenv(ENV, secret)
    caplog.set_level(logging.DEBUG)
    source = KafkaSource(
        f"127.0.0.1:{free_loopback_port()}",
        ("s",),
        "g",
        request_timeout_ms=500,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password_env=ENV,
    )
    with pytest.raises(KafkaError):  # nobody listens: the client logs its configuration, then gives up
        KafkaAdminClient(**KafkaStreamResource.from_source(source).client_config())
    logged = [r.getMessage() for r in caplog.records]
    assert any("sasl_plain_password" in line for line in logged)  # the configuration was logged...
    assert not [line for line in logged if secret in line]  # ...without the password


def test_the_password_is_read_the_same_way_inside_and_outside_dagster_runs(monkeypatch):
    """Outside a run (``kale history backfill``) the resource still holds the EnvVar: its value is sent, never
    the variable's name."""
    from kale_dagster.definitions.resources import KafkaStreamResource

    secret = "kale-secret-" + secrets.token_hex(12)
    monkeypatch.setenv(ENV, secret)
    source = KafkaSource(
        "127.0.0.1:9092",
        ("s",),
        "g",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password_env=ENV,
    )
    config = KafkaStreamResource.from_source(source).client_config()
    assert config["sasl_plain_password"] == secret and secret not in repr(config)
    monkeypatch.delenv(ENV)
    with pytest.raises(KaleConfigError, match=f"sasl_password_env: environment variable {ENV} is not set"):
        KafkaStreamResource.from_source(source).client_config()


def test_a_secret_pasted_where_a_name_belongs_is_refused_without_echoing_it():
    """Property-based: a password in sasl_password_env (anything that is not a variable's name), or credentials
    in the bootstrap string, fail naming the field, and the error never repeats them."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=200, deadline=None)
    @given(st.text(max_size=40).map(lambda t: "pw!" + t))  # "!" is in no variable's name, nor in any message
    def pasted(value):
        with pytest.raises(KaleConfigError) as err:
            KafkaSource("127.0.0.1:9092", ("s",), "g", sasl_password_env=value)
        assert err.value.field == "sasl_password_env" and value not in str(err.value)

    pasted()
    secret = "s3cr3t-" + secrets.token_hex(6)
    for servers in (f"bob:{secret}@kafka:9092", f"sasl_ssl://bob:{secret}@kafka:9092"):
        with pytest.raises(KaleConfigError) as err:
            KafkaSource(servers, ("s",), "g")
        assert err.value.field == "bootstrap_servers" and secret not in str(err.value)
