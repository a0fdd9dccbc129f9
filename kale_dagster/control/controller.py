"""One pipeline's controller: observe -> decide -> act, once, for every caller.

The metrics sensor calls :meth:`Controller.step` at every tick, and the
``gpu_allocation`` asset when an operator materializes it; both hand it
what actually runs and what was measured, in pipeline units
(``control.clock``):

1. observe: the stream (lag, time lag, rates averaged over the rate
   window and the latest interval's arrival rate), what the launcher reports (workers allocated, their busy share,
   a restart in progress), the fitted throughput model and the forecast,
   into the same ``Observation`` the simulator builds, with the same
   utilization formula (``model.utilization``);
2. hold, without asking the policy, when the controller cannot see: the
   launcher does not answer, or the stream has no rate yet (first reading,
   telemetry gap).  A hold never scales in;
3. decide: the pipeline's registered policy, rebuilt with the restart time
   measured from recent rescales (their median; the declared one until
   there is one) and its state restored from the previous decision; the
   answer rounded up to whole pods (``Limits.whole_pods``), and capped at the
   cluster's capacity while a shortfall the launcher found holds
   (``LauncherStatus.capacity``), the reason saying so;
4. act: a rescale to the decided count when it differs from what runs,
   nothing is restarting and the pipeline is not advisory; during a
   restart, a retarget to a larger count where the launcher can redirect it.

Pure: no Dagster, no I/O.  ``definitions.control`` gathers the inputs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from kale_dagster.forecast.base import Forecast
from kale_dagster.forecast.evaluate import smape
from kale_dagster.launchers.base import LauncherStatus
from kale_dagster.model.limits import Limits
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.model.types import Decision, Observation, PartitionOffsets, ScalingPolicy
from kale_dagster.model.utilization import utilization
from kale_dagster.policies import POLICIES, Sizing


@dataclass(frozen=True)
class ControlSettings:
    """A pipeline's controller, as declared (times in pipeline seconds)."""

    policy: str
    limits: Limits
    policy_options: Mapping = field(default_factory=dict)
    advisory: bool = False
    rate_window_s: float = 300.0  # arrival and consumption rates are averaged over this window
    error_window_s: float = 3600.0  # the forecast's recent error is measured over this window
    ratio_window_s: float = 7200.0  # and the arrivals over what it predicted, over this one
    adequate_workers: int | None = None  # the static baseline's fixed allocation (Sizing.adequate_workers)
    partitions: int | None = None  # for policies that need it when readings carry no per-partition offsets


@dataclass(frozen=True)
class StreamReading:
    """Telemetry at one tick, in pipeline units; rates are None until two readings exist.

    ``arrival_rate`` is averaged over the rate window, which a one-interval spike
    cannot move; ``latest_arrival_rate``, over the interval since the previous
    reading, is where a burst shows first.
    """

    time: float
    arrival_rate: float | None
    consumption_rate: float | None
    backlog: float
    time_lag_s: float
    partitions: tuple[PartitionOffsets, ...] = ()
    latest_arrival_rate: float | None = None
    time_lag_complete: bool = True  # False: some lagging partition's oldest record told no usable time


@dataclass(frozen=True)
class ControlInput:
    """Everything one step decides on, as its caller (the sensor's tick, the simulator) gathered it.

    ``status`` is what the launcher reported, as it reported it (None: it did not answer, ``launcher_error``
    says why).  A rescale run in flight (``rescale_in_flight``) is known to the caller, not the launcher: its
    ``rescale_target`` is the allocation while its restart has not begun.  ``retargetable`` says the launcher
    can redirect a restart under way (``Launcher.supports_retarget``) and the caller can reach that restart.
    ``time_scale`` converts the launcher's wall-second downtimes to pipeline seconds; ``last_workers`` is what
    the controller last knew runs, for a hold without a launcher; ``policy_state`` None continues from the
    policy's memory (fresh the first time)."""

    reading: StreamReading
    status: LauncherStatus | None
    model: ThroughputModel
    forecast: Forecast | None = None
    forecast_error: float | None = None
    forecast_ratio: float | None = None
    policy_state: dict | None = None
    rescale_in_flight: bool = False
    rescale_target: int | None = None
    retargetable: bool = False
    time_scale: float = 1.0
    launcher_error: str = ""
    last_workers: int | None = None


