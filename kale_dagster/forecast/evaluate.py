"""Rolling-origin evaluation of forecasters on a recorded history.

From each origin in the evaluated tail, the model (refitted every
``refit_every_s`` on everything before the origin) forecasts the horizon;
errors are taken at the final horizon step, the figure a planner acting that
far ahead depends on.  Seasonal-naive baselines (a day and a week earlier)
are scored on the same origins and the better one is reported, beside
every simple baseline (``simple_baselines``: persistence and a recent mean
too), the noise floor (``noise_floor``) and the error on the rate averaged
over the plan step that ends at the horizon.  ``rolling_origin_horizons``
scores one pass at several horizons.

``realised_error`` scores a forecast already made against what then
arrived, with the day-earlier seasonal naive on the same instants: what a
deployed forecaster is judged by.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kale_dagster.errors import InputDataError
from kale_dagster.forecast.base import Forecaster
from kale_dagster.forecast.naive import DAY_S, WEEK_S, window_means

Factory = Callable[[], Forecaster]


def smape_terms(actual: np.ndarray, forecast: np.ndarray) -> np.ndarray:
    """Each pair's symmetric absolute percentage error (0..2), 0/0 counted as 0: what :func:`smape` averages."""
    a, f = np.asarray(actual, float), np.asarray(forecast, float)
    denom = np.abs(a) + np.abs(f)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, 2 * np.abs(f - a) / denom, 0.0)


def smape(actual: np.ndarray, forecast: np.ndarray) -> float:
    """Symmetric MAPE as a fraction (0..2), 0/0 counted as 0."""
    return float(np.mean(smape_terms(actual, forecast)))


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
    simple_mae: dict = field(
        default_factory=dict
    )  # every simple baseline's MAE on the same folds (``simple_baselines``)
    floor_mae: float = float("nan")  # the noise floor (``noise_floor``)
    plan_step_mae: float = float("nan")  # on the rate averaged over the plan step ending at the horizon
    plan_step_baseline_mae: float = float("nan")  # the seasonal naive's with the lower MAE, averaged the same way
    fit_seconds: float = float("nan")  # median fit time

    @property
    def relative_mae(self) -> float:
        """MAE over the best seasonal naive's: what capacity planning feels (sMAPE rewards predicting zero)."""
        return self.mae / self.baseline_mae if self.baseline_mae > 0 else float("nan")

    @property
    def best_simple(self) -> tuple[str, float]:
        """The simple baseline with the lowest MAE, and that MAE."""
        name = min(self.simple_mae, key=lambda k: self.simple_mae[k]) if self.simple_mae else ""
        return name, self.simple_mae.get(name, float("nan"))

    @property
    def gap_closed(self) -> float:
        """The share of the gap between the best seasonal naive's MAE and the noise floor that the model closes."""
        gap = self.baseline_mae - self.floor_mae
        return (self.baseline_mae - self.mae) / gap if gap > 0 else float("nan")

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
            "simple_mae": self.simple_mae,
            "best_simple": self.best_simple[0],
            "floor_mae": self.floor_mae,
            "gap_closed": self.gap_closed,
            "plan_step_mae": self.plan_step_mae,
            "plan_step_baseline_mae": self.plan_step_baseline_mae,
            "fit_seconds": self.fit_seconds,
            "folds": self.folds,
            "eval_days": self.eval_days,
            "note": self.note,
        }


def realised_error(forecast, history: pd.DataFrame) -> dict | None:
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
    return {
        "realised_smape": smape(actual[ok], forecast.point[ok]),
        "realised_baseline_smape": smape(actual[ok], day_before[ok]),
        "realised_points": int(ok.sum()),
    }


def _seasonal_naive(rate: np.ndarray, target: np.ndarray, season: int) -> np.ndarray:
    src = target - season
    return np.where(src >= 0, rate[np.maximum(src, 0)], np.nan)


#: The seasonal-naive baselines, by name, and their periods (s).
SEASONAL_NAIVE = {"seasonal-naive-day": DAY_S, "seasonal-naive-week": WEEK_S}
#: Window lengths (in buckets) the recent-mean baseline may choose from on held-out origins.
RECENT_MEAN_WINDOWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 36, 48, 72, 96, 144, 288)
#: The noise floor's centered moving average spans this many buckets (35 minutes of 5-minute data).
FLOOR_WINDOW = 7


def _recent_mean(rate: np.ndarray, origins: np.ndarray, k: int) -> np.ndarray:
    return window_means(rate, np.maximum(origins - k, 0), origins)


def _mae(actual: np.ndarray, guess: np.ndarray) -> float:
    ok = np.isfinite(actual) & np.isfinite(guess)
    return float(np.mean(np.abs(guess[ok] - actual[ok]))) if ok.any() else float("nan")


