"""Simulator and backtest: metric arithmetic on hand-computed cases, scaling, warm-up, CLI errors."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from kale_dagster import HPAPolicy, KaleConfigError, StaticPolicy, ThroughputModel
from kale_dagster.model.backlog import FifoBacklog
from kale_dagster.model.limits import Limits
from kale_dagster.sim.backtest import Backtest, BacktestSettings, Run, minute_rates, scale_to_peak
from kale_dagster.sim.comparison import dominating_baselines
from kale_dagster.sim.simulate import SimConfig, simulate

FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures"
LINEAR = ThroughputModel.linear(100.0)  # 100 samples/s per worker


def _times(n):
    return pd.date_range("2026-01-01", periods=n, freq="1min", tz="UTC")


def test_fifo_ages_are_exact():
    q = FifoBacklog(now=0.0)
    q.step(60, 6000, 0.0)  # one minute of arrivals, nothing consumed
    assert q.time_lag() == pytest.approx(60)
    q.step(60, 0, 50.0)  # half of them consumed: the oldest left arrived 30 s in
    assert q.backlog == pytest.approx(3000)
    assert q.time_lag() == pytest.approx(120 - 30)


def test_step_in_arrivals_gives_known_lag_curve():
    # 2 workers = 200/s. Arrivals 200/s, then 300/s for 10 minutes, then 100/s.
    rates = np.array([200.0] * 5 + [300.0] * 10 + [100.0] * 30)
    res = simulate(rates, _times(len(rates)), StaticPolicy(2), LINEAR, SimConfig(limits=Limits(restart_minutes=0)))
    lag = res.timeline["lag_s"].to_numpy()
    assert np.allclose(lag[:5], 0)
    # During the surge the backlog grows by 100/s; the oldest waiting sample
    # arrived when the backlog started: after k minutes it is k*60*(1 - 200/300) s old.
    for k in range(1, 11):
        assert lag[4 + k] == pytest.approx(k * 60 * (1 - 200 / 300), rel=1e-6)
    # The 60,000 surge samples (arrived 700..900 s) are consumed at 200/s,
    # so the head's age keeps growing to 300 s at t=1200 s (end of minute 20)...
    assert lag[19] == pytest.approx(300, rel=1e-6)
    # ...then the 30,000 newer ones drain at a net 100/s: caught up at 1500 s.
    assert lag[22] == pytest.approx(120, rel=1e-6)
    assert np.allclose(lag[24:], 0)
    m = res.metrics
    assert m.max_lag_minutes == pytest.approx(5, rel=1e-6)
    assert m.gpu_hours == pytest.approx(2 * 45 / 60)
    assert m.rescales == 0 and m.downtime_minutes == 0


@pytest.mark.parametrize(
    "interval_s, latency_s, expected_lags",
    [
        (0.0, 0.0, [0.0, 0.0, 0.0, 0.0]),
        # Committed every 2 minutes: the oldest uncommitted sample is 60 s old at the end of
        # a minute without a commit, and none is left right after one.
        (120.0, 0.0, [60.0, 0.0, 60.0, 0.0]),
        (0.0, 30.0, [30.0, 30.0, 30.0, 30.0]),  # the trainer's own latency, while samples flow
        (120.0, 30.0, [90.0, 30.0, 90.0, 30.0]),
        (0.0, (10.0, 20.0), [30.0, 30.0, 30.0, 30.0]),  # 10 s + 20 s per worker, one worker
    ],
)
def test_lag_counts_from_committed_offsets_and_the_trainer_latency(interval_s, latency_s, expected_lags):
    """What telemetry reads: commits at checkpoints trail consumption by up to the interval, plus the trainer's
    latency."""
    rates = np.full(4, 100.0)  # one worker keeps up exactly
    fixed, per_worker = latency_s if isinstance(latency_s, tuple) else (latency_s, 0.0)
    cfg = SimConfig(
        limits=Limits(restart_minutes=0),
        commit_interval_s=interval_s,
        pipeline_latency_s=fixed,
        pipeline_latency_per_worker_s=per_worker,
    )
    res = simulate(rates, _times(4), StaticPolicy(1), LINEAR, cfg)
    assert res.timeline["lag_s"].to_numpy() == pytest.approx(expected_lags, abs=1e-6)
    assert res.timeline["consumed"].sum() == pytest.approx(4 * 6000)  # consumption itself is unchanged


class _UtilizationRecorder(StaticPolicy):
    """A static allocation that records the utilization it is told at each sync."""

    def __init__(self, workers: int, seen: list, **options):
        super().__init__(workers, **options)
        self.seen = seen

    def decide(self, obs):
        self.seen.append(obs.utilization)
        return super().decide(obs)


def test_policies_see_the_workers_busy_share_as_utilization():
    """As GPU utilization reads: 2 workers (200/s) fed 100/s are half busy, whatever the backlog flicker."""
    seen = []
    simulate(
        np.full(10, 100.0),
        _times(10),
        _UtilizationRecorder(2, seen),
        LINEAR,
        SimConfig(limits=Limits(restart_minutes=0)),
    )
    assert seen[1:] == pytest.approx([0.5] * (len(seen) - 1))


@pytest.mark.parametrize("window_s, expected", [(0.0, 0.5), (60.0, 0.25), (120.0, 0.5)])
def test_utilization_spans_the_workers_metrics_window(window_s, expected):
    """2 workers (200/s) fed 150/s then 50/s, read every 2 minutes: since the last sync they were half busy; the
    latest 1-minute metrics window, what a trainer reporting in such windows shows, says a quarter."""
    seen = []
    simulate(
        np.tile([150.0, 50.0], 3),
        _times(6),
        _UtilizationRecorder(2, seen, sync_period_s=120.0),
        LINEAR,
        SimConfig(limits=Limits(restart_minutes=0), metrics_window_s=window_s),
    )
    assert seen[1:] == pytest.approx([expected] * (len(seen) - 1))


class OneChange:
    """2 workers, then 3 from minute 5; remembers nothing."""

    name, sync_period_s = "one", 60.0

    def __init__(self, told=None):
        self.told = told if told is not None else []

    def decide(self, obs):
        from kale_dagster import Decision

        self.told.append(obs.restarting)
        return Decision(3 if obs.time >= _times(1)[0].timestamp() + 300 else 2, "one", "")

    def state(self):
        return {}

    def load_state(self, state):
        pass


def test_restart_downtime_and_rescale_are_counted():
    rates = np.full(30, 150.0)
    res = simulate(
        rates,
        _times(30),
        OneChange(),
        LINEAR,
        SimConfig(limits=Limits(restart_minutes=4, slo_minutes=2), restart_jitter=0),
    )
    m = res.metrics
    assert m.rescales == 1
    assert m.downtime_minutes == pytest.approx(4)
    # No consumption for 4 minutes: lag reaches 4 minutes, above the 2-minute SLO.
    assert m.max_lag_minutes == pytest.approx(4, rel=1e-6)
    assert m.slo_violation_rate > 0
    assert m.gpu_hours == pytest.approx((5 * 2 + 25 * 3) / 60)


def test_a_decision_acts_after_the_act_latency_and_nothing_else_acts_meanwhile():
    """Decided at minute 5; with a 2-minute act latency the restart starts at minute 7: the 2 workers keep
    consuming until then, the policy is told a rescale is under way from the decision on, and it is recorded once."""
    told = []
    res = simulate(
        np.full(20, 150.0),
        _times(20),
        OneChange(told),
        LINEAR,
        SimConfig(limits=Limits(restart_minutes=4), act_latency_s=120, restart_jitter=0),
    )
    workers = res.timeline["workers"].to_numpy()
    assert list(workers[4:9]) == [2, 2, 2, 3, 3] and res.metrics.rescales == 1
    assert res.decisions[0][0] == _times(1)[0].timestamp() + 420  # the restart's start, not the decision's time
    assert told[5:11] == [False, True, True, True, True, True]  # minute 5 decided; 6 pending; 7-10 restarting
    assert res.metrics.gpu_hours == pytest.approx((7 * 2 + 13 * 3) / 60)


class Burst(OneChange):
    """OneChange, then 4 workers from minute 7, even while a restart is under way (as Kale's burst rule)."""

    def decide(self, obs):
        from kale_dagster import Decision

        if obs.time >= _times(1)[0].timestamp() + 420:
            return Decision(4, "one", "")
        return Decision(obs.workers, "one", "") if obs.restarting else super().decide(obs)


@pytest.mark.parametrize(
    "retargets, workers, downtime",
    [
        # The restart to 3 (minutes 5-9) is pointed at 4 at minute 7 and starts over: 4 workers from minute 11.
        (True, [2, 3, 3, 4, 4, 4, 4, 4, 4, 4], 6),
        # Without: the restart to 3 ends at minute 9, and a second restart, to 4, runs until minute 13.
        (False, [2, 3, 3, 3, 3, 4, 4, 4, 4, 4], 8),
    ],
)
def test_a_retarget_starts_the_restart_over_at_the_larger_group(retargets, workers, downtime):
    res = simulate(
        np.full(20, 150.0),
        _times(20),
        Burst(),
        LINEAR,
        SimConfig(limits=Limits(restart_minutes=4), restart_jitter=0, retargets=retargets),
    )
    assert list(res.timeline["workers"].to_numpy()[4:14]) == workers
    assert res.metrics.downtime_minutes == pytest.approx(downtime) and res.metrics.rescales == 2


@pytest.mark.parametrize(
    "retargets, workers, downtime",
    [
        # Upstream scales on an External metric while the pods restart: each larger patch restarts the forming
        # group, so the first restart (minute 5) ends at the largest size the lag asked for.
        (True, [5, 11, 16, 16, 16], 7.0),
        # A scale target that cannot be re-patched mid-restart: the HPA acts again only after each restart.
        (False, [2, 2, 2, 2, 4], 14.75),
    ],
)
def test_an_hpa_on_lag_patches_during_a_restart(retargets, workers, downtime):
    res = simulate(
        np.array([100.0] * 5 + [600.0] * 15),
        _times(20),
        HPAPolicy(metric="lag", target_lag_per_worker=6000, max_replicas=16),
        LINEAR,
        SimConfig(
            limits=Limits(restart_minutes=4, max_workers=16), restart_jitter=0, retargets=retargets, initial_workers=1
        ),
    )
    assert list(res.timeline["workers"].to_numpy()[5:10]) == workers
    assert res.metrics.downtime_minutes == pytest.approx(downtime)


@pytest.mark.parametrize("window_s, blind_syncs", [(0.0, 3), (60.0, 4), (120.0, 5)])
def test_a_restarted_group_reports_after_one_metrics_window(window_s, blind_syncs):
    """A 4-minute restart decided at minute 5 blinds the syncs at minutes 6-8, and one metrics window more (HPA ignores
    unready pods)."""
    told = []
    res = simulate(
        np.full(20, 150.0),
        _times(20),
        OneChange(told),
        LINEAR,
        SimConfig(limits=Limits(restart_minutes=4), metrics_window_s=window_s, restart_jitter=0),
    )
    assert sum(told) == blind_syncs and told[6 : 6 + blind_syncs] == [True] * blind_syncs
    assert res.metrics.downtime_minutes == pytest.approx(4)  # reporting late is not downtime


def test_warmup_is_not_scored():
    rates = np.array([300.0] * 10 + [100.0] * 20)
    full = simulate(rates, _times(30), StaticPolicy(2), LINEAR, SimConfig())
    scored = simulate(rates, _times(30), StaticPolicy(2), LINEAR, SimConfig(warmup_steps=20))
    assert scored.metrics.gpu_hours == pytest.approx(2 * 10 / 60)
    assert scored.metrics.accumulated_lag_minutes < full.metrics.accumulated_lag_minutes
    with pytest.raises(KaleConfigError, match="warmup"):
        simulate(rates, _times(30), StaticPolicy(2), LINEAR, SimConfig(warmup_steps=30))


@pytest.mark.parametrize("policy", ["hpa", "static"])
def test_a_baseline_starts_a_lead_in_before_the_scored_span_and_scores_as_from_the_trace_start(policy):
    """A policy that neither forecasts nor learns remembers only its queue and minutes of replica history: from a
    day's lead-in it scores exactly what it scores from the trace's start (restarts without jitter, so both runs
    draw the same world); Kale, which learns in the warm-up, runs the whole trace.  (KEDA on this trace scales 7 ->
    8 -> 7 in a cycle its restarts pace, and the lead-in starts it on another phase of that cycle: its figures
    are then another draw, as another seed's are.)"""
    history = pd.DataFrame(
        {"timestamp": _times(4 * 1440), "rate": 50 + 40 * np.sin(np.arange(4 * 1440) * 2 * np.pi / 1440)}
    )
    settings = BacktestSettings(
        peak_workers=8, limits=Limits(max_workers=8), warmup_days=3, forecaster="ewma", restart_jitter=0.0
    )
    lead_in = Backtest(history, settings).run(policy)
    whole = Backtest(history, replace(settings, lead_in_days=3)).run(policy)
    assert len(lead_in.timeline) == 2 * 1440 and len(whole.timeline) == 4 * 1440
    assert lead_in.metrics == whole.metrics
    assert len(Backtest(history, settings).run("kale").timeline) == 4 * 1440


def test_trace_is_resampled_and_scaled_to_peak_workers():
    hist = pd.DataFrame(
        {"timestamp": pd.date_range("2026-01-01", periods=3, freq="30min", tz="UTC"), "rate": [1.0, 4.0, 2.0]}
    )
    rates, times = minute_rates(hist)
    assert len(rates) == 90 and list(rates[[0, 29, 30, 89]]) == [1.0, 1.0, 4.0, 2.0]
    scaled = scale_to_peak(rates, LINEAR, peak_workers=8)
    assert scaled.max() == pytest.approx(800.0)
    assert scaled[0] == pytest.approx(200.0)


def test_settings_errors_name_the_field():
    with pytest.raises(KaleConfigError, match="peak_workers"):
        BacktestSettings(peak_workers=40, limits=Limits(max_workers=32))
    with pytest.raises(KaleConfigError, match="slo_minutes"):
        BacktestSettings(limits=Limits(slo_minutes=0))


def test_dominating_baselines():
    kale = {"gpu_hours": 100, "accumulated_lag_minutes": 50}
    sweeps = {
        "static": [
            {"setting": {"workers": 4}, "gpu_hours": 90, "accumulated_lag_minutes": 40},
            {"setting": {"workers": 8}, "gpu_hours": 120, "accumulated_lag_minutes": 0},
        ]
    }
    assert dominating_baselines(kale, sweeps) == ["static {'workers': 4}"]


def test_kale_beats_default_hpa_on_a_diurnal_day():
    hist = pd.read_csv(FIXTURES / "diurnal_3d_10min.csv")
    history = pd.DataFrame({"timestamp": pd.to_datetime(hist.timestamp, utc=True), "rate": hist.value / 600})
    bt = Backtest(history, BacktestSettings(warmup_days=2, forecaster="prophet"))
    kale, hpa = bt.run("kale").metrics, bt.run("hpa").metrics
    assert kale.accumulated_lag_minutes < hpa.accumulated_lag_minutes
    assert kale.downtime_minutes < hpa.downtime_minutes
    assert kale.gpu_hours <= hpa.gpu_hours


def _kale(*args):
    return subprocess.run(
        [sys.executable, "-m", "kale_dagster.cli", *args], capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trace", "/nonexistent.csv"], "not found"),
        (["--trace", str(FIXTURES / "malformed.csv")], "line 3"),
        (["--trace", str(FIXTURES / "diurnal_3d_10min.csv"), "--policies", "kale,magic"], "unknown magic"),
        (["--trace", str(FIXTURES / "diurnal_3d_10min.csv"), "--peak-workers", "40"], "peak_workers"),
        (["--trace", str(FIXTURES / "diurnal_3d_10min.csv"), "--warmup-days", "5"], "warm-up"),
    ],
)
def test_cli_errors(args, message):
    proc = _kale("backtest", *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


def test_cli_json_and_plot(tmp_path):
    png = tmp_path / "bt.png"
    proc = _kale(
        "backtest",
        "--trace",
        str(FIXTURES / "diurnal_3d_10min.csv"),
        "--policies",
        "hpa,static",
        "--json",
        "--plot",
        str(png),
        "--warmup-days",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    keys = {
        "accumulated_lag_minutes",
        "slo_violation_rate",
        "downtime_minutes",
        "gpu_hours",
        "rescales",
        "max_lag_minutes",
    }
    assert set(out["policies"]) == {"hpa", "static"} and set(out["policies"]["hpa"]) == keys
    grid = {
        (r["setting"]["target_utilization_pct"], r["setting"]["scale_down_window_s"], r["setting"]["rate_policies"])
        for r in out["sweeps"]["hpa"]
    }
    assert len(grid) == len(out["sweeps"]["hpa"]) == 30  # target x scale-down window x rate policies
    frontier = out["frontiers"]["hpa"]
    assert frontier and all(r in out["sweeps"]["hpa"] for r in frontier)
    assert png.stat().st_size > 10_000


# --- what the controller knows: estimates, not the simulator's truth -----------------------------


@pytest.fixture
def stepper():
    """A registered policy that plans with the estimates: 1, 2, 3, 4 workers, 30 minutes each; records each build's
    sizing."""
    from kale_dagster import Decision
    from kale_dagster.policies import POLICIES, PolicySpec

    built = []

    class Stepper:
        name, sync_period_s = "stepper", 60.0

        def decide(self, obs):
            return Decision(min(1 + int((obs.time - _times(1)[0].timestamp()) // 1800), 4), self.name, "")

        def state(self):
            return {}

        def load_state(self, state):
            pass

    def build(sizing):
        built.append(sizing)
        return Stepper()

    POLICIES.register(PolicySpec(name="stepper", description="test", build=build, uses_estimates=True))
    yield built
    POLICIES.unregister("stepper")


def _stepped(config, prior):
    from kale_dagster.control.controller import Controller, ControlSettings

    controller = Controller(
        ControlSettings(
            policy="stepper",
            limits=Limits(min_workers=1, max_workers=8, slo_minutes=20, restart_minutes=4),
        )
    )
    # Arrivals far above capacity: every minute the workers run is saturated, so each yields a measurement.
    return simulate(np.full(150, 1000.0), _times(150), controller, LINEAR, config, prior=prior)


def test_the_controller_learns_throughput_and_restart_time_from_what_it_measures(stepper):
    wrong = ThroughputModel.linear(50.0)  # the declared prior is off by half
    res = _stepped(
        SimConfig(limits=Limits(restart_minutes=4), restart_jitter=0.3, throughput_noise=0.0, refit_every_s=600), wrong
    )
    assert stepper[0].model == wrong and stepper[0].restart_s == 240  # before any measurement: what was declared
    last = stepper[-1]
    assert last.model.predict(4) == pytest.approx(LINEAR.predict(4), rel=1e-6)  # fitted on 3+ measured counts
    assert last.restart_s != 240  # the median of the restarts it saw, each 240 s x a lognormal factor
    downtimes = res.timeline["restarting"].sum() * 60
    assert res.metrics.rescales == 3 and abs(downtimes - 3 * 240) > 15  # the world's restarts vary too


def test_oracle_plans_with_the_truth_and_noise_is_seeded(stepper):
    _stepped(SimConfig(limits=Limits(restart_minutes=4), restart_jitter=0.3, oracle=True), ThroughputModel.linear(50.0))
    assert {(s.model, s.restart_s) for s in stepper} == {(LINEAR, 240)}
    stepper.clear()
    noisy = SimConfig(
        limits=Limits(restart_minutes=4), restart_jitter=0.3, throughput_noise=0.1, refit_every_s=600, seed=7
    )
    first = _stepped(noisy, LINEAR).metrics
    fitted_first = stepper[-1].model
    stepper.clear()
    assert _stepped(noisy, LINEAR).metrics == first and stepper[-1].model == fitted_first  # same seed, same world
    assert fitted_first != LINEAR  # 10% measurement noise: the fit is close, not exact
    assert fitted_first.predict(4) == pytest.approx(LINEAR.predict(4), rel=0.15)


@pytest.mark.parametrize(
    "rows, frontier",
    [
        # (GPU hours, lag) per setting -> the settings on the frontier, by GPU hours
        ([(10, 100), (20, 50), (30, 10)], [(10, 100), (20, 50), (30, 10)]),  # each trades GPUs for lag: all on it
        ([(10, 100), (20, 100), (30, 10)], [(10, 100), (30, 10)]),  # more GPUs, no less lag: dominated
        ([(10, 100), (10, 100), (5, 200)], [(5, 200), (10, 100), (10, 100)]),  # ties do not dominate each other
        ([(40, 0), (10, 0)], [(10, 0)]),
    ],
)
def test_pareto_frontier(rows, frontier):
    from kale_dagster.sim.comparison import pareto_frontier

    got = pareto_frontier([{"gpu_hours": g, "accumulated_lag_minutes": lag} for g, lag in rows])
    assert [(r["gpu_hours"], r["accumulated_lag_minutes"]) for r in got] == frontier


@pytest.mark.parametrize(
    "rows, best",
    [
        ([(90, 10), (100, 40), (120, 30)], (120, 30)),  # least lag among those with >= Kale's 100 GPU h
        ([(100, 40), (150, 40)], (100, 40)),  # equal lag: the cheaper one
        ([(50, 0), (99, 1)], None),  # none uses as many GPU hours as Kale
    ],
)
def test_best_setting_at_kales_gpu_hours(rows, best):
    from kale_dagster.sim.comparison import best_at_kales_gpu_hours

    got = best_at_kales_gpu_hours(
        {"gpu_hours": 100, "accumulated_lag_minutes": 20},
        [{"gpu_hours": g, "accumulated_lag_minutes": lag} for g, lag in rows],
    )
    assert (None if got is None else (got["gpu_hours"], got["accumulated_lag_minutes"])) == best


@pytest.mark.slow
def test_cli_report_names_the_frontier_the_optimum_and_the_costs(capsys):
    from kale_dagster.cli import main

    assert (
        main(
            [
                "backtest",
                "--trace",
                str(FIXTURES / "diurnal_3d_10min.csv"),
                "--policies",
                "hpa,static",
                "--warmup-days",
                "1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "hpa: Pareto frontier of 30 settings" in out and "static: Pareto frontier of 6 settings" in out
    optimum = next(line for line in out.splitlines() if line.startswith("offline optimum"))
    assert float(optimum.split()[-3].replace(",", "")) < 1344  # GPU h: fewer than the static peak allocation's
    assert "over the offline optimum's: hpa " in out and "(best baseline: static" in out


def test_forecasts_recorded_period_by_period_are_the_live_feed():
    """The backtest records Kale's forecasts once, one refit period per process, and replays them: every minute's
    forecast and recent error must be what the live feed, stepped minute by minute, gives."""
    from kale_dagster.forecast import make_forecaster
    from kale_dagster.sim.simulate import ForecastFeed

    n = 3 * 1440
    rates = 50 + 40 * np.sin(np.arange(n) * 2 * np.pi / 1440) + np.random.default_rng(0).normal(0, 3, n)
    config = SimConfig(refit_every_s=1440 * 60.0, forecast_horizon_s=3600.0)

    def feed():
        return ForecastFeed(lambda: make_forecaster("ewma"), _times(n), rates, config)

    live, recorded = feed(), feed()
    periods = recorded.periods()
    assert periods[0][0] == 0 and periods[-1][1] == n and len(periods) == 3  # a refit starts each day after the first
    recorded.replay([feed().record_period(*p) for p in periods])
    for minute in range(n):
        expected, got = live.update(minute), recorded.update(minute)
        assert (expected is None) == (got is None)
        if expected is not None:
            assert np.array_equal(expected.point, got.point) and np.array_equal(expected.upper, got.upper)
        assert live.recent_error(minute) == recorded.recent_error(minute)
        assert live.recent_ratio(minute) == recorded.recent_ratio(minute)


@pytest.mark.parametrize("forecast_share, ratio", [(1.0, 1.0), (0.5, 2.0), (2.0, 0.5)])
def test_the_feed_reads_the_arrivals_over_what_its_forecasts_predicted(forecast_share, ratio):
    """A forecaster that predicts a share of what comes: the arrivals over the ratio window over its one-step
    predictions are the share's inverse, once half of the window was forecast."""
    from kale_dagster.sim.oracle import Hindsight
    from kale_dagster.sim.simulate import ForecastFeed

    n, times = 600, _times(600)
    rates = 50 + 40 * np.sin(np.arange(n) * 2 * np.pi / 1440)
    config = SimConfig(forecast_every_s=60.0, ratio_window_s=7200.0)
    feed = ForecastFeed(lambda: Hindsight(times, rates * forecast_share), times, rates, config)
    got = [feed.update(minute) and feed.recent_ratio(minute) for minute in range(n)]
    assert got[59] is None and got[70] == pytest.approx(ratio) and got[-1] == pytest.approx(ratio)


def test_a_backtest_in_parallel_processes_gives_what_one_process_gives():
    history = pd.DataFrame(
        {"timestamp": _times(3 * 1440), "rate": 50 + 40 * np.sin(np.arange(3 * 1440) * 2 * np.pi / 1440)}
    )
    settings = BacktestSettings(peak_workers=8, limits=Limits(max_workers=8), warmup_days=1, forecaster="ewma")

    runs = [Run("kale"), Run("hpa"), Run("kale", perfect_forecast=True)]
    serial, serial_best = Backtest(history, replace(settings, processes=1)).run_many(runs, optimum=True)
    parallel, parallel_best = Backtest(history, replace(settings, processes=2)).run_many(runs, optimum=True)
    assert [r.metrics for r in serial] == [r.metrics for r in parallel]
    assert serial_best[1].metrics == parallel_best[1].metrics


def test_a_forecast_perfect_but_for_the_bursts_leaves_kale_the_bursts_lag():
    """Kale on the true future foresees two bursts and scales up before them; on the same future with its bursts
    cut off it meets them late, as with a live forecast.  Each kind of forecast is recorded once, apart, in the
    pool as in one process."""
    n = 3 * 1440
    rates = 50 + 40 * np.sin(np.arange(n) * 2 * np.pi / 1440)
    for start in (2 * 1440 + 300, 2 * 1440 + 1000):
        rates[start : start + 30] *= 4
    history = pd.DataFrame({"timestamp": _times(n), "rate": rates})
    settings = BacktestSettings(peak_workers=8, limits=Limits(max_workers=8), warmup_days=2, forecaster="ewma")
    runs = [Run("kale", perfect_forecast=True), Run("kale", perfect_forecast=True, burst_cap=2.0)]
    (perfect, burst_free), _ = Backtest(history, replace(settings, processes=2)).run_many(runs)
    serial = Backtest(history, replace(settings, processes=1))
    assert [r.metrics for r in serial.run_many(runs)[0]] == [perfect.metrics, burst_free.metrics]
    assert serial.forecasts(True) is not serial.forecasts(True, 2.0)
    assert burst_free.metrics.accumulated_lag_minutes > 2 * perfect.metrics.accumulated_lag_minutes


def test_another_seed_is_a_fresh_draw_of_the_noise_on_the_same_forecasts_and_optimum(monkeypatch):
    """``with_seed`` shares what depends on the trace alone (the recorded forecasts, the optimum's schedule, both
    made in the pool's processes) and gives exactly what a backtest built with that seed gives; another seed draws
    other restarts."""
    import kale_dagster.sim.backtest as backtest

    history = pd.DataFrame(
        {"timestamp": _times(3 * 1440), "rate": 50 + 40 * np.sin(np.arange(3 * 1440) * 2 * np.pi / 1440)}
    )
    settings = BacktestSettings(
        peak_workers=8, limits=Limits(max_workers=8), warmup_days=1, forecaster="ewma", processes=2
    )
    solved = []
    solve = backtest.optimal_schedule
    monkeypatch.setattr(backtest, "optimal_schedule", lambda *a, **k: solved.append(1) or solve(*a, **k))
    runs = [Run("kale"), Run("hpa")]
    first = Backtest(history, settings)
    first_results, first_best = first.run_many(runs, optimum=True)
    other = first.with_seed(1)
    assert other.forecasts(False) is first.forecasts(False)  # recorded once, in the pool, for both
    results, best = other.run_many(runs, optimum=True)
    schedule, replay = other.optimum()  # in this process: kept from the pool's solution, not solved again
    assert solved == [] and np.array_equal(schedule.workers, first_best[0].workers)
    fresh, fresh_best = Backtest(history, replace(settings, seed=1)).run_many(runs, optimum=True)
    assert [r.metrics for r in results] == [r.metrics for r in fresh]
    assert best[1].metrics == replay.metrics == fresh_best[1].metrics
    assert first.settings.seed == 0 and [r.metrics for r in first_results] != [r.metrics for r in results]


@pytest.mark.parametrize("window", [1, 2, 5, 9, 60, 500])
def test_windowed_means_are_numpys_mean_of_each_window(window):
    """The simulator reads telemetry's windowed rate from one vectorized pass; it must be, to the bit, the mean of
    each window as the minute-by-minute loop took it (the minutes before, fewer at the start, minute 0 its own)."""
    from kale_dagster.sim.simulate import windowed_means

    rates = np.random.default_rng(window).lognormal(3, 2, 400)
    expected = [rates[0]] + [np.mean(rates[max(m - window, 0) : m]) for m in range(1, len(rates))]
    assert windowed_means(rates, window).tolist() == [float(x) for x in expected]


def test_the_excess_cost_splits_into_forecast_and_planning_error_by_part():
    from kale_dagster.sim.metrics import cost_parts, excess_cost, objective

    def m(gpu_h, lag, slo, rescales):
        return {"gpu_hours": gpu_h, "accumulated_lag_minutes": lag, "slo_violation_rate": slo, "rescales": rescales}

    kale, perfect, optimum = m(30.0, 100.0, 0.01, 9), m(25.0, 80.0, 0.0, 6), m(20.0, 50.0, 0.0, 4)
    minutes = 1000.0
    split = excess_cost(kale, perfect, optimum, minutes)
    assert split["forecast"] == {"gpu": 300.0, "lag": 160.0, "slo": 1000.0}
    assert split["planning"] == {"gpu": 300.0, "lag": 240.0, "slo": 0.0}
    total = sum(split["forecast"].values()) + sum(split["planning"].values())
    assert total == pytest.approx(objective(kale, minutes) - objective(optimum, minutes))
    assert cost_parts(optimum, minutes) == {"gpu": 1200.0, "lag": 400.0, "slo": 0.0}
    assert split["rescales"] == {"kale": 9, "perfect_forecast": 6, "optimum": 4}


def _idle_nights(days: int = 3) -> pd.DataFrame:
    """Traffic from 06:00 to 22:00 each day and none at night."""
    t = pd.date_range("2026-01-01", periods=days * 144, freq="10min", tz="UTC")
    hour = (t.hour + t.minute / 60).to_numpy()
    return pd.DataFrame(
        {"timestamp": t, "rate": np.where((hour >= 6) & (hour < 22), 100 + 80 * np.sin((hour - 6) / 16 * np.pi), 0.0)}
    )


@pytest.mark.parametrize("policy", ["kale", "keda"])
def test_scale_to_zero_stops_idle_workers_and_the_first_records_start_them(policy):
    def run(limits):
        settings = BacktestSettings(limits=limits, warmup_days=2, forecaster="prophet", peak_workers=8, processes=1)
        return Backtest(_idle_nights(), settings).run(policy)

    to_zero = run(Limits(min_workers=0, activation_lag=1000, restart_minutes=5))
    kept = run(Limits(min_workers=1, restart_minutes=5))
    day = to_zero.timeline[to_zero.timeline["scored"]]
    hour = day["time"].dt.hour + day["time"].dt.minute / 60
    night = day[(hour >= 3) & (hour < 6)]
    assert (night["workers"] == 0).all()  # idle: nothing runs
    morning = day[(hour >= 6) & (hour < 7)]
    started = morning[morning["workers"] > 0]
    assert len(started) and started["time"].iloc[0] - morning["time"].iloc[0] <= pd.Timedelta(minutes=20)
    assert day["lag_s"].iloc[-60:].max() == 0  # everything that arrived was trained
    assert to_zero.metrics.gpu_hours < kept.metrics.gpu_hours
    assert to_zero.metrics.slo_violation_rate <= kept.metrics.slo_violation_rate


def test_in_pods_of_four_every_policy_the_simulator_and_the_optimum_run_whole_pods():
    """``workers_per_pod`` is one rule for every reader: the policies' answers are rounded up to whole pods by the
    controller (in the simulator as on Dagster), Kale judges only whole pods, the optimum weighs only them."""
    hist = pd.read_csv(FIXTURES / "diurnal_3d_10min.csv")
    history = pd.DataFrame({"timestamp": pd.to_datetime(hist.timestamp, utc=True), "rate": hist.value / 600})
    limits = Limits(min_workers=4, max_workers=32, workers_per_pod=4)
    bt = Backtest(history, BacktestSettings(limits=limits, peak_workers=26, warmup_days=2, forecaster="ewma"))
    for policy in ("kale", "hpa", "keda", "static"):
        result = bt.run(policy)
        sizes = set(result.timeline["workers"].tolist())
        assert sizes and all(w % 4 == 0 for w in sizes), (policy, sizes)
        assert len(sizes) > 1 or policy == "static", policy  # the day's swing moves them: the rule was exercised
    _, optimum = bt.optimum()
    sizes = set(optimum.timeline["workers"].tolist())
    assert len(sizes) > 1 and all(w % 4 == 0 for w in sizes), sizes


def test_a_decision_between_pods_is_rounded_up_and_says_so():
    limits = Limits(min_workers=0, max_workers=16, workers_per_pod=8)
    rates = np.full(20, 150.0)  # two workers' worth at 100 samples/s each: the static policy asks for 2
    res = simulate(
        rates, _times(20), StaticPolicy(2), LINEAR, SimConfig(limits=limits, initial_workers=0, restart_jitter=0)
    )
    assert set(res.timeline["workers"]) <= {0, 8}
    assert any("2 rounded up to 8: whole pods of 8 workers" in d[3] for d in res.decisions), res.decisions