@dataclass(frozen=True)
class ControlStep:
    """What one step decided and why, and what to do about it."""

    decision: Decision
    observation: Observation | None  # None when the controller held without observing
    restart_s: float
    restart_source: str
    rescale_to: int | None = None
    retarget: bool = False  # rescale_to redirects the restart under way (``Launcher.retarget``)
    held: str = ""  # why the policy was not asked, when it was not
    state: dict | Callable[[], dict] = field(default_factory=dict, repr=False, compare=False)

    @property
    def policy_state(self) -> dict:
        """What the policy remembers after this step, to restore in the next (read before the controller steps
        again; taken on demand because a long-lived caller, the simulator, never needs it)."""
        return self.state() if callable(self.state) else dict(self.state)

    @property
    def outcome(self) -> str:
        """What the decision amounts to, one of ``OUTCOMES``: a bounded label for counting decisions and
        rescales (the reason is free text).  ``recover`` restarts a failed group at the size it ran."""
        if self.held or self.observation is None:
            return "held"
        if self.decision.workers > self.observation.workers:
            return "scale_up"
        if self.decision.workers < self.observation.workers:
            return "scale_down"
        return "recover" if self.rescale_to is not None else "keep"


#: Every ``ControlStep.outcome``.
OUTCOMES = ("keep", "scale_up", "scale_down", "recover", "held")


def restart_estimate(downtimes_s: Sequence[float], declared_s: float) -> tuple[float, str]:
    """The restart time to plan with: the median of measured restarts, else the declared one."""
    if downtimes_s:
        return float(statistics.median(downtimes_s)), f"measured (median of the last {len(downtimes_s)} restarts)"
    return declared_s, "declared (no restart measured yet)"


def recent_forecast_error(
    times: Sequence[float] | np.ndarray,
    predicted: Sequence[float],
    actual: Sequence[float] | np.ndarray,
    now: float,
    window_s: float,
) -> float | None:
    """sMAPE of earlier one-step predictions against the rates that then arrived, over the last ``window_s``.

    ``actual`` is NaN where nothing was measured.  None until the measured
    pairs span half of the window (as the simulator requires half of its minutes).
    """
    pairs = _recent_pairs(times, predicted, actual, now, window_s)
    return smape(*pairs) if pairs is not None else None


def recent_forecast_ratio(
    times: Sequence[float] | np.ndarray,
    predicted: Sequence[float],
    actual: Sequence[float] | np.ndarray,
    now: float,
    window_s: float,
) -> float | None:
    """What arrived over the last ``window_s`` divided by what the one-step predictions said would (None as
    :func:`recent_forecast_error`, or when nothing was predicted)."""
    pairs = _recent_pairs(times, predicted, actual, now, window_s)
    return arrivals_over_forecast(*pairs) if pairs is not None else None


def arrivals_over_forecast(measured: np.ndarray, forecast: np.ndarray) -> float | None:
    """The measured total over the forecast total (None when nothing was forecast)."""
    expected = float(np.sum(forecast))
    return float(np.sum(measured)) / expected if expected > 0 else None