def noise_floor(rate: np.ndarray, target: np.ndarray, window: int = FLOOR_WINDOW) -> float:
    """MAE of a centered moving average of the actual values around each target: it sees the future, so on a
    noisy series it approximates what no forecaster can beat (on a smooth one it is no bound)."""
    lo, hi = np.maximum(target - window // 2, 0), np.minimum(target + window // 2 + 1, len(rate))
    return _mae(rate[target], window_means(rate, lo, hi))


def simple_baselines(
    rate: np.ndarray, origins: np.ndarray, horizon: int, step_s: float, held_out: np.ndarray
) -> dict[str, np.ndarray]:
    """Each simple forecaster's guess for ``origins + horizon - 1``: seasonal naive (day, week; only where every
    origin has its season), persistence, and the mean of the last k buckets with k chosen by MAE on the
    ``held_out`` origins (all before the evaluated ones)."""
    target = origins + horizon - 1
    out: dict[str, np.ndarray] = {}
    for name, season_s in SEASONAL_NAIVE.items():
        season = int(round(season_s / step_s))
        if season >= horizon:
            guess = _seasonal_naive(rate, target, season)
            if np.isfinite(guess[np.isfinite(rate[target])]).all():
                out[name] = guess
    out["persistence"] = rate[origins - 1]
    windows = [k for k in RECENT_MEAN_WINDOWS if k * step_s <= DAY_S and k > 1]
    if len(held_out) and windows:
        k = min(windows, key=lambda k: _mae(rate[held_out + horizon - 1], _recent_mean(rate, held_out, k)))
        out[f"mean of last {k}"] = _recent_mean(rate, origins, k)
    return out


def _plan_step_mean(values: np.ndarray, width: int) -> np.ndarray:
    """Rows of per-step values -> the mean of each row's last ``width`` steps (the plan step ending at the horizon)."""
    return np.nanmean(values[:, -width:], axis=1)


def rolling_origin(
    history: pd.DataFrame,
    factory: Factory,
    horizon_s: float,
    eval_days: float = 28.0,
    refit_every_s: float = DAY_S,
    origin_every_s: float | None = None,
    min_train_s: float = 2 * DAY_S,
    progress: Callable[[int, int], None] | None = None,
) -> EvaluationResult:
    """Evaluate ``factory()`` models over the last ``eval_days`` of ``history`` (clean, regular)."""
    return rolling_origin_horizons(
        history, factory, (horizon_s,), eval_days, refit_every_s, origin_every_s, min_train_s, progress
    )[0]


def rolling_origin_horizons(
    history: pd.DataFrame,
    factory: Factory,
    horizons_s: Sequence[float],
    eval_days: float = 28.0,
    refit_every_s: float = DAY_S,
    origin_every_s: float | None = None,
    min_train_s: float = 2 * DAY_S,
    progress: Callable[[int, int], None] | None = None,
    plan_step_s: float = 600.0,
) -> list[EvaluationResult]:
    """One rolling-origin pass scored at several horizons (one fit and one forecast per origin serve all): the
    evaluated tail, the folds (a forecast from every origin, refitted every ``refit_every_s``), then each
    horizon's scores."""
    ts = history["timestamp"]
    step = float((ts.iloc[1] - ts.iloc[0]).total_seconds())
    horizons = [max(1, int(round(h / step))) for h in horizons_s]
    start, evaluated_days, note = _evaluated_tail(len(history), step, max(horizons), horizons_s, eval_days, min_train_s)
    every = max(1, int(round((origin_every_s or step) / step)))
    origins = np.arange(start, len(history) - max(horizons) + 1, every)  # origin = first forecast index
    folds = _Folds.forecast(
        history, factory, origins, max(horizons), max(1, int(round(refit_every_s / step))), progress
    )
    rate = history["rate"].to_numpy(dtype=float)
    # Held-out origins for choosing the recent mean's window: up to a week before the evaluated tail.
    held_out = np.arange(max(start - int(WEEK_S / step), max(RECENT_MEAN_WINDOWS)), start - max(horizons) + 1, every)
    plan_width = max(1, int(round(plan_step_s / step)))
    return [
        _score(folds, rate, step, horizon_s, horizon, held_out, plan_width, evaluated_days, note)
        for horizon_s, horizon in zip(horizons_s, horizons)
    ]


def _evaluated_tail(
    n: int, step: float, longest: int, horizons_s: Sequence[float], eval_days: float, min_train_s: float
) -> tuple[int, float, str]:
    """Where the evaluated tail starts, how many days it spans, and a note when that is fewer than asked.  It starts
    after the training minimum and a day of history (the daily baseline's), whatever was asked."""
    eval_steps = int(eval_days * DAY_S / step)
    start = max(n - eval_steps, int(min_train_s / step), int(round(DAY_S / step)))
    if start >= n - longest:
        raise InputDataError(
            f"trace too short to evaluate: {n * step / DAY_S:.1f} days of data, need more than "
            f"{max(min_train_s, DAY_S) / DAY_S:.0f} days of training plus the {max(horizons_s) / 60:.0f}-minute horizon"
        )
    evaluated_days = (n - start) * step / DAY_S
    note = ""
    if start > n - eval_steps:
        note = (
            f"the trace has {n * step / DAY_S:.1f} days; evaluated its last {evaluated_days:.1f} days instead of "
            f"{eval_days:g}, after the {max(min_train_s, DAY_S) / DAY_S:.0f} days of history the first fit needs"
        )
    return start, evaluated_days, note


@dataclass
class _Folds:
    """The forecasts from every origin of the evaluated tail: point, band, and how the fits went."""

    origins: np.ndarray
    paths: np.ndarray  # (origin, step) point forecasts
    lows: np.ndarray
    highs: np.ndarray
    fit_s: list[float]
    refits: int
    fallbacks: int
    model: str

    @classmethod
    def forecast(
        cls,
        history: pd.DataFrame,
        factory: Factory,
        origins: np.ndarray,
        longest: int,
        refit_steps: int,
        progress: Callable[[int, int], None] | None,
    ) -> _Folds:
        """Each origin forecast from the history before it, by a model refitted every ``refit_steps``."""
        paths, lows, highs, fit_s, refits, fallbacks = [], [], [], [], 0, 0
        model = None
        next_refit = -1
        for k, origin in enumerate(origins):
            past = history.iloc[:origin]
            if origin >= next_refit:
                started = time.perf_counter()
                model = factory().fit(past)
                fit_s.append(time.perf_counter() - started)
                refits += 1
                next_refit = origin + refit_steps
            assert model is not None  # the first origin always refits
            fc = model.predict(longest, history=past)
            paths.append(fc.point[:longest])
            lows.append(fc.lower[:longest])
            highs.append(fc.upper[:longest])
            fallbacks += bool(fc.fallback)
            if progress:
                progress(k + 1, len(origins))
        name = getattr(model, "name", type(model).__name__)
        return cls(origins, np.array(paths), np.array(lows), np.array(highs), fit_s, refits, fallbacks, name)


def _score(
    folds: _Folds,
    rate: np.ndarray,
    step: float,
    horizon_s: float,
    horizon: int,
    held_out: np.ndarray,
    plan_width: int,
    evaluated_days: float,
    note: str,
) -> EvaluationResult:
    """One horizon's scores: the model's against the simple baselines', and on the plan step ending there."""
    origins = folds.origins
    target = origins + horizon - 1
    actual = rate[target]
    ok = np.isfinite(actual)
    preds = folds.paths[:, horizon - 1]
    simple = simple_baselines(rate, origins, horizon, step, held_out)
    seasonal = {name: guess for name, guess in simple.items() if name.startswith("seasonal-naive")}
    if not seasonal:
        raise InputDataError("not enough history before the evaluated tail for a seasonal-naive baseline")
    base = {name: smape(actual[ok], guess[ok]) for name, guess in seasonal.items()}
    best = min(base, key=lambda k: base[k])
    simple_mae = {name: _mae(actual, guess) for name, guess in simple.items()}
    # The plan step ending at the horizon, averaged, as the allocation uses the rate.
    width = min(plan_width, horizon)
    steps_back = np.arange(horizon - width, horizon)
    window = origins[:, None] + steps_back[None, :]
    actual_plan = np.nanmean(rate[window], axis=1)
    # The baseline of the plan step is, as baseline_mae is, the season with the lower MAE (here on the step's mean).
    naive_plan_mae = min(
        _mae(actual_plan, np.nanmean(rate[np.maximum(window - int(round(SEASONAL_NAIVE[name] / step)), 0)], axis=1))
        for name in seasonal
    )
    lows, highs = folds.lows[ok, horizon - 1], folds.highs[ok, horizon - 1]
    return EvaluationResult(
        model=folds.model,
        horizon_minutes=horizon_s / 60,
        smape=smape(actual[ok], preds[ok]),
        mape=mape(actual[ok], preds[ok]),
        mae=float(np.mean(np.abs(preds[ok] - actual[ok]))),
        coverage=float(np.mean((actual[ok] >= lows) & (actual[ok] <= highs))),
        baseline=best,
        baseline_smape=base[best],
        folds=int(ok.sum()),
        refits=folds.refits,
        fallbacks=folds.fallbacks,
        baseline_mae=min(simple_mae[name] for name in seasonal),
        eval_days=evaluated_days,
        note=note,
        simple_mae=simple_mae,
        floor_mae=noise_floor(rate, target[ok]),
        plan_step_mae=_mae(actual_plan, _plan_step_mean(folds.paths[:, :horizon], width)),
        plan_step_baseline_mae=naive_plan_mae,
        fit_seconds=float(np.median(folds.fit_s)),
    )
