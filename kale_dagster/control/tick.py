"""The seam between the metrics sensor and a pipeline's control: what a tick hands over, and what comes back.

The sensor (``sensors/stream_metrics.py``) reads the stream and records
it; a ``Decider`` (``definitions.control.PipelineControl``) decides on the
reading.  The sensor knows only this module: the protocol, the cursor the
decider keeps between ticks, and the typed outcome, so no import runs from
the sensor up to the Dagster wiring, and nothing reaches into events or
metadata.  One function, ``reading_from``, turns recorded stream metrics
into the controller's reading, for the sensor and the assets alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pandas as pd

from kale_dagster.control.controller import ControlStep, StreamReading
from kale_dagster.model.types import PartitionOffsets


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _counts(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value.values()
    )


#: The latest reading as the cursor keeps it: its wall time, the stream's figures, the workers running and wanted.
LATEST_FIGURES = ("at", "backlog", "time_lag_s", "arrival_rate", "running_workers", "desired_workers")


@dataclass(frozen=True)
class ControlCursor:
    """What control ticks hand on, as HPA's controller keeps each autoscaler's state across reconciles: the
    one-step predictions made (pipeline time, predicted rate), for the forecast's recent error; the policy's
    memory and the workers last known to run after the latest decision; when a decision was last recorded on
    ``gpu_allocation``, with what it said (a decision that changes nothing is recorded at most every
    ``record_every_minutes``); the decisions and requested rescales so far, by ``ControlStep.outcome``, for
    the Prometheus counters (the event log does not keep every decision); and the latest reading's figures
    (``LATEST_FIGURES``, ``at`` its wall time), so ``kale status`` and the gauges are as fresh as the last tick."""

    predictions: tuple[tuple[float, float], ...] = ()
    policy_state: dict | None = field(default=None, compare=False)
    running_workers: int | None = None
    recorded_at: float | None = None
    recorded: str = ""
    decisions: dict[str, int] = field(default_factory=dict, compare=False)
    rescales: dict[str, int] = field(default_factory=dict, compare=False)
    latest: dict[str, float | None] = field(default_factory=dict, compare=False)

    def counted(self, step: ControlStep) -> tuple[dict[str, int], dict[str, int]]:
        """The counts with ``step`` added."""
        decisions, rescales = dict(self.decisions), dict(self.rescales)
        decisions[step.outcome] = decisions.get(step.outcome, 0) + 1
        if step.rescale_to is not None:
            rescales[step.outcome] = rescales.get(step.outcome, 0) + 1
        return decisions, rescales

    def to_dict(self) -> dict:
        return {
            "predictions": [list(p) for p in self.predictions],
            "policy_state": self.policy_state,
            "running_workers": self.running_workers,
            "recorded_at": self.recorded_at,
            "recorded": self.recorded,
            "decisions": dict(self.decisions),
            "rescales": dict(self.rescales),
            "latest": dict(self.latest),
        }

    @classmethod
    def from_dict(cls, data: Any) -> ControlCursor:
        """The cursor a previous tick stored; a fresh one for anything of another shape (another version's)."""
        if not isinstance(data, dict) or not set(data) <= set(cls().to_dict()):
            return cls()
        predictions = data.get("predictions", [])
        state, running = data.get("policy_state"), data.get("running_workers")
        recorded_at, recorded = data.get("recorded_at"), data.get("recorded", "")
        decisions, rescales = data.get("decisions", {}), data.get("rescales", {})
        latest = data.get("latest", {})
        pairs_ok = isinstance(predictions, list) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(_finite(v) for v in p) for p in predictions
        )
        if (
            not pairs_ok
            or not (recorded_at is None or _finite(recorded_at))
            or not (state is None or isinstance(state, dict))
            or not (running is None or (isinstance(running, int) and not isinstance(running, bool) and running >= 0))
            or not isinstance(recorded, str)
            or not all(_counts(c) for c in (decisions, rescales))
            or not (
                isinstance(latest, dict)
                and all(k in LATEST_FIGURES and (v is None or _finite(v)) for k, v in latest.items())
            )
        ):
            return cls()
        return cls(
            tuple((float(t), float(v)) for t, v in predictions),
            state,
            running,
            recorded_at,
            recorded,
            dict(decisions),
            dict(rescales),
            dict(latest),
        )


@dataclass(frozen=True)
class TickOutcome:
    """What a decider made of one reading: the step, the workers that run (as the launcher reported, or as
    last known), and the Dagster events and run requests to emit."""

    step: ControlStep
    running_workers: int
    cursor: ControlCursor
    events: Sequence[Any] = field(default=())
    run_requests: Sequence[Any] = field(default=())
    model_metric: tuple[str, float] | None = None  # the trainer's progressive-validation metric, as reported


class Decider(Protocol):
    """A pipeline's control, as the metrics sensor uses it."""

    @property
    def rate_window_s(self) -> float:
        """Rates are averaged over this window (pipeline seconds)."""
        ...

    def tick(self, instance: Any, reading: StreamReading, cursor: ControlCursor) -> TickOutcome:
        """Decide on ``reading``: the step, its events and run requests, and the cursor for the next tick."""
        ...


def reading_from(
    recorded: pd.DataFrame,
    rate_window_s: float,
    partitions: Sequence[PartitionOffsets] = (),
    time_lag_complete: bool = True,
) -> StreamReading:
    """The controller's reading from recorded stream metrics (``MetricsHistory.stream``), oldest first; the
    last row is now.  Rates are averaged over the rate window; the latest interval's arrival rate is the last
    row's.  Without an arrival rate in the last row (a first snapshot) there are no rates: no decision is
    made on a rate that was not measured now.  ``time_lag_complete`` is the snapshot's (the history keeps
    the time lag it read, not whether every lagging partition's oldest record had a usable timestamp)."""
    row = recorded.iloc[-1]
    now = float(row["ts"])
    latest = float(row["arrival_rate"]) if pd.notna(row["arrival_rate"]) else None
    arrival = consumption = None
    if latest is not None:
        window = recorded[recorded["ts"] >= now - rate_window_s]
        arrival = float(window["arrival_rate"].dropna().mean())
        consumed = window["consumption_rate"].dropna()
        consumption = float(consumed.mean()) if len(consumed) else 0.0
    return StreamReading(
        now,
        arrival,
        consumption,
        float(row["sample_lag"] or 0),
        float(row["time_lag_s"] or 0.0),
        tuple(partitions),
        latest_arrival_rate=latest,
        time_lag_complete=time_lag_complete,
    )
