"""The controller's inputs and outputs in Dagster: one pipeline's control tick.

``PipelineControl`` gathers what ``control.Controller`` needs from where it
lives (the previous decision and its policy state from the
``gpu_allocation`` asset's latest materialization, the fitted throughput
model from ``throughput_model``'s, the fitted forecaster from the metrics
history, what runs from the launcher, rescale and refit runs in flight
from the run storage), calls it, and turns the step into Dagster events:

* every decision, hold or change, is a ``gpu_allocation`` materialization
  with its reason, the policy's state and the observation it saw;
* a change is a ``RunRequest`` of ``<pipeline>_rescale`` with the target
  in its ``RescaleConfig``, one at a time; a failed rescale is retried with a growing delay,
  and the decision says so;
* a forecast older than the refit cadence is a ``RunRequest`` of
  ``<pipeline>_refit``.

The metrics sensor runs a tick on every reading; the ``gpu_allocation``
asset runs ``decide`` when an operator materializes it.
"""

import time
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetMaterialization,
    DagsterRunStatus,
    MetadataValue,
    RunRequest,
    RunsFilter,
)

from kale_dagster.control.controller import (
    ControlInput,
    Controller,
    ControlStep,
    StreamReading,
    recent_forecast_error,
    recent_forecast_ratio,
)
from kale_dagster.control.tick import ControlCursor, TickOutcome
from kale_dagster.definitions.decision import (
    ADVISED,
    LAG_CHECK,
    NO_ACTION,
    ControlDecision,
    RescaleConfig,
    allocation_metadata,
    lag_within_slo,
    latest_metadata,
    what_it_says,
)
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.forecast.base import Forecast
from kale_dagster.launchers.base import LauncherStatus
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.model.types import Observation

IN_FLIGHT = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
#: A failed rescale is retried after this many wall seconds, doubled per consecutive failure, at most MAX_RETRY_S.
RETRY_S, MAX_RETRY_S = 30.0, 600.0

#: A throughput model materialized by hand is seen within this many wall seconds (a refit's at once).
MODEL_REREAD_S = 300.0


