"""Extension points: a policy added in one file plus one registry line reaches every caller; layering holds.

The toy policy below is the whole of what a new policy takes: its class and
spec (its own file, in a real addition) and one ``register`` call (the
line in ``kale_dagster/policies/__init__.py``).  Nothing else is touched,
and the pipeline, the backtest, the CLI and the Dagster decision all take it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from kale_dagster import KafkaSource, KaleConfigError, OnlineTrainingPipeline
from kale_dagster.model.limits import Limits
from kale_dagster.model.types import Decision, Observation, PartitionOffsets
from kale_dagster.policies import POLICIES, PolicySpec
from kale_dagster.sim.trace import synth_trace

# --- the toy policy: its "own file" ----------------------------------------------------------


@dataclass
class HalfMaxPolicy:
    """Always half the maximum, and it counts its decisions (state that must survive)."""

    workers: int
    name: str = "toy"
    sync_period_s: float = 60.0
    decisions: int = 0

    def decide(self, obs: Observation) -> Decision:
        self.decisions += 1
        return Decision(self.workers, self.name, f"half of the maximum (decision {self.decisions})")

    def state(self) -> dict:
        return {"decisions": self.decisions}

    def load_state(self, state: dict) -> None:
        self.decisions = int(state.get("decisions", 0))


TOY = PolicySpec(
    name="toy",
    description="half the maximum, always",
    build=lambda sizing, workers=None: HalfMaxPolicy(workers or max(sizing.limits.max_workers // 2, 1)),
    sweep=lambda sizing: [({"workers": w}, {"workers": w}) for w in (1, 2)],
)


@pytest.fixture
def toy():
    POLICIES.register(TOY)  # the "one registry line"
    yield TOY
    POLICIES.unregister("toy")


# --- every caller takes it ---------------------------------------------------------------------


def _history(days=3, step_s=600):
    trace = synth_trace(days=days, seed=3, step_s=step_s, peak_rate=800)
    return pd.DataFrame({"timestamp": pd.to_datetime(trace["timestamp"], utc=True), "rate": trace["value"] / step_s})


def test_pipeline_accepts_registered_policies_only(toy):
    source = KafkaSource("127.0.0.1:9092", ("t",), "g")
    assert OnlineTrainingPipeline(name="p", source=source, policy="toy").policy == "toy"
    POLICIES.unregister("toy")
    with pytest.raises(
        KaleConfigError, match="unknown 'toy'; choose one of kale, kale_stabilizer, hpa, keda, static"
    ) as err:
        OnlineTrainingPipeline(name="p", source=source, policy="toy")
    assert err.value.field == "policy"
    POLICIES.register(TOY)


def test_backtest_runs_and_sweeps_a_registered_policy(toy):
    from kale_dagster.sim.backtest import Backtest, BacktestSettings
    from kale_dagster.sim.comparison import compare

    bt = Backtest(_history(days=1), BacktestSettings(peak_workers=8, limits=Limits(max_workers=8)))
    result = bt.run("toy")
    assert set(result.timeline["workers"]) == {4} and result.metrics.rescales == 0
    report = compare(bt, ["static", "toy"])
    assert [row["setting"] for row in report["sweeps"]["toy"]] == [
        {"workers": 1},
        {"workers": 2},
    ]  # the toy's two settings ran
    assert report["sweeps"]["toy"][0]["gpu_hours"] < report["sweeps"]["toy"][1]["gpu_hours"]


def test_cli_lists_and_runs_a_registered_policy(toy, tmp_path, capsys):
    from kale_dagster.cli import COMMANDS, build_parser, main

    csv = tmp_path / "trace.csv"
    frame = _history(days=1)
    pd.DataFrame({"timestamp": frame["timestamp"], "value": frame["rate"] * 600}).to_csv(csv, index=False)
    help_text = build_parser(COMMANDS)._subparsers._group_actions[0].choices["backtest"].format_help()
    assert "kale,hpa,keda,static,toy" in help_text.replace("\n", "").replace(" ", "")
    assert (
        main(
            [
                "backtest",
                "--trace",
                str(csv),
                "--policies",
                "toy,static",
                "--max-workers",
                "8",
                "--peak-workers",
                "8",
                "--json",
                "--no-sweeps",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert set(report["policies"]) == {"toy", "static"} and report["policies"]["toy"]["gpu_hours"] == pytest.approx(
        4 * 24
    )


@pytest.mark.integration
def test_dagster_decision_uses_a_registered_policy_and_keeps_its_state(toy, tmp_path):
    from dagster import instance_for_test

    from kale_dagster import LocalLauncherConfig, build_definitions
    from kale_dagster.launchers.service import LauncherService
    from test_local_service import RecordingLauncher

    service = LauncherService(RecordingLauncher(workers=3), port=0).start()
    p = OnlineTrainingPipeline(
        name="p",
        source=KafkaSource("127.0.0.1:9092", ("t",), "g"),
        policy="toy",
        limits=Limits(max_workers=6),
        forecaster="ewma",
        history_url=f"sqlite:///{tmp_path / 'm.db'}",
        launcher=LocalLauncherConfig(service.url),
    )
    history = p.history()
    now = time.time()
    for i, rate in enumerate(np.full(30, 200.0)):
        history.append_stream(
            "p",
            now - (29 - i) * 60,
            {"arrival_rate": rate, "consumption_rate": rate, "sample_lag": 0, "time_lag_s": 1.0, "partitions": 4},
        )
    history.dispose()
    defs = build_definitions(p)
    try:
        with instance_for_test() as instance:
            for decision in (1, 2):
                result = defs.resolve_job_def("p_decide").execute_in_process(instance=instance)
                meta = result.asset_materializations_for_node("p__gpu_allocation")[0].metadata
                assert meta["workers"].value == 3 and meta["policy"].value == "toy"
                assert (
                    meta["reason"].value == f"half of the maximum (decision {decision})"
                )  # state restored from the last decision
    finally:
        service.close()


# --- layering --------------------------------------------------------------------------------


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    return set(out.split())


def test_decision_logic_imports_no_dagster_kafka_or_torch():
    loaded = _modules_after(
        "import kale_dagster.model.types, kale_dagster.policies, kale_dagster.forecast, kale_dagster.sim.backtest"
    )
    assert not {"dagster", "kafka", "torch"} & loaded


def test_worker_imports_no_pandas_scipy_dagster_or_planner():
    loaded = _modules_after("import kale_dagster.trainer.worker")
    assert "torch" in loaded
    assert not {"pandas", "scipy", "dagster", "kale_dagster.policies", "kale_dagster.model.throughput"} & loaded


def test_the_sensor_depends_on_the_control_seam_not_on_the_dagster_wiring():
    loaded = _modules_after("import kale_dagster.sensors.stream_metrics")
    assert "kale_dagster.control.tick" in loaded
    assert not {m for m in loaded if m.startswith("kale_dagster.definitions")}


def test_the_public_api_lists_every_lazy_export():
    import kale_dagster

    assert set(kale_dagster.__all__) == {"InputDataError", "KaleConfigError", *kale_dagster._EXPORTS}
    assert all(getattr(kale_dagster, name) is not None for name in kale_dagster.__all__)


@pytest.mark.parametrize("old, new", [("ScaleTargetConfig", "ScaleTargetLauncherConfig"),
                                      ("CommandHookConfig", "CommandHookLauncherConfig"),
                                      ("ObservedGroupConfig", "ObservedGroupLauncherConfig")])  # fmt: skip
def test_every_launcher_config_is_named_alike_and_the_old_names_still_import_with_a_warning(old, new):
    import kale_dagster
    import kale_dagster.launchers as launchers
    from kale_dagster.launchers.base import LauncherConfig

    configs = [n for n in kale_dagster.__all__ if isinstance(getattr(kale_dagster, n), type)
               and issubclass(getattr(kale_dagster, n), LauncherConfig)]  # fmt: skip
    assert len(configs) == 5 and all(n.endswith("LauncherConfig") for n in configs), configs
    for where in (kale_dagster, launchers):
        with pytest.warns(DeprecationWarning, match=f"{old} is deprecated and will be removed in 0.3: use {new}"):
            assert getattr(where, old) is getattr(kale_dagster, new)


@pytest.mark.parametrize(
    "names, option, chosen, problem",
    [
        ("kale", "--policies", ["kale"], None),
        (" hpa , kale,, ", "--policies", ["hpa", "kale"], None),  # spaces and empty items are no names
        ("kale,kael,hap", "--policies", None, "--policies: unknown kael, hap; choose from kale, kale_stabilizer"),
        (" , ", "--only", None, "--only: unknown (empty); choose from kale, kale_stabilizer"),
    ],
)
def test_a_list_of_policy_names_is_checked_naming_the_option(names, option, chosen, problem):
    if problem is None:
        assert POLICIES.parse(names, option) == chosen
        return
    with pytest.raises(KaleConfigError) as err:
        POLICIES.parse(names, option)
    assert str(err.value).startswith(problem), str(err.value)


def test_a_name_is_registered_once_and_unregistered_by_name():
    from kale_dagster.policies import PolicyRegistry, static

    registry = PolicyRegistry(static.SPEC)
    assert list(registry) == ["static"] and len(registry) == 1 and "static" in registry
    with pytest.raises(KaleConfigError, match="policy: a policy named 'static' is already registered"):
        registry.register(static.SPEC)
    registry.unregister("static")
    registry.unregister("static")  # gone already: nothing to do
    assert list(registry) == [] and "static" not in registry


@pytest.mark.parametrize("workers, ok", [(0, True), (3, True), (-1, False)])
def test_a_static_allocation_is_what_it_says(workers, ok):
    from kale_dagster.policies import StaticPolicy

    if not ok:
        with pytest.raises(KaleConfigError, match="workers: must be >= 0, got -1"):
            StaticPolicy(workers)
        return
    decision = StaticPolicy(workers).decide(Observation(0.0, 1, 100.0, 100.0, 0.0, 0.0, 0.5))
    assert (decision.workers, decision.policy, decision.reason) == (
        workers,
        "static",
        f"fixed allocation of {workers} workers",
    )


def _readings(n: int = 40) -> list[Observation]:
    """A day's shape in ``n`` minutes, a burst in it, per-partition offsets for KEDA; the workers change at every
    reading (the receding planner's plan is a cache kept while they hold, not state: rebuilt, it plans again)."""
    rng = np.random.default_rng(7)
    out, end, committed = [], np.zeros(4, int), np.zeros(4, int)
    for i in range(n):
        rate = 2000.0 * (1 + np.sin(i / 6)) + (9000.0 if i in (15, 16) else 0.0)
        end += rng.poisson(rate * 15, 4)
        committed = np.minimum(end, committed + rng.poisson(1500 * 15, 4))
        backlog = float((end - committed).sum())
        parts = tuple(PartitionOffsets(p, int(end[p]), int(committed[p])) for p in range(4))
        out.append(
            Observation(
                time=60.0 * i,
                workers=2 + i % 3,
                arrival_rate=rate,
                consumption_rate=1500.0,
                backlog=backlog,
                time_lag_s=backlog / max(rate, 1.0),
                utilization=min(rate / 3000.0, 1.5),
                partitions=parts,
                latest_arrival_rate=rate,
            )
        )
    return out


#: An HPA with a behavior keeps scale events (the legacy path keeps none): rate limits that span readings.
BEHAVIOR = {
    "scaleUp": {"policies": [{"type": "Pods", "value": 2, "periodSeconds": 300}]},
    "scaleDown": {"stabilizationWindowSeconds": 300, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]},
}


@pytest.mark.parametrize(
    "name, options",
    [(name, {"behavior": BEHAVIOR} if name in ("hpa", "keda") else {}) for name in POLICIES],
    ids=list(POLICIES),
)
def test_a_policy_restored_from_its_state_decides_as_the_one_that_kept_running(name, options):
    """The controller rebuilds a policy in another process (a sensor tick) from ``state()``: after every reading,
    the rebuilt one must decide the next as the one that kept running, and keep the same state."""
    from kale_dagster.model.throughput import ThroughputModel
    from kale_dagster.policies import Sizing

    sizing = Sizing(Limits(max_workers=16), ThroughputModel.linear(1000.0), partitions=4)
    running = POLICIES.build(name, sizing, **options)
    readings = _readings()
    running.decide(readings[0])
    for after in readings[1:]:
        rebuilt = POLICIES.build(name, sizing, **options)
        rebuilt.load_state(json.loads(json.dumps(running.state())))  # as the cursor keeps it
        assert rebuilt.state() == running.state()
        ours, theirs = running.decide(after), rebuilt.decide(after)
        assert (theirs.workers, theirs.reason) == (ours.workers, ours.reason), after.time
