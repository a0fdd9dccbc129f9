"""LiveController: one tick of telemetry -> policy -> launcher, and learning real worker capacity."""

from __future__ import annotations

import threading

import pytest

from kale_dagster import KaleConfig, KalePolicy, StaticPolicy, ThroughputModel
from kale_dagster.control.live import LiveController
from kale_dagster.launchers import RescaleRecord
from kale_dagster.stream.history import MetricsHistory
from kale_dagster.stream.telemetry import StreamSnapshot


class FakeStream:
    def __init__(self, lag, rate):
        self.lag, self.rate = lag, rate

    def snapshot(self, previous=None, fetch_timeout_s=1.0):
        return StreamSnapshot(time=1_800_000_000.0, partitions=(), end_offset_total=0, committed_total=0,
                              sample_lag=self.lag, arrival_rate=self.rate, consumption_rate=self.rate, time_lag_s=30.0)


class FakeLauncher:
    def __init__(self, workers, total, busy_share=None):
        self.workers, self.total, self.busy_share, self.rescales = workers, total, busy_share, []

    def supervise_once(self):
        return None

    def record_throughput(self, history, pipeline):
        return {"workers": self.workers, "total": self.total, "per_rank": {}, "busy_share": self.busy_share, "emulated": True}

    def rescale(self, m, reason=""):
        self.rescales.append(m)
        record = RescaleRecord(0.0, self.workers, m, 1.0, reason)
        self.workers = m
        return record


def test_tick_applies_the_decision(tmp_path):
    launcher = FakeLauncher(2, 100.0)
    loop = LiveController(FakeStream(0, 100.0), launcher, StaticPolicy(3), ThroughputModel.linear(100.0),
                          MetricsHistory(f"sqlite:///{tmp_path / 'm.db'}"), "p", forecast_horizon_s=600)
    tick = loop.tick()
    assert tick.restarting and tick.workers == 3  # allocated from the decision on
    record = loop.wait_idle(10)
    assert launcher.rescales == [3] and record.to_workers == 3 and launcher.workers == 3
    assert len(loop.history.stream("p")) == 1
    loop.close()


class SlowLauncher(FakeLauncher):
    """A rescale that takes until released, or fails."""

    def __init__(self, workers, total, fail=False):
        super().__init__(workers, total)
        self.release, self.fail = threading.Event(), fail

    def rescale(self, m, reason=""):
        self.release.wait(10)
        if self.fail:
            raise RuntimeError("worker exited with code 1 before 'started'")
        return super().rescale(m, reason)


def test_the_loop_keeps_observing_while_a_rescale_is_in_flight(tmp_path):
    launcher = SlowLauncher(2, 100.0)
    policy = RecordingPolicy(3)
    loop = LiveController(FakeStream(500, 100.0), launcher, policy, ThroughputModel.linear(100.0),
                          MetricsHistory(f"sqlite:///{tmp_path / 'm.db'}"), "p", forecast_horizon_s=600)
    assert loop.tick().restarting
    second = loop.tick()  # not blocked by the restart: lag during it is observed
    assert second.restarting and second.record is None and policy.seen.restarting and launcher.rescales == []
    launcher.release.set()
    loop.wait_idle(10)
    third = loop.tick()
    assert not third.restarting and third.workers == 3 and launcher.rescales == [3]
    loop.close()


def test_a_failed_rescale_raises_in_the_loop(tmp_path):
    launcher = SlowLauncher(2, 100.0, fail=True)
    launcher.release.set()
    loop = LiveController(FakeStream(0, 100.0), launcher, StaticPolicy(3), ThroughputModel.linear(100.0),
                          MetricsHistory(f"sqlite:///{tmp_path / 'm.db'}"), "p", forecast_horizon_s=600)
    loop.tick()
    with pytest.raises(RuntimeError, match="before 'started'"):
        loop.wait_idle(10)
    loop.close()


def test_capacity_is_learned_only_while_busy(tmp_path):
    history = MetricsHistory(f"sqlite:///{tmp_path / 'm.db'}")
    policy = KalePolicy(ThroughputModel.linear(150.0), KaleConfig(max_workers=8))
    idle = LiveController(FakeStream(0, 60.0), FakeLauncher(2, 60.0), policy, ThroughputModel.linear(150.0), history, "p", 600)
    idle.tick()
    assert idle.per_worker_rate is None  # keeping up: throughput is the arrival rate, not capacity
    busy = LiveController(FakeStream(50_000, 300.0), FakeLauncher(4, 360.0), policy, ThroughputModel.linear(150.0), history, "p", 600)
    busy.tick()
    assert busy.per_worker_rate == 90.0
    assert policy.model.predict(1) == 90.0  # Kale now plans with what a worker really does


class RecordingPolicy(StaticPolicy):
    def decide(self, obs):
        self.seen = obs
        return super().decide(obs)


def test_hpa_sees_the_workers_busy_share_when_reported(tmp_path):
    """GPU utilization is what HPA scales on: the workers' busy share, not a guess from lag."""
    history = MetricsHistory(f"sqlite:///{tmp_path / 'm.db'}")
    reported = RecordingPolicy(2)
    LiveController(FakeStream(400, 100.0), FakeLauncher(2, 100.0, busy_share=0.55), reported, ThroughputModel.linear(150.0), history, "p", 600).tick()
    assert reported.seen.utilization == 0.55
    guessed = RecordingPolicy(2)  # no busy share (e.g. older workers): a waiting backlog means all busy
    LiveController(FakeStream(400, 100.0), FakeLauncher(2, 100.0), guessed, ThroughputModel.linear(150.0), history, "p", 600).tick()
    assert guessed.seen.utilization == 1.0
    idle = RecordingPolicy(2)
    LiveController(FakeStream(0, 100.0), FakeLauncher(2, 100.0), idle, ThroughputModel.linear(150.0), history, "p", 600).tick()
    assert abs(idle.seen.utilization - 100.0 / 300.0) < 1e-9
