"""Simulator and backtest: metric arithmetic on hand-computed cases, scaling, warm-up, CLI errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from kale_dagster import KaleConfigError, StaticPolicy, ThroughputModel
from kale_dagster.model.backlog import FifoBacklog
from kale_dagster.sim.backtest import Backtest, BacktestSettings, dominating_baselines, minute_rates, scale_to_peak
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
    res = simulate(rates, _times(len(rates)), StaticPolicy(2), LINEAR, SimConfig(restart_s=0))
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


@pytest.mark.parametrize("interval_s, latency_s, expected_lags", [
    (0.0, 0.0, [0.0, 0.0, 0.0, 0.0]),
    # Committed every 2 minutes: the oldest uncommitted sample is 60 s old at the end of
    # a minute without a commit, and none is left right after one.
    (120.0, 0.0, [60.0, 0.0, 60.0, 0.0]),
    (0.0, 30.0, [30.0, 30.0, 30.0, 30.0]),  # the trainer's own latency, while samples flow
    (120.0, 30.0, [90.0, 30.0, 90.0, 30.0]),
    (0.0, (10.0, 20.0), [30.0, 30.0, 30.0, 30.0]),  # 10 s + 20 s per worker, one worker
])
def test_lag_counts_from_committed_offsets_and_the_trainer_latency(interval_s, latency_s, expected_lags):
    """What telemetry reads: commits at checkpoints trail consumption by up to the interval, plus the trainer's latency."""
    rates = np.full(4, 100.0)  # one worker keeps up exactly
    fixed, per_worker = latency_s if isinstance(latency_s, tuple) else (latency_s, 0.0)
    cfg = SimConfig(restart_s=0, commit_interval_s=interval_s, pipeline_latency_s=fixed, pipeline_latency_per_worker_s=per_worker)
    res = simulate(rates, _times(4), StaticPolicy(1), LINEAR, cfg)
    assert res.timeline["lag_s"].to_numpy() == pytest.approx(expected_lags, abs=1e-6)
    assert res.timeline["consumed"].sum() == pytest.approx(4 * 6000)  # consumption itself is unchanged


def test_policies_see_the_workers_busy_share_as_utilization():
    """As GPU utilization reads: 2 workers (200/s) fed 100/s are half busy, whatever the backlog flicker."""
    seen = []

    class Recorder(StaticPolicy):
        def decide(self, obs):
            seen.append(obs.utilization)
            return super().decide(obs)

    simulate(np.full(10, 100.0), _times(10), Recorder(2), LINEAR, SimConfig(restart_s=0))
    assert seen[1:] == pytest.approx([0.5] * (len(seen) - 1))


def test_restart_downtime_and_rescale_are_counted():
    class OneChange:
        name, sync_period_s = "one", 60.0

        def decide(self, obs):
            from kale_dagster import Decision

            return Decision(3 if obs.time >= _times(1)[0].timestamp() + 300 else 2, "one", "")

    rates = np.full(30, 150.0)
    res = simulate(rates, _times(30), OneChange(), LINEAR, SimConfig(restart_s=240, slo_s=120))
    m = res.metrics
    assert m.rescales == 1
    assert m.downtime_minutes == pytest.approx(4)
    # No consumption for 4 minutes: lag reaches 4 minutes, above the 2-minute SLO.
    assert m.max_lag_minutes == pytest.approx(4, rel=1e-6)
    assert m.slo_violation_rate > 0
    assert m.gpu_hours == pytest.approx((5 * 2 + 25 * 3) / 60)


@pytest.mark.parametrize("window_s, blind_syncs", [(0.0, 3), (60.0, 4), (120.0, 5)])
def test_a_restarted_group_reports_after_one_metrics_window(window_s, blind_syncs):
    """A 4-minute restart decided at minute 5 blinds the syncs at minutes 6-8, and one metrics window more (HPA ignores unready pods)."""
    told = []

    class OneChange:
        name, sync_period_s = "one", 60.0

        def decide(self, obs):
            from kale_dagster import Decision

            told.append(obs.restarting)
            return Decision(3 if obs.time >= _times(1)[0].timestamp() + 300 else 2, "one", "")

    res = simulate(np.full(20, 150.0), _times(20), OneChange(), LINEAR, SimConfig(restart_s=240, metrics_window_s=window_s))
    assert sum(told) == blind_syncs and told[6:6 + blind_syncs] == [True] * blind_syncs
    assert res.metrics.downtime_minutes == pytest.approx(4)  # reporting late is not downtime


