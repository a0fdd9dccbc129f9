"""The forecaster interface and the forecast it returns.

A forecaster is fitted on a history of arrival rates and predicts a horizon
as a point forecast with a lower and upper band.  Anything with ``fit`` and
``predict`` of these shapes plugs in (see :class:`Forecaster`); register it
by name in ``kale_dagster.forecast.FORECASTERS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Forecast:
    """Arrival-rate forecast (samples/s) at fixed steps from ``start`` (epoch seconds).

    ``interval_width`` is the central probability covered by [lower, upper];
    ``fallback`` says why a simpler model answered instead of the configured
    one (empty when it did not).  ``outlook`` continues ``point`` past the
    horizon at the same step with the model's seasonal expectation, no band
    (empty when the model has none): how long a level will last, not a plan.
    """

    start: float
    step_s: float
    point: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    model: str
    interval_width: float = 0.8
    fallback: str = ""
    fit_seconds: float = 0.0
    extras: dict = field(default_factory=dict, compare=False)
    outlook: np.ndarray = field(default_factory=lambda: np.zeros(0), compare=False)

    def __post_init__(self):
        for name in ("point", "lower", "upper", "outlook"):
            values = np.clip(np.asarray(getattr(self, name), dtype=float), 0.0, None)
            object.__setattr__(self, name, values)
        if not (len(self.point) == len(self.lower) == len(self.upper)):
            raise ValueError("point, lower and upper must have the same length")

    def __len__(self) -> int:
        return len(self.point)

    @property
    def times(self) -> np.ndarray:
        return self.start + self.step_s * np.arange(len(self.point))

    def level(self, quantile: float | None) -> np.ndarray:
        """The forecast at a quantile, reading the band as a normal interval; None means the upper band."""
        if quantile is None:
            return self.upper
        if quantile == 0.5:  # the middle of a symmetric band: the point forecast itself
            return self.point
        z_band = NormalDist().inv_cdf(0.5 + self.interval_width / 2)
        sigma = np.maximum(self.upper - self.point, 0.0) / z_band
        return np.clip(self.point + NormalDist().inv_cdf(quantile) * sigma, 0.0, None)

    def outlook_level(self, quantile: float | None) -> np.ndarray:
        """The outlook at a quantile: scaled by the band's relative width at the horizon's last step."""
        if len(self.outlook) == 0 or len(self.point) == 0:
            return self.outlook
        last = float(self.point[-1])
        ratio = float(self.level(quantile)[-1]) / last if last > 0 else 1.0
        return self.outlook * ratio

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "timestamp": pd.to_datetime(self.times, unit="s", utc=True),
                "point": self.point,
                "lower": self.lower,
                "upper": self.upper,
            }
        )


@runtime_checkable
class Forecaster(Protocol):
    """Fit on a history, predict a horizon.

    ``history`` has a UTC ``timestamp`` column and a ``rate`` column
    (samples/s), validated and regular (see ``kale_dagster.forecast.history``).
    ``predict(steps)`` forecasts ``steps`` steps of the fitted history's
    spacing from its end; ``predict(steps, history=newer)`` from the end of
    a newer history that starts where the fitted one did (observations that
    arrived since the fit), refitting only what the model must.
    """

    name: str

    def fit(self, history: pd.DataFrame) -> Forecaster: ...

    def predict(self, horizon_steps: int, history: pd.DataFrame | None = None) -> Forecast: ...
