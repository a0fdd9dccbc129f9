"""Rolling-origin evaluation of forecasters on a recorded history.

From each origin in the evaluated tail, the model (refitted every
``refit_every_s`` on everything before the origin) forecasts the horizon;
errors are taken at the final horizon step, the figure a planner acting that
far ahead depends on.  Seasonal-naive baselines (a day and a week earlier)
are scored on the same origins and the better one is reported.

``realised_error`` scores a forecast already made against what then
arrived, with the day-earlier seasonal naive on the same instants: what a
deployed forecaster is judged by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pandas as pd

from kale_dagster.errors import InputDataError
from kale_dagster.forecast.naive import DAY_S, WEEK_S

Factory = Callable[[], object]


def smape(actual: np.ndarray, forecast: np.ndarray) -> float:
    """Symmetric MAPE as a fraction (0..2), 0/0 counted as 0."""
    a, f = np.asarray(actual, float), np.asarray(forecast, float)
    denom = np.abs(a) + np.abs(f)
    with np.errstate(invalid="ignore", divide="ignore"):
        terms = np.where(denom > 0, 2 * np.abs(f - a) / denom, 0.0)
    return float(np.mean(terms))


def mape(actual: np.ndarray, forecast: np.ndarray) -> float:
    a, f = np.asarray(actual, float), np.asarray(forecast, float)
    ok = a > 0
    return float(np.mean(np.abs(f[ok] - a[ok]) / a[ok])) if ok.any() else float("nan")


@dataclass(frozen=True)
class EvaluationResult:
    model: str
    horizon_minutes: float
    smape: float
    mape: float
    mae: float
    coverage: float
    baseline: str
    baseline_smape: float
    folds: int
    refits: int
    fallbacks: int
    baseline_mae: float = float("nan")  # the best seasonal naive's MAE on the same folds (the lower of day and week)
    eval_days: float = float("nan")  # the tail actually evaluated
    note: str = ""  # why the tail is shorter than asked, if it is

    @property
    def relative_mae(self) -> float:
        """MAE over the best seasonal naive's: what capacity planning feels (sMAPE rewards predicting zero)."""
        return self.mae / self.baseline_mae if self.baseline_mae > 0 else float("nan")

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "horizon_minutes": self.horizon_minutes,
            "smape": self.smape,
            "mape": self.mape,
            "mae": self.mae,
            "coverage": self.coverage,
            "baseline": self.baseline,
            "baseline_smape": self.baseline_smape,
            "baseline_mae": self.baseline_mae,
            "relative_mae": self.relative_mae,
            "folds": self.folds,
            "eval_days": self.eval_days,
            "note": self.note,
        }