class PipelineControl:
    """Runs one pipeline's controller against Dagster, the metrics history and the launcher."""

    def __init__(self, p: OnlineTrainingPipeline, rescale_job: str | None, refit_job: str):
        self.p = p
        self.rescale_job, self.refit_job = rescale_job, refit_job
        self.allocation_key = AssetKey(p.key("gpu_allocation"))
        self.controller = Controller(p.control_settings())
        self._forecaster: tuple[float, Any, int] | None = None  # (fitted_at, model, steps): loaded once per fit
        self._last_forecast: Forecast | None = None
        self._arrivals: pd.DataFrame | None = None  # the arrival history since the fit, read on from its end
        self._model: tuple[float | None, float, tuple[ThroughputModel, str]] | None = None  # (fit, read at, model)
        self._history = None

    @property
    def history(self):
        """The pipeline's metrics history, opened once per process (the code server keeps it across ticks)."""
        if self._history is None:
            self._history = self.p.history()
        return self._history

    # --- inputs -----------------------------------------------------------------------

    def launcher_status(self) -> tuple[LauncherStatus | None, str]:
        try:
            return self.p.launcher_instance.status(), ""
        except Exception as exc:  # unreachable service, API error: the controller holds and says why
            return None, f"{self.p.launcher.describe()}: {type(exc).__name__}: {exc}"

    def throughput_model(self, instance) -> tuple[ThroughputModel, str]:
        """The latest fitted F(w) (``throughput_model``'s materialization), or the prior.  Read again when the
        forecaster was refitted (the refit job fits both) and at least every ``MODEL_REREAD_S``, for a model
        materialized by hand: reading the event log at every tick costs more than the rest of the decision."""
        now = time.monotonic()
        fitted_at = self._forecaster[0] if self._forecaster else None
        if self._model is None or self._model[0] != fitted_at or now - self._model[1] >= MODEL_REREAD_S:
            meta = latest_metadata(instance, AssetKey(self.p.key("throughput_model")))
            if meta.get("model"):
                model = ThroughputModel.from_dict(meta["model"]), str(meta.get("source", "fitted"))
            else:
                model = self.p.throughput_prior, "prior"
            self._model = (fitted_at, now, model)
        return self._model[2]

    def _load_latest_fit(self) -> None:
        """The latest fitted forecaster, loaded once per fit (a new one drops the arrivals read for the last)."""
        latest = self.history.latest_forecaster(self.p.name, after=self._forecaster[0] if self._forecaster else None)
        if latest is not None:
            fitted_at, saved = latest
            self._forecaster = (fitted_at, saved["model"], saved["steps"])
            self._arrivals = None

    def forecast(self, arrivals: pd.DataFrame) -> Forecast | None:
        """The latest fit's forecast, re-anchored on ``arrivals``, the rates measured since it was fitted."""
        if self._forecaster is None:
            return None
        _, model, steps = self._forecaster
        try:
            self._last_forecast = model.predict(steps, history=arrivals)
        except Exception:  # a history the fit cannot take: Kale falls back to measured rates ("no forecast")
            self._last_forecast = None
        return self._last_forecast

    def _arrival_history(self) -> pd.DataFrame:
        """The arrival history, read whole once per fit and then only the readings since, as a tick must not read
        days of history (a backfill of older readings is seen from the next fit on, as the fit itself sees it)."""
        if self._arrivals is None or self._arrivals.empty:
            self._arrivals = self.history.arrival_history(self.p.name)
        else:
            last = self._arrivals["timestamp"].iloc[-1]
            newer = self.history.arrival_history(self.p.name, start=last.timestamp())
            newer = newer[newer["timestamp"] > last]
            if not newer.empty:
                self._arrivals = pd.concat([self._arrivals, newer], ignore_index=True)
        return self._arrivals

    def _runs(self, instance, job: str | None, statuses=None, limit: int = 1) -> list:
        if job is None:
            return []
        return list(instance.get_run_records(RunsFilter(job_name=job, statuses=statuses), limit=limit))

    def _rescale_in_flight(self, instance) -> tuple[bool, int | None, str]:
        """Whether a rescale run is under way, the target it was requested with (None: run by hand), and what was
        done about one that cannot be: a run in flight longer than a rescale can take lost its process, and left
        alone it would hold back every later rescale."""
        limit, now, live, target, stale = self.p.launcher.rescale_timeout_s, time.time(), False, None, ""
        for record in self._runs(instance, self.rescale_job, IN_FLIGHT, limit=10):
            age = now - (record.start_time or record.create_timestamp.timestamp())
            if age <= limit:
                live = True
                target = RescaleConfig.of(record.dagster_run.run_config).workers
                continue
            run = record.dagster_run
            stale = (
                f"rescale run {run.run_id[:8]} was in flight for {age:.0f} s, longer than a rescale through "
                f"{self.p.launcher.describe()} takes ({limit:.0f} s): its process is gone; marked failed"
            )
            instance.report_run_failed(run, stale)
        return live, target, stale

    # --- the step ------------------------------------------------------------------------

    @property
    def rate_window_s(self) -> float:
        return self.controller.settings.rate_window_s

    def decide(self, instance, reading: StreamReading, cursor: ControlCursor = ControlCursor()) -> ControlDecision:
        """One decision from everything the pipeline knows now; reads only (``record`` writes what it measured)."""
        p = self.p
        # The policy's memory and the workers last known run with the sensor's cursor; the latest recorded
        # decision stands in where there is none (a decision made by hand, a sensor's first tick after an upgrade).
        previous = (
            {"policy_state": cursor.policy_state, "running_workers": cursor.running_workers}
            if cursor.policy_state is not None
            else latest_metadata(instance, self.allocation_key)
        )
        status, launcher_error = self.launcher_status()
        self._load_latest_fit()  # first: a new fit means a new throughput model too
        arrivals = self._arrival_history()  # read once: the forecast is re-anchored on it, its error scored on it
        forecast = self.forecast(arrivals)
        model, model_source = self.throughput_model(instance)
        error, ratio = self._forecast_scores(arrivals, cursor, reading.time)
        in_flight, in_flight_target, stale = self._rescale_in_flight(instance)
        # Only a rescale run under way takes a retarget (a local crash-restart has none); its target is the
        # allocation while its restart has not begun: what a burst is judged against, and a retarget must exceed.
        retargetable = in_flight and status is not None and self.p.launcher_instance.supports_retarget
        step = self.controller.step(
            ControlInput(
                reading,
                status,
                model,
                forecast=forecast,
                forecast_error=error,
                forecast_ratio=ratio,
                policy_state=previous.get("policy_state"),
                rescale_in_flight=in_flight,
                rescale_target=in_flight_target,
                retargetable=retargetable,
                time_scale=p.clock.time_scale,
                launcher_error=launcher_error,
                last_workers=previous.get("running_workers"),
            )
        )
        note = ""
        if step.rescale_to is not None:
            wait, note = self._retry_wait(instance)
            if wait:
                step = replace(step, rescale_to=None)
        running = status.workers if status is not None else previous.get("running_workers", p.limits.min_workers)
        if step.rescale_to is not None and step.retarget:
            action = f"retarget of the rescale under way to {step.rescale_to}"
        elif step.rescale_to is not None:
            action = f"rescale to {step.rescale_to} requested"
        elif p.advisory and step.decision.workers != (status.workers if status else None):
            action = ADVISED
        else:
            action = note or NO_ACTION
        return ControlDecision(step, reading.time, status, int(running), model_source, forecast, error, action, stale)

    def record(self, decision: ControlDecision) -> None:
        """Write what the decision measured: the workers' throughput, where it shows their capacity.

        F(w) is what the workers deliver while they never wait for data (the paper's profiling); a group that
        waited delivered the arrival rate, not its capacity.  A backlog is no sign of saturation: offsets
        committed at checkpoints keep one while the workers idle.  Workers that report nothing (a group Kale
        observes, a scale target's, a command hook's) show their capacity only while they fall behind."""
        status = decision.status
        if status is None or status.rescaling:
            return
        if self.p.launcher.runs_kale_trainer:  # its workers report what they trained, and whether they waited
            rate = self.p.clock.rate(status.samples_per_s) if status.samples_per_s and status.saturated else None
        else:
            rate = falling_behind_rate(decision.step.observation, self.rate_window_s)
        if rate:
            self.history.append_throughput(self.p.name, decision.time, status.workers, rate, emulated=status.emulated)

    def tick(self, instance, reading: StreamReading, cursor: ControlCursor) -> TickOutcome:
        """``decide`` and ``record``, then the events and run requests of the sensor tick."""
        decision = self.decide(instance, reading, cursor)
        self.record(decision)
        step = decision.step
        requests = []
        if step.rescale_to is not None and step.retarget:  # no run: the launcher passes it to the restart under way
            decision = self._retarget(decision)
        elif step.rescale_to is not None:
            requests.append(self._rescale_request(step, reading.time))
        refit = self._refit_request(instance, reading.time)
        if refit is not None:
            requests.append(refit)
        predictions = self._remember_prediction(cursor, reading.time)
        # The lag_within_slo check is evaluated at every reading, not only when someone launches <pipeline>_decide.
        passed, severity, verdict = lag_within_slo(reading.time_lag_s, self.p.limits.slo_s, reading.time_lag_complete)
        # Every decision goes to the metrics history (the sensor writes it); the event log gets those that change
        # something and one every record_every_minutes, so that it grows by a bounded amount a day.
        said = what_it_says(decision, passed)
        due = cursor.recorded_at is None or reading.time - cursor.recorded_at >= self.p.record_every_minutes * 60
        recorded_at, recorded, events = cursor.recorded_at, cursor.recorded, []
        if due or said != cursor.recorded or step.rescale_to is not None:
            # No plot: a tick draws nothing (a drawing costs more CPU than the rest of the tick); the
            # gpu_allocation asset draws one when it is materialized.
            metadata = allocation_metadata(self.p, decision)
            events = [
                AssetCheckEvaluation(
                    asset_key=self.allocation_key,
                    check_name=LAG_CHECK,
                    passed=passed,
                    severity=severity,
                    metadata=verdict,
                ),
                AssetMaterialization(self.allocation_key, metadata=metadata),  # last: the decision
            ]
            recorded_at, recorded = reading.time, said
        quality = decision.status.model_metric if decision.status is not None else None
        latest = {
            "at": time.time(),
            "backlog": reading.backlog,
            "time_lag_s": reading.time_lag_s,
            "arrival_rate": reading.arrival_rate,
            "running_workers": decision.running_workers,
            "desired_workers": step.decision.workers,
        }
        kept = ControlCursor(
            predictions,
            step.policy_state,
            decision.running_workers,
            recorded_at,
            recorded,
            *cursor.counted(step),
            latest=latest,
        )
        return TickOutcome(step, decision.running_workers, kept, events, requests, quality)

    # --- helpers -------------------------------------------------------------------------

    def _rescale_request(self, step: ControlStep, now: float) -> RunRequest:
        # The wall time of the decision, so a run's start and its rescale's end say how long acting took.
        workers = step.rescale_to
        config = RescaleConfig(workers=workers, reason=step.decision.reason[:200], decided_at=round(time.time(), 3))
        return RunRequest(
            job_name=self.rescale_job,
            run_key=f"{self.p.name}-rescale-{now:.0f}-{workers}",
            run_config=config.as_run_config(self.p.name),
            tags={
                "kale/pipeline": self.p.name,
                # Dagster's run monitoring, where enabled, fails it past this too.
                "dagster/max_runtime": str(int(self.p.launcher.rescale_timeout_s)),
            },
        )

    def _retarget(self, decision: ControlDecision) -> ControlDecision:
        """Point the restart under way at the decision's larger group, through the pipeline's launcher: it reaches
        that restart from this process (the local trainer service's API, the workload's spec, an annotation on
        the Job being formed).  The decision's action says when it was not taken."""
        workers = decision.step.rescale_to
        assert workers is not None
        try:
            taken = self.p.launcher_instance.retarget(workers, reason=decision.step.decision.reason[:200])
        except RuntimeError as exc:  # the launcher cannot be reached: the restart runs on as it was asked
            return replace(decision, action=f"retarget to {workers} failed: {exc}"[:500])
        if taken:
            return decision
        return replace(decision, action=f"retarget to {workers} not needed: the restart aims at as many, or has ended")

    def _retry_wait(self, instance) -> tuple[bool, str]:
        """After failed rescales, wait RETRY_S x 2^(failures - 1) from the last failure."""
        runs = self._runs(instance, self.rescale_job, limit=10)
        failures = 0
        for record in runs:
            if record.dagster_run.status != DagsterRunStatus.FAILURE:
                break
            failures += 1
        if not failures:
            return False, ""
        delay = min(RETRY_S * 2 ** (failures - 1), MAX_RETRY_S)
        ended = runs[0].end_time or runs[0].create_timestamp.timestamp()
        remaining = ended + delay - time.time()
        if remaining > 0:
            return (
                True,
                f"the last {failures} rescale run(s) failed (see run {runs[0].dagster_run.run_id[:8]}); retrying in "
                f"{remaining:.0f} s",
            )
        return False, f"retrying after {failures} failed rescale run(s)"

    def _refit_request(self, instance, now: float) -> RunRequest | None:
        # When the forecaster in use was fitted (as the refit saved it), not the event log's: a tick reads no
        # asset's history it can do without.
        fitted_at = self._forecaster[0] if self._forecaster else None
        refit_s = self.p.forecast_refit_s
        if fitted_at is not None and now - fitted_at < refit_s:
            return None
        if self._runs(instance, self.refit_job, IN_FLIGHT):
            return None
        return RunRequest(
            job_name=self.refit_job,
            run_key=f"{self.p.name}-refit-{int(now // refit_s)}",
            tags={"kale/pipeline": self.p.name},
        )

    def _remember_prediction(self, cursor: ControlCursor, now: float) -> tuple[tuple[float, float], ...]:
        settings = self.controller.settings
        window = max(settings.error_window_s, settings.ratio_window_s)
        keep = [pair for pair in cursor.predictions if now - pair[0] <= window]
        if self._last_forecast is not None and len(self._last_forecast):
            keep.append((float(self._last_forecast.start), float(self._last_forecast.point[0])))
        return tuple(keep)

    def _forecast_scores(
        self, arrivals: pd.DataFrame, cursor: ControlCursor, now: float
    ) -> tuple[float | None, float | None]:
        """The forecast's recent error (sMAPE) and the arrivals over what it predicted, each over its window."""
        if not cursor.predictions or arrivals.empty:
            return None, None
        times = np.array([t for t, _ in cursor.predictions])
        measured_at = (arrivals["timestamp"] - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)
        # The rate measured at the first reading at or after each predicted instant.
        idx = np.searchsorted(measured_at.to_numpy(), times)
        actual = np.where(idx < len(arrivals), arrivals["rate"].to_numpy()[np.minimum(idx, len(arrivals) - 1)], np.nan)
        predicted, settings = [v for _, v in cursor.predictions], self.controller.settings
        return (
            recent_forecast_error(times, predicted, actual, now, settings.error_window_s),
            recent_forecast_ratio(times, predicted, actual, now, settings.ratio_window_s),
        )

    def plot(self, step: ControlStep, now: float, plot_dir: str) -> MetadataValue:
        """The last day's readings, workers and decisions, and the plan from now, drawn to a file in ``plot_dir``."""
        from kale_dagster.definitions.plots import plot_allocation, plot_file, plot_metadata

        recent = self.history.stream(self.p.name, start=now - 86_400)  # the last day: what ran and what was decided
        plan_times = pd.to_datetime(
            now + step.decision.plan_step_s * np.arange(len(step.decision.plan)), unit="s", utc=True
        )
        png = plot_allocation(
            recent,
            plan_times,
            list(step.decision.plan),
            self.p.limits.slo_minutes,
            plot_file(plot_dir, self.p.name, "allocation", now),
            title=f"{self.p.name}: {step.decision.workers} workers ({step.decision.policy})",
        )
        return plot_metadata(png)


#: How far below the arrivals a group's consumption must stay over the rate window to show its capacity.
FALLING_BEHIND = 0.95
#: The backlog the window must have begun with, in shares of what the group consumed over it: less, and part of the
#: window may have found the group caught up, waiting for data (a burst that began inside it).
BEGUN_BEHIND = 0.1


def falling_behind_rate(obs: Observation | None, window_s: float) -> float | None:
    """A group that consumed measurably less than arrived over the rate window (``window_s``), and was behind
    from its start, consumed all it could: that consumption is its throughput at its size.  Anything else
    (keeping up, draining a backlog that may have run dry, a burst that began inside the window) tells only a
    lower bound, and is not recorded."""
    if obs is None or obs.restarting or obs.backlog <= 0 or obs.arrival_rate <= 0:
        return None
    consumed = obs.consumption_rate
    if not 0 < consumed < FALLING_BEHIND * obs.arrival_rate:
        return None
    begun_with = obs.backlog - (obs.arrival_rate - consumed) * window_s  # the backlog when the window began
    return consumed if begun_with >= BEGUN_BEHIND * consumed * window_s else None
