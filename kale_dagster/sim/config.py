"""The simulated world's settings and its controller's cadences (``SimConfig``), and the simulator's time steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from kale_dagster.control.controller import ControlSettings
from kale_dagster.model.limits import Limits
from kale_dagster.rules import check, setting

#: The simulator's tick, and a minute (the trace's step), in seconds.
TICK_S = 15.0
MINUTE = 60.0


@dataclass(frozen=True)
class SimConfig:
    """The simulated world and its controller's cadences; the pipeline's ``limits`` are the declared ones.

    The world's restarts take ``limits.restart_s`` times a lognormal factor (``restart_jitter``)."""

    limits: Limits = field(default_factory=Limits)
    warmup_steps: int = setting(0, ge=0, unit="min", description="minutes simulated but not scored")
    initial_workers: int | None = setting(None, ge=0, description="default: enough for the first minute")
    refit_every_s: float = setting(86_400.0, gt=0, unit="s")
    forecast_every_s: float = setting(600.0, gt=0, unit="s")
    forecast_horizon_s: float = setting(7200.0, gt=0, unit="s")
    rate_window_s: float = setting(
        ControlSettings.rate_window_s, gt=0, unit="s", description="telemetry's averaging window for rates"
    )
    error_window_s: float = setting(
        ControlSettings.error_window_s, gt=0, unit="s", description="the recent forecast error's window"
    )
    ratio_window_s: float = setting(
        ControlSettings.ratio_window_s,
        gt=0,
        unit="s",
        description="the window of the arrivals over what the forecast predicted",
    )
    commit_interval_s: float = setting(0.0, ge=0, unit="s", description="offsets committed this often; 0: as consumed")
    pipeline_latency_s: float = setting(
        0.0, ge=0, unit="s", description="a sample's time inside the trainer before it can be committed..."
    )
    pipeline_latency_per_worker_s: float = setting(0.0, ge=0, unit="s", description="...plus this per worker")
    metrics_window_s: float = setting(
        0.0, ge=0, unit="s", description="the workers' metrics window: a reading's span, and a restarted group's wait"
    )
    act_latency_s: float = setting(
        0.0, ge=0, unit="s", description="from a decision to its rescale starting (live: the tick, then the run)"
    )
    # The launcher can point a restart under way at a larger group (``Launcher.retargets``); the new group's
    # restart then starts over.
    retargets: bool = True
    # What a controller cannot know exactly (see _Measurements):
    throughput_noise: float = setting(
        0.05, ge=0, description="relative standard deviation of each measured (saturated) minute's throughput"
    )
    restart_jitter: float = setting(0.2, ge=0, description="sigma of the lognormal factor on each restart's time")
    profile_workers: tuple[int, ...] = ()  # worker counts profiled before the run (the paper's section 3.3); () = none
    seed: int = 0
    oracle: bool = False  # a Controller plans with the true F(w) and the nominal restart_s instead of its estimates

    def __post_init__(self):
        check(self)
