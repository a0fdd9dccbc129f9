"""Declarative pipelines: definitions, and the forecast/allocation assets and checks in a real Dagster instance."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from dagster import instance_for_test

from kale_dagster import KafkaSource, KaleConfigError, OnlineTrainingPipeline, ThroughputModel, build_definitions
from kale_dagster.model.limits import Limits
from kale_dagster.sim.trace import synth_trace

pytestmark = pytest.mark.integration


def _pipeline(name, servers="127.0.0.1:9092", history_url=None, **kw):
    return OnlineTrainingPipeline(
        name=name,
        source=KafkaSource(
            bootstrap_servers=servers, topics=("samples",), group_id=f"{name}-trainer", request_timeout_ms=2000
        ),
        history_url=history_url,
        limits=Limits(max_workers=8),
        throughput_prior=ThroughputModel.linear(100.0),
        **kw,
    )


def test_several_pipelines_without_clashes():
    defs = build_definitions(_pipeline("a", advisory=False), _pipeline("b"))
    repo = defs.get_repository_def()
    assert {"a_refit", "b_refit", "a_decide", "b_decide", "a_rescale", "b_backtest", "b_savings"} <= {
        j.name for j in repo.get_all_jobs()
    }
    assert {s.name for s in repo.sensor_defs} == {
        "a_stream_metrics",
        "b_stream_metrics",
        "a_run_failure",
        "b_run_failure",
    }
    assert {s.name for s in repo.schedule_defs} == {
        f"{name}_{job}_schedule" for name in ("a", "b") for job in ("backtest", "savings")
    }
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert {"a/gpu_allocation", "b/traffic_forecast", "b/stream_metrics"} <= keys
    with pytest.raises(KaleConfigError, match="unique"):
        build_definitions(_pipeline("a"), _pipeline("a"))


def test_every_asset_has_kinds_and_the_readings_go_stale_when_they_stop():
    specs = {s.key.to_user_string(): s for s in build_definitions(_pipeline("a")).resolve_all_asset_specs()}
    assert all(spec.kinds for spec in specs.values()), {k: s.kinds for k, s in specs.items()}
    for key in ("a/stream_metrics", "a/gpu_allocation"):  # the sensor's readings, at the pipeline's interval
        policy = specs[key].freshness_policy
        assert policy is not None and policy.warn_window is not None
        assert policy.warn_window.to_timedelta().total_seconds() == 1200 + 300  # the 20-minute record, then 5 min
        assert policy.fail_window.to_timedelta().total_seconds() == 1200 + 900


@pytest.mark.parametrize(
    "kwargs, fields",
    [
        (dict(name="Bad-Name"), ["name"]),
        (dict(name="x", forecaster="oracle"), ["forecaster"]),
        (dict(name="x", metrics_interval_seconds=1), ["metrics_interval_seconds"]),
        (dict(name="x", limits={"max_workers": 4}), ["limits"]),
        (dict(name="x", launcher="local"), ["launcher"]),
        (dict(name="x", policy="hpa", policy_options={"target": 0.5}), ["policy_options"]),
        # Every bad field at once, in the declaration's order.
        (dict(name="Bad-Name", forecaster="oracle", advisory="yes"), ["name", "forecaster", "advisory"]),
    ],
)
def test_pipeline_config_errors(kwargs, fields):
    name = kwargs.pop("name")
    with pytest.raises(KaleConfigError) as err:
        OnlineTrainingPipeline(name=name, source=KafkaSource("127.0.0.1:9092", ("t",), "g"), **kwargs)
    assert [e.field for e in err.value.errors] == fields


def test_refit_and_decide_jobs_materialize_forecast_and_allocation(kafka_broker, tmp_path):
    from kale_dagster import LocalLauncherConfig
    from kale_dagster.launchers.service import LauncherService
    from test_local_service import RecordingLauncher

    service = LauncherService(RecordingLauncher(workers=2), port=0).start()
    p = _pipeline(
        "demo",
        servers=kafka_broker.bootstrap_servers,
        history_url=f"sqlite:///{tmp_path / 'm.db'}",
        launcher=LocalLauncherConfig(service.url),
    )
    history = p.history()
    # Three days of recorded arrivals (what the metrics sensor writes each minute), ending now.
    trace = synth_trace(days=3, seed=5, step_s=300, peak_rate=600)
    now = time.time()
    stamps = now - (len(trace) - 1 - np.arange(len(trace))) * 300
    for ts, value in zip(stamps, trace.value):
        history.append_stream("demo", float(ts), {"arrival_rate": value / 300, "sample_lag": 0, "time_lag_s": 0.0})
    history.append_stream(
        "demo",
        now + 1,
        {
            "arrival_rate": float(trace.value.iloc[-1] / 300),
            "consumption_rate": 150.0,
            "sample_lag": 9000,
            "time_lag_s": 60.0,
        },
    )

    defs = build_definitions(p)
    try:
        with instance_for_test() as instance:
            result = defs.resolve_job_def("demo_refit").execute_in_process(instance=instance)
            assert result.success
            fc_meta = result.asset_materializations_for_node("demo__traffic_forecast")[0].metadata
            assert fc_meta["model"].value == "prophet"
            assert fc_meta["fallback"].value == "none"
            plot = Path(fc_meta["plot"].value)
            assert plot.is_relative_to(instance.storage_directory()) and plot.read_bytes()[:4] == b"\x89PNG"
            assert fc_meta["holdout_smape"].value < 0.5
            assert fc_meta["fitted_at"].value == pytest.approx(time.time(), abs=120)
            assert history.latest_forecaster("demo") is not None  # the fit the controller re-anchors
            assert "realised_smape" not in fc_meta  # no earlier forecast to judge
            checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
            assert "held-out" in checks["forecast_beats_seasonal_naive"].metadata["note"].value
            model_meta = result.asset_materializations_for_node("demo__throughput_model")[0].metadata
            assert model_meta["source"].value == "prior" and model_meta["model"].value["form"] == "async"

            decided = defs.resolve_job_def("demo_decide").execute_in_process(instance=instance)
            assert decided.success
            alloc = decided.asset_materializations_for_node("demo__gpu_allocation")[0].metadata
            assert 1 <= alloc["workers"].value <= 8 and alloc["running_workers"].value == 2
            assert alloc["reason"].value and alloc["policy"].value.startswith("kale")
            assert alloc["forecast"].value == "prophet" and alloc["throughput_model"].value == "prior"
            decision = decided.output_for_node("demo__gpu_allocation")
            assert decision["workers"] == alloc["workers"].value and len(decision["plan"]) == 36  # 6 h of 10 min
            checks = {c.check_name: c for c in decided.get_asset_check_evaluations()}
            assert checks["lag_within_slo"].passed  # 60 s of lag, 20-minute SLO

            backtest = defs.resolve_job_def("demo_backtest").execute_in_process(instance=instance)
            assert backtest.success
            meta = backtest.asset_materializations_for_node("demo__policy_backtest")[0].metadata
            assert "| kale |" in meta["results"].value and "| hpa |" in meta["results"].value
            assert meta["days_replayed"].value == pytest.approx(3.0, abs=0.01)
            results = backtest.output_for_node("demo__policy_backtest")
            assert results["static"]["rescales"] == 0 and results["kale"]["gpu_hours"] > 0

            # Half an hour later (the same hours as a day before): the next refit judges the last forecast.
            for k in range(1, 7):
                history.append_stream(
                    "demo", now + 1 + k * 300, {"arrival_rate": float(trace.value.iloc[-288 + k] / 300)}
                )
            refit = defs.resolve_job_def("demo_refit").execute_in_process(instance=instance)
            realised = refit.asset_materializations_for_node("demo__traffic_forecast")[0].metadata
            assert realised["realised_points"].value >= 5 and 0 <= realised["realised_smape"].value < 1
            check = {c.check_name: c for c in refit.get_asset_check_evaluations()}["forecast_beats_seasonal_naive"]
            assert check.metadata["realised_points"].value == realised["realised_points"].value
            assert check.passed == (
                check.metadata["realised_smape"].value <= check.metadata["realised_baseline_smape"].value
            )
    finally:
        service.close()
        history.dispose()