def test_warmup_is_not_scored():
    rates = np.array([300.0] * 10 + [100.0] * 20)
    full = simulate(rates, _times(30), StaticPolicy(2), LINEAR, SimConfig())
    scored = simulate(rates, _times(30), StaticPolicy(2), LINEAR, SimConfig(warmup_steps=20))
    assert scored.metrics.gpu_hours == pytest.approx(2 * 10 / 60)
    assert scored.metrics.accumulated_lag_minutes < full.metrics.accumulated_lag_minutes
    with pytest.raises(KaleConfigError, match="warmup"):
        simulate(rates, _times(30), StaticPolicy(2), LINEAR, SimConfig(warmup_steps=30))


def test_trace_is_resampled_and_scaled_to_peak_workers():
    hist = pd.DataFrame({"timestamp": pd.date_range("2026-01-01", periods=3, freq="30min", tz="UTC"), "rate": [1.0, 4.0, 2.0]})
    rates, times = minute_rates(hist)
    assert len(rates) == 90 and list(rates[[0, 29, 30, 89]]) == [1.0, 1.0, 4.0, 2.0]
    scaled = scale_to_peak(rates, LINEAR, peak_workers=8)
    assert scaled.max() == pytest.approx(800.0)
    assert scaled[0] == pytest.approx(200.0)


def test_settings_errors_name_the_field():
    with pytest.raises(KaleConfigError, match="peak_workers"):
        BacktestSettings(peak_workers=40, max_workers=32)
    with pytest.raises(KaleConfigError, match="slo_minutes"):
        BacktestSettings(slo_minutes=0)


def test_dominating_baselines():
    kale = {"gpu_hours": 100, "accumulated_lag_minutes": 50}
    sweeps = {"static": [{"setting": {"workers": 4}, "gpu_hours": 90, "accumulated_lag_minutes": 40}, {"setting": {"workers": 8}, "gpu_hours": 120, "accumulated_lag_minutes": 0}]}
    assert dominating_baselines(kale, sweeps) == ["static {'workers': 4}"]


def test_kale_beats_default_hpa_on_a_diurnal_day():
    hist = pd.read_csv(FIXTURES / "diurnal_3d_10min.csv")
    history = pd.DataFrame({"timestamp": pd.to_datetime(hist.timestamp, utc=True), "rate": hist.value / 600})
    bt = Backtest(history, BacktestSettings(warmup_days=2, forecaster="prophet"))
    kale, hpa = bt.run(bt.policy("kale")).metrics, bt.run(bt.policy("hpa")).metrics
    assert kale.accumulated_lag_minutes < hpa.accumulated_lag_minutes
    assert kale.downtime_minutes < hpa.downtime_minutes
    assert kale.gpu_hours <= hpa.gpu_hours


def _kale(*args):
    return subprocess.run([sys.executable, "-m", "kale_dagster.cli", *args], capture_output=True, text=True, timeout=600)


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
    proc = _kale("backtest", "--trace", str(FIXTURES / "diurnal_3d_10min.csv"), "--policies", "hpa,static", "--json", "--plot", str(png), "--warmup-days", "1")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    keys = {"accumulated_lag_minutes", "slo_violation_rate", "downtime_minutes", "gpu_hours", "rescales", "max_lag_minutes"}
    assert set(out["policies"]) == {"hpa", "static"} and set(out["policies"]["hpa"]) == keys
    assert [row["setting"]["target_utilization_pct"] for row in out["sweeps"]["hpa"]] == [50, 60, 70, 80, 90]
    assert png.stat().st_size > 10_000