def _recent_pairs(times, predicted, actual, now: float, window_s: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(measured, predicted) of the pairs measured within the last ``window_s``; None until they span half of it."""
    pairs = [(a, p) for t, p, a in zip(times, predicted, actual) if now - window_s <= t <= now and a == a]
    used = [t for t, _, a in zip(times, predicted, actual) if now - window_s <= t <= now and a == a]
    if not pairs or max(used) - min(used) < window_s / 2:
        return None
    measured, forecast = zip(*pairs)
    return np.asarray(measured), np.asarray(forecast)


def completed_time_lag(reading: StreamReading) -> tuple[StreamReading | None, str]:
    """A reading whose time lag can be decided on, and what was done to it ("" when nothing was).

    When some lagging partition's oldest record told no usable time (``stream.record_time``), the time lag
    read is only the other partitions': a lower bound.  Under FIFO the backlog at the arrival rate is how
    long the oldest waiting sample has waited, so the lag is taken as the larger of the two, and the
    decision says so.  With nothing arriving there is nothing to estimate it from: None, and why (the
    controller holds)."""
    if reading.time_lag_complete or reading.backlog <= 0:
        return reading, ""
    rate = reading.arrival_rate or 0.0
    if rate <= 0:
        return (
            None,
            "the time lag is unknown (lagging partitions' records carry no usable timestamp) and nothing arrives",
        )
    estimate = reading.backlog / rate
    note = (
        f"time lag taken as {max(reading.time_lag_s, estimate) / 60:.1f} min, the backlog at the arrival rate "
        "(some lagging partitions' records carry no usable timestamp)"
    )
    return replace(reading, time_lag_s=max(reading.time_lag_s, estimate), time_lag_complete=True), note


class Controller:
    """Turns what runs and what was measured into one decision (see the module docstring).

    The policy is built from the registry with what the controller knows
    (the fitted model, the restart estimate); one that plans with them
    (``PolicySpec.uses_estimates``) is rebuilt, its state carried over,
    whenever they change.  Between changes the same object decides, so a
    long-lived controller (the simulator) pays no rebuild per tick.
    ``build`` replaces the registry: :meth:`fixed` wraps a policy that keeps
    what it was built with.
    """

    def __init__(self, settings: ControlSettings, build: Callable[[Sizing], ScalingPolicy] | None = None):
        self.settings = settings
        learns = False
        if build is None:
            spec = POLICIES[settings.policy]  # an unknown policy fails here, naming the choices
            build = lambda sizing: spec.build(sizing, **settings.policy_options)  # noqa: E731
            learns = spec.uses_estimates
        self._build = build
        self._learns = learns  # rebuilt when the estimates change; the others keep the settings they were built with
        self._built: tuple[Sizing, ScalingPolicy] | None = None
        self._restart: tuple | None = None  # (downtimes, time scale) -> restart_estimate, for the last ones seen

    @classmethod
    def fixed(cls, policy: ScalingPolicy, settings: ControlSettings) -> Controller:
        """A controller around a policy already built: it plans with what it was built with, whatever is measured."""
        return cls(settings, build=lambda sizing: policy)

    @property
    def policy_in_use(self) -> ScalingPolicy | None:
        """The policy the last step decided with (None before the first)."""
        return self._built[1] if self._built is not None else None

    def policy(self, sizing: Sizing, state: dict | None = None) -> ScalingPolicy:
        """The policy for this knowledge; ``state`` (a previous decision's) replaces what it remembers."""
        if self._built is None or (self._learns and self._built[0] != sizing):
            previous = self._built[1] if self._built is not None else None
            policy = self._build(sizing)
            if state is None and previous is not None and previous is not policy:
                policy.load_state(previous.state())  # new knowledge, same memory
            self._built = (sizing, policy)
        policy = self._built[1]
        if state is not None:
            policy.load_state(state)
        return policy

    @staticmethod
    def observe(inp: ControlInput, reading: StreamReading, status: LauncherStatus) -> Observation:
        """The policy's view, built as the simulator builds it (``reading``: ``inp``'s, its time lag completed)."""
        workers = status.workers
        if inp.rescale_in_flight and inp.rescale_target is not None and not status.rescaling:
            workers = inp.rescale_target  # a restart requested and not begun: its target is the allocation
        # A group that has not reported since it started is still starting: no utilization, no action
        # (pods that are not ready give HPA none).  Launchers that cannot see the workers' metrics never wait.
        starting = status.measures and workers > 0 and status.busy_share is None
        capacity = 0.0 if status.rescaling else float(inp.model.predict(workers))
        rescale_in_flight = inp.rescale_in_flight
        return Observation(
            time=reading.time,
            workers=workers,
            arrival_rate=reading.arrival_rate or 0.0,
            consumption_rate=reading.consumption_rate or 0.0,
            backlog=reading.backlog,
            time_lag_s=reading.time_lag_s,
            utilization=utilization(status.busy_share, reading.backlog, reading.consumption_rate or 0.0, capacity),
            partitions=reading.partitions,
            forecast=inp.forecast,
            forecast_error=inp.forecast_error,
            forecast_ratio=inp.forecast_ratio,
            restarting=status.rescaling or rescale_in_flight or starting,
            retargetable=inp.retargetable and (status.rescaling or rescale_in_flight),
            latest_arrival_rate=reading.latest_arrival_rate,
        )

    def step(self, inp: ControlInput) -> ControlStep:
        """One decision (see the module docstring's stages)."""
        s, status, reading = self.settings, inp.status, inp.reading
        restart_s, restart_source = self._restart_estimate(status, inp.time_scale)
        policy_state = inp.policy_state
        # Stage 2: hold without asking the policy when the controller cannot see.
        if status is None:
            held = f"the launcher did not answer ({inp.launcher_error or 'no status'})"
            workers = inp.last_workers if inp.last_workers is not None else s.limits.min_workers
            return self._hold(workers, held, policy_state, restart_s, restart_source)
        if reading.arrival_rate is None:
            why = "no arrival rate yet (first reading, or a telemetry gap)"
            return self._hold(status.workers, why, policy_state, restart_s, restart_source)
        completed, estimated = completed_time_lag(reading)
        if completed is None:
            return self._hold(status.workers, estimated, policy_state, restart_s, restart_source)
        # Stages 1 and 3: observe, and ask the policy.
        obs = self.observe(inp, completed, status)
        policy = self._policy_for(inp, restart_s, measured=bool(status.downtimes_s))
        decision = policy.decide(obs)
        whole = s.limits.whole_pods(decision.workers)
        if whole != decision.workers:  # every policy's answer runs as whole pods (the optimum weighs only those)
            decision = replace(
                decision,
                workers=whole,
                reason=f"{decision.reason}; {decision.workers} rounded up to {whole}: whole pods of "
                f"{s.limits.workers_per_pod} workers",
            )
        ceiling = status.capacity
        if ceiling is not None and decision.workers > max(ceiling, obs.workers):  # no asking for GPUs not there
            capped = max(ceiling, obs.workers)
            decision = replace(  # said first: a reason cut to a terminal's width still says it
                decision,
                workers=capped,
                reason=f"capped at {capped}, the cluster's capacity ({status.capacity_note}); {decision.reason}",
            )
        failed = bool(status.failed) and not obs.restarting
        if failed:
            # Nothing else restarts a failed group: restart it, at the size the policy wants now.
            decision = replace(
                decision,
                reason=f"the running group failed ({status.failed}); restarting it at {decision.workers} "
                f"from the last checkpoint; {decision.reason}",
            )
        if estimated:
            decision = replace(decision, reason=f"{decision.reason}; {estimated}")
        # Stage 4: act.  During a restart only a larger group can be asked for, of a launcher that can redirect it.
        retarget = obs.retargetable and decision.workers > obs.workers
        act = (decision.workers != obs.workers or failed) and (not obs.restarting or retarget) and not s.advisory
        return ControlStep(
            decision,
            obs,
            restart_s,
            restart_source,
            rescale_to=decision.workers if act else None,
            retarget=retarget and act,
            state=policy.state,
        )

    def _restart_estimate(self, status: LauncherStatus | None, time_scale: float) -> tuple[float, str]:
        """The restart time to plan with, in pipeline seconds, and where it came from."""
        measured = (status.downtimes_s if status is not None else (), time_scale)
        if self._restart is None or self._restart[0] != measured:  # the same restarts at most ticks: one median each
            declared = self.settings.limits.restart_s
            self._restart = (measured, restart_estimate([d * time_scale for d in measured[0]], declared))
        return self._restart[1]

    def _policy_for(self, inp: ControlInput, restart_s: float, measured: bool) -> ScalingPolicy:
        """The policy to ask, with what the controller knows now and ``inp``'s state."""
        if self._built is not None and not self._learns:  # built once and never rebuilt: no knowledge to hand it
            return self.policy(self._built[0], inp.policy_state)
        s = self.settings
        sizing = Sizing(
            s.limits,
            inp.model,
            measured_restart_s=restart_s if measured else None,
            adequate_workers=s.adequate_workers,
            partitions=len(inp.reading.partitions) or s.partitions,
        )
        return self.policy(sizing, inp.policy_state)

    def _hold(self, workers: int, why: str, state: dict | None, restart_s: float, restart_source: str) -> ControlStep:
        if state is None:
            state = self._built[1].state() if self._built is not None else {}
        decision = Decision(workers, f"{self.settings.policy}/hold", f"hold at {workers}: {why}")
        return ControlStep(decision, None, restart_s, restart_source, held=why, state=dict(state))