def realised_error(forecast, history: pd.DataFrame) -> Optional[dict]:
    """sMAPE of ``forecast`` against the ``history`` (``timestamp``, ``rate``) recorded at its instants, and of
    the rate a day before each instant; None until some instant of the forecast has been recorded."""
    if history.empty or not len(forecast):
        return None
    ts = (pd.to_datetime(history["timestamp"], utc=True) - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy()
    rate = history["rate"].to_numpy(dtype=float)
    order = np.argsort(ts)
    ts, rate = ts[order], rate[order]

    def at(times: np.ndarray) -> np.ndarray:
        # The reading nearest each instant, if one lies within half a forecast step of it.
        idx = np.clip(np.searchsorted(ts, times), 1, len(ts) - 1) if len(ts) > 1 else np.zeros(len(times), dtype=int)
        nearest = np.where(np.abs(ts[idx] - times) <= np.abs(ts[idx - 1] - times), idx, idx - 1) if len(ts) > 1 else idx
        return np.where(np.abs(ts[nearest] - times) <= forecast.step_s / 2, rate[nearest], np.nan)

    times = forecast.times
    actual, day_before = at(times), at(times - DAY_S)
    ok = np.isfinite(actual) & np.isfinite(day_before) & np.isfinite(forecast.point)
    if not ok.any():
        return None
    return {"realised_smape": smape(actual[ok], forecast.point[ok]), "realised_baseline_smape": smape(actual[ok], day_before[ok]),
            "realised_points": int(ok.sum())}


def _seasonal_naive(rate: np.ndarray, target: np.ndarray, season: int) -> np.ndarray:
    src = target - season
    return np.where(src >= 0, rate[np.maximum(src, 0)], np.nan)


def rolling_origin(
    history: pd.DataFrame,
    factory: Factory,
    horizon_s: float,
    eval_days: float = 28.0,
    refit_every_s: float = DAY_S,
    origin_every_s: Optional[float] = None,
    min_train_s: float = 2 * DAY_S,
    progress: Optional[Callable[[int, int], None]] = None,
) -> EvaluationResult:
    """Evaluate ``factory()`` models over the last ``eval_days`` of ``history`` (clean, regular)."""
    ts = history["timestamp"]
    rate = history["rate"].to_numpy(dtype=float)
    step = float((ts.iloc[1] - ts.iloc[0]).total_seconds())
    horizon = max(1, int(round(horizon_s / step)))
    n = len(rate)
    eval_steps = int(eval_days * DAY_S / step)
    # The tail starts after the training minimum and a day of history (the daily baseline's), whatever was asked.
    start = max(n - eval_steps, int(min_train_s / step), int(round(DAY_S / step)))
    if start >= n - horizon:
        raise InputDataError(
            f"trace too short to evaluate: {n * step / DAY_S:.1f} days of data, need more than "
            f"{max(min_train_s, DAY_S) / DAY_S:.0f} days of training plus the {horizon_s / 60:.0f}-minute horizon"
        )
    evaluated_days = (n - start) * step / DAY_S
    note = ""
    if start > n - eval_steps:
        note = (f"the trace has {n * step / DAY_S:.1f} days; evaluated its last {evaluated_days:.1f} days instead of {eval_days:g}, "
                f"after the {max(min_train_s, DAY_S) / DAY_S:.0f} days of history the first fit needs")
    every = max(1, int(round((origin_every_s or step) / step)))
    refit_steps = max(1, int(round(refit_every_s / step)))
    origins = np.arange(start, n - horizon + 1, every)  # origin = first forecast index
    preds, lows, highs, refits, fallbacks = [], [], [], 0, 0
    model = None
    next_refit = -1
    for k, origin in enumerate(origins):
        past = history.iloc[:origin]
        if origin >= next_refit:
            model = factory().fit(past)
            refits += 1
            next_refit = origin + refit_steps
        fc = model.predict(horizon, history=past)
        preds.append(fc.point[horizon - 1])
        lows.append(fc.lower[horizon - 1])
        highs.append(fc.upper[horizon - 1])
        fallbacks += bool(fc.fallback)
        if progress:
            progress(k + 1, len(origins))
    target = origins + horizon - 1
    actual = rate[target]
    ok = np.isfinite(actual)
    preds, lows, highs = np.array(preds), np.array(lows), np.array(highs)
    base, base_mae = {}, {}
    for name, season_s in (("seasonal-naive-day", DAY_S), ("seasonal-naive-week", WEEK_S)):
        season = int(round(season_s / step))
        if season >= horizon:
            guess = _seasonal_naive(rate, target, season)
            good = ok & np.isfinite(guess)
            if good.sum() == ok.sum():  # a baseline counts only if it covers every fold
                base[name] = smape(actual[good], guess[good])
                base_mae[name] = float(np.mean(np.abs(guess[good] - actual[good])))
    if not base:
        raise InputDataError("not enough history before the evaluated tail for a seasonal-naive baseline")
    best = min(base, key=base.get)
    return EvaluationResult(
        model=getattr(model, "name", type(model).__name__),
        horizon_minutes=horizon_s / 60,
        smape=smape(actual[ok], preds[ok]),
        mape=mape(actual[ok], preds[ok]),
        mae=float(np.mean(np.abs(preds[ok] - actual[ok]))),
        coverage=float(np.mean((actual[ok] >= lows[ok]) & (actual[ok] <= highs[ok]))),
        baseline=best,
        baseline_smape=base[best],
        folds=int(ok.sum()),
        refits=refits,
        fallbacks=fallbacks,
        baseline_mae=min(base_mae.values()),
        eval_days=evaluated_days,
        note=note,
    )

