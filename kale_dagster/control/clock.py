"""Pipeline time: one time scale for a compressed run, and identity for a real one.

A demo or a benchmark replays a day of traffic in minutes.  Rather than
scale every knob, the pipeline runs on its own clock: ``time_scale``
pipeline seconds pass per wall second from the run's start.  Every
figure the controller, the policies, the forecaster and the metrics history
see is in pipeline units (times, durations, rates per pipeline second), so
a 20-minute SLO, a 10-minute plan step, HPA's 300-second window and a
daily seasonality mean what they say at any speed.  Only the I/O boundary
converts: Kafka record timestamps and rates, the launcher's measured
restarts, the sensor's wall-clock interval.

At ``time_scale == 1`` (production) every conversion is the identity.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kale_dagster.errors import KaleConfigError


@dataclass(frozen=True)
class PipelineClock:
    """``time_scale`` pipeline seconds per wall second, from ``wall_start`` (epoch seconds),
    when pipeline time reads ``pipeline_start`` (default: the same instant)."""

    time_scale: float = 1.0
    wall_start: float | None = None
    pipeline_start: float | None = None

    def __post_init__(self):
        if not 1.0 <= self.time_scale <= 1000.0:
            raise KaleConfigError(
                "time_scale", f"must be in [1, 1000] pipeline seconds per wall second, got {self.time_scale}"
            )
        if self.time_scale != 1.0 and self.wall_start is None:
            raise KaleConfigError(
                "wall_start", "a compressed clock needs the wall time its run started (epoch seconds)"
            )

    @property
    def _origin(self) -> tuple[float, float]:
        wall = self.wall_start or 0.0
        return wall, self.pipeline_start if self.pipeline_start is not None else wall

    def now(self) -> float:
        return self.at(time.time())

    def at(self, wall_time: float) -> float:
        """The pipeline instant of a wall instant (epoch seconds)."""
        wall, pipe = self._origin
        return pipe + (wall_time - wall) * self.time_scale

    def wall_at(self, pipeline_time: float) -> float:
        wall, pipe = self._origin
        return wall + (pipeline_time - pipe) / self.time_scale

    def duration(self, wall_seconds: float) -> float:
        """Pipeline seconds in ``wall_seconds`` (a lag, a restart)."""
        return wall_seconds * self.time_scale

    def wall_duration(self, pipeline_seconds: float) -> float:
        return pipeline_seconds / self.time_scale

    def rate(self, per_wall_second: float) -> float:
        """A rate per wall second as a rate per pipeline second."""
        return per_wall_second / self.time_scale
