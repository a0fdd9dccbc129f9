"""Cheap baselines: seasonal naive (same time a day or a week earlier) and EWMA level.

Both are honest yardsticks for the default forecaster and serve as its
short-history fallback.  Bands come from the model's own past errors at
each horizon (empirical quantiles), not from an assumed distribution.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kale_dagster.errors import InputDataError
from kale_dagster.forecast.base import Forecast
from kale_dagster.forecast.history import prepare_history

DAY_S = 86_400.0
WEEK_S = 7 * DAY_S


def window_means(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The mean of ``values[lo:hi]`` for each pair of bounds, NaN ignored (NaN where a window holds none)."""
    seen = np.isfinite(values)
    total = np.concatenate([[0.0], np.cumsum(np.where(seen, values, 0.0))])
    count = np.concatenate([[0], np.cumsum(seen)])
    n = count[hi] - count[lo]
    return np.where(n > 0, (total[hi] - total[lo]) / np.maximum(n, 1), np.nan)


def row_nanmedian(values: np.ndarray) -> np.ndarray:
    """``np.nanmedian(values, axis=1)`` for rows with at least one value, by one sort (numpy's goes row by row)."""
    ordered = np.sort(values, axis=1)  # NaN sorts last
    n = np.count_nonzero(~np.isnan(values), axis=1)
    rows = np.arange(len(values))
    return (ordered[rows, (n - 1) // 2] + ordered[rows, n // 2]) / 2


def column_nanquantile(errors: np.ndarray, q: float) -> np.ndarray:
    """``np.nanquantile(errors, q, axis=0)``; columns without NaN in one vectorized call (numpy's goes column by
    column)."""
    out = np.empty(errors.shape[1])
    full = ~np.isnan(errors).any(axis=0)
    out[full] = np.quantile(errors[:, full], q, axis=0)
    if not full.all():
        out[~full] = np.nanquantile(errors[:, ~full], q, axis=0)
    return out


def empirical_band(errors: np.ndarray, width: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-horizon (lower, upper) quantiles of log errors (rows: origins, columns: horizon steps)."""
    lo_q, hi_q = (1 - width) / 2, (1 + width) / 2
    if errors.size == 0 or np.all(np.isnan(errors)):
        zeros = np.zeros(errors.shape[1] if errors.ndim == 2 else 0)
        return zeros, zeros
    # Steps no origin reached yet (short history, long horizon) get a zero band.
    seen = ~np.all(np.isnan(errors), axis=0)
    lower, upper = np.zeros(errors.shape[1]), np.zeros(errors.shape[1])
    lower[seen] = column_nanquantile(errors[:, seen], lo_q)
    upper[seen] = column_nanquantile(errors[:, seen], hi_q)
    return lower, upper


def horizon_errors(log_actual: np.ndarray, log_pred_fn, origins: np.ndarray, horizon: int) -> np.ndarray:
    """Matrix of log errors actual - prediction for each origin (last observed index) and step 1..horizon."""
    errs = np.full((len(origins), horizon), np.nan)
    for k, last in enumerate(origins):
        pred = log_pred_fn(last)
        end = min(last + 1 + horizon, len(log_actual))
        errs[k, : end - last - 1] = log_actual[last + 1 : end] - pred[: end - last - 1]
    return errs


class _FittedSeries:
    """Shared state: the clean history as arrays on a regular grid, in log space.

    Models work on log(rate + offset) with the offset a thousandth of the
    typical rate, fixed at fit time: multiplicative like plain log, defined
    at zero, and the same whatever unit the rates come in (log1p would bend
    a series of small rates, e.g. samples per second of a slow topic).
    """

    _offset = None

    def _set_history(self, history: pd.DataFrame, refit: bool = True) -> None:
        """Take a clean history; without ``refit``, on the fitted grid (same start and step).

        A newer history may start later than the fitted one (retention
        trimmed its head) or earlier: either way it is put on the fitted
        grid, so positions keep meaning the same instants.
        """
        if refit or self._offset is None:
            clean = prepare_history(history)
            self.step_s = (
                float((clean["timestamp"].iloc[1] - clean["timestamp"].iloc[0]).total_seconds())
                if len(clean) > 1
                else 60.0
            )
            self._origin = clean["timestamp"].iloc[0]
        else:
            clean = prepare_history(history, step_s=self.step_s)
            if clean["timestamp"].iloc[0] != self._origin:  # on another grid, or trimmed: put it on the fitted one
                step = pd.Timedelta(seconds=self.step_s)
                grid = pd.date_range(self._origin, clean["timestamp"].iloc[-1], freq=step)
                rates = clean.set_index("timestamp")["rate"].reindex(grid, method="nearest", tolerance=step / 2)
                clean = pd.DataFrame({"timestamp": grid, "rate": rates.to_numpy()})
        self.end = clean["timestamp"].iloc[-1].timestamp()
        rate = clean["rate"].to_numpy()
        if refit or self._offset is None:
            positive = rate[np.isfinite(rate) & (rate > 0)]
            self._offset = 1e-3 * float(np.median(positive)) if len(positive) else 1e-6
        self.log_rate = self.to_log(rate)
        self.history = clean

    def to_log(self, rate):
        return np.log(np.asarray(rate, dtype=float) + self._offset)

    def from_log(self, log_values):
        return np.maximum(np.exp(log_values) - self._offset, 0.0)

    def _forecast(
        self, log_point: np.ndarray, lower_err, upper_err, model: str, width: float, fallback: str = ""
    ) -> Forecast:
        h = len(log_point)
        point = self.from_log(log_point)
        lower = self.from_log(log_point + lower_err[:h]) if len(lower_err) >= h else point
        upper = self.from_log(log_point + upper_err[:h]) if len(upper_err) >= h else point
        return Forecast(
            start=self.end + self.step_s,
            step_s=self.step_s,
            point=point,
            lower=np.minimum(lower, point),
            upper=np.maximum(upper, point),
            model=model,
            interval_width=width,
            fallback=fallback,
        )


class SeasonalNaiveForecaster(_FittedSeries):
    """Repeat the value one season earlier (a day or a week)."""

    def __init__(self, season_s: float = DAY_S, interval_width: float = 0.8, band_origins: int = 200):
        if season_s not in (DAY_S, WEEK_S):
            raise InputDataError("season_s must be one day (86400) or one week (604800)")
        self.season_s = season_s
        self.interval_width = interval_width
        self.band_origins = band_origins
        self.name = "seasonal-naive-" + ("day" if season_s == DAY_S else "week")

    def _predict_log(self, log_rate: np.ndarray, last: int, horizon: int) -> np.ndarray:
        season = int(round(self.season_s / self.step_s))
        out = np.empty(horizon)
        for h in range(1, horizon + 1):
            src = last + h - season
            while src > last:  # beyond one season ahead: repeat the forecast
                src -= season
            out[h - 1] = log_rate[src] if src >= 0 else np.nan
        return out

    def fit(self, history: pd.DataFrame) -> SeasonalNaiveForecaster:
        self._set_history(history)
        season = int(round(self.season_s / self.step_s))
        if len(self.log_rate) <= season:
            raise InputDataError(
                f"{self.name} needs more than one season of history ({self.season_s / 3600:.0f} h); got "
                f"{len(self.log_rate) * self.step_s / 3600:.1f} h"
            )
        return self

    def predict(self, horizon_steps: int, history: pd.DataFrame | None = None) -> Forecast:
        if history is not None:
            self.fit(history)
        season = int(round(self.season_s / self.step_s))
        last = len(self.log_rate) - 1
        origins = np.arange(max(season, last - self.band_origins - horizon_steps), last - horizon_steps + 1)
        errs = horizon_errors(
            self.log_rate, lambda last: self._predict_log(self.log_rate, last, horizon_steps), origins, horizon_steps
        )
        lo, hi = empirical_band(errs, self.interval_width)
        log_point = np.nan_to_num(self._predict_log(self.log_rate, last, horizon_steps), nan=self.log_rate[last])
        return self._forecast(log_point, lo, hi, self.name, self.interval_width)


class EwmaForecaster(_FittedSeries):
    """Flat forecast at an exponentially weighted recent level (the reactive baseline)."""

    name = "ewma"

    def __init__(self, halflife_s: float = 1800.0, interval_width: float = 0.8, band_origins: int = 200):
        self.halflife_s = halflife_s
        self.interval_width = interval_width
        self.band_origins = band_origins

    def fit(self, history: pd.DataFrame) -> EwmaForecaster:
        self._set_history(history)
        halflife = max(self.halflife_s / self.step_s, 1.0)
        self._level = pd.Series(self.log_rate).ffill().ewm(halflife=halflife).mean().to_numpy()
        return self

    def predict(self, horizon_steps: int, history: pd.DataFrame | None = None) -> Forecast:
        if history is not None:
            self.fit(history)
        last = len(self.log_rate) - 1
        origins = np.arange(max(0, last - self.band_origins - horizon_steps), max(last - horizon_steps + 1, 0))
        errs = horizon_errors(
            self.log_rate, lambda last: np.full(horizon_steps, self._level[last]), origins, horizon_steps
        )
        lo, hi = empirical_band(errs, self.interval_width)
        return self._forecast(np.full(horizon_steps, self._level[last]), lo, hi, self.name, self.interval_width)
