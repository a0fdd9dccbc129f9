"""The default forecaster: Prophet's seasonal shape, corrected by the latest observations.

Plain Prophet (daily + weekly seasonality) knows the shape of a day and a
week but not today's level: on real traffic its 2-hour error is worse than
repeating last week.  Three additions fix that, each measured in
``bench/forecast_accuracy.py``:

1. log space: traffic varies multiplicatively, so Prophet fits log rates
   (under two weeks of history, with no weekly seasonality yet, a weekend
   level: one weekend seen says how much busier or quieter the next is);
2. residual correction: a direct multi-horizon linear model predicts the
   base model's error at each step ahead from its recent errors averaged
   over several windows (the latest level);
3. ensemble: the same correction on a robust seasonal base (the median of
   the same time over the last ``seasons`` periods, a week, or a day with
   under two weeks of history, or a shorter cycle (a periodic job's, over its
   latest four repetitions), even one shorter than the horizon, where its
   held-out error is lower, and then uncorrected where the correction does
   not pay there), and the recent level (the mean of the
   last k buckets, geometric or arithmetic, both chosen on held-out data:
   a spike barely moves the first, a zero bucket barely moves the second,
   while it drags a geometric mean far down), blended with the Prophet branch
   by weights chosen per horizon step by MAE on up to three held-out days:
   where a branch does not pay on a series (Prophet's shape on noisy
   counts, the seasonal base on irregular ones), its weight goes to zero.

Bands are empirical quantiles of the blended model's errors on the held-out
days, where the corrections were not fitted (the blend weights were chosen
there, so they are calibrated, not strictly split-conformal).

With less than ``min_history_s`` (two days) of data Prophet is not trusted:
the forecaster falls back to the EWMA level and says so in
``Forecast.fallback``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pandas as pd

from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast.base import Forecast
from kale_dagster.forecast.correction import ResidualCorrection
from kale_dagster.forecast.naive import (
    DAY_S,
    WEEK_S,
    EwmaForecaster,
    _FittedSeries,
    empirical_band,
    row_nanmedian,
    window_means,
)

#: The name fitted forecasters pickled in a metrics history before the correction had its own module refer to.
_Correction = ResidualCorrection

# Candidate blends of (Prophet, seasonal median, recent level): shares in quarters.
_SIMPLEX = [np.array([a, b, 4 - a - b]) / 4 for a in range(5) for b in range(5 - a)]
_RECENT_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 36, 48, 72, 96, 144, 288)  # windows the recent level may average
_HOLDOUT_S = 3 * DAY_S  # the blend's held-out tail, at most a third of the history
# Cycles shorter than a day the seasonal base may repeat instead of the calendar's (periodic jobs).
_CYCLES_S = (3600.0, 2 * 3600.0, 3 * 3600.0, 4 * 3600.0, 6 * 3600.0, 8 * 3600.0, 12 * 3600.0)
# A cycle's median spans its latest 4 repetitions: one odd repetition cannot move it, and a job that stops is
# forgotten after 3 (the calendar's 8 took 5).  Held-out days cannot choose the span: none of them saw a job stop.
_CYCLE_REPEATS = 4


def _weekend(ds: pd.Series) -> pd.Series:
    """1.0 on Saturdays and Sundays, else 0.0: Prophet's weekend regressor."""
    return (ds.dt.dayofweek >= 5).astype(float)


def _quiet_prophet_logs() -> None:
    """Keep third-party chatter off the user's terminal; call before importing prophet.

    prophet.plot logs an ERROR at import when plotly is absent (we never plot with it); cmdstanpy sets its
    logger to INFO unless it already has a handler, so it gets a NullHandler and keeps warnings only."""
    cmdstanpy = logging.getLogger("cmdstanpy")
    if not cmdstanpy.handlers:
        cmdstanpy.addHandler(logging.NullHandler())
    cmdstanpy.setLevel(logging.WARNING)
    logging.getLogger("prophet").setLevel(logging.WARNING)
    logging.getLogger("prophet.plot").setLevel(logging.CRITICAL)


class ProphetForecaster(_FittedSeries):
    """Prophet with residual correction and a seasonal-naive ensemble (see module docstring).

    ``correct=False`` gives plain Prophet in log space, for comparison.
    ``horizon_s`` is the longest horizon ``predict`` will be asked for; the
    correction is fitted for each step up to it.
    """

    name = "prophet"

    def __init__(
        self,
        horizon_s: float = 7200.0,
        interval_width: float = 0.8,
        changepoint_prior_scale: float = 0.05,
        seasonality_prior_scale: float = 10.0,
        min_history_s: float = 2 * DAY_S,
        correct: bool = True,
        prophet_step_s: float = 600.0,
        prefetch_s: float = 86_400.0,
        seasons: int = 8,
    ):
        if horizon_s <= 0:
            raise KaleConfigError("horizon_s", f"must be > 0, got {horizon_s}")
        if not 0 < interval_width < 1:
            raise KaleConfigError("interval_width", f"must be in (0, 1), got {interval_width}")
        if changepoint_prior_scale <= 0:
            raise KaleConfigError("changepoint_prior_scale", f"must be > 0, got {changepoint_prior_scale}")
        self.horizon_s = horizon_s
        self.interval_width = interval_width
        self.changepoint_prior_scale = changepoint_prior_scale
        self.seasonality_prior_scale = seasonality_prior_scale
        self.min_history_s = min_history_s
        self.correct = correct
        self.prophet_step_s = prophet_step_s
        self.prefetch_s = prefetch_s
        if seasons < 1:
            raise KaleConfigError("seasons", f"must be >= 1, got {seasons}")
        self.seasons = seasons
        # What fit() learns, declared here in one place (``horizon``, ``step_s`` and ``log_rate`` come with the
        # history, ``_set_history``).
        self.fallback = ""  # why the fit fell back to the EWMA level ("" when it did not)
        self.fit_seconds = 0.0
        self.horizon = 0  # steps the corrections are fitted for
        self._ewma: EwmaForecaster | None = None  # the fallback's model
        self._prophet_table = np.zeros(0)  # Prophet's log-rate at positions 0 .. history + prefetch
        self._base_prophet = np.zeros(0)  # the same over the history
        self._band = (np.zeros(0), np.zeros(0))  # the held-out log errors' band, per step
        self._prophet: Any = None  # the fitted Prophet model
        self._weekend_level = False  # whether Prophet was fitted with a weekend level (under two weeks of history)
        self._calendar = (0, 0, 0)  # the calendar's seasonal median: (period, first, count) in steps
        self._season = (0, 0, 0)  # the seasonal base chosen (the calendar, or a job's cycle)
        self._corr_p = ResidualCorrection(1.0, 1)  # Prophet's residual correction
        self._corr_n = ResidualCorrection(1.0, 1)  # the seasonal base's
        self.recent_k, self.recent_mean = 1, "geometric"  # the recent level's window (buckets) and mean
        self.blend_weights = np.zeros((0, 3))  # per step: Prophet, the seasonal base, the recent level
        self.holdout_smape: float | None = None

    # --- fitting --------------------------------------------------------------

    def _fit_prophet(self) -> None:
        _quiet_prophet_logs()
        from prophet import Prophet

        span = len(self.log_rate) * self.step_s
        hist = self.history.set_index("timestamp")["rate"]
        # Prophet learns the shape; a coarser grid fits several times faster
        # and the correction recovers the fine level.
        agg_step = max(self.step_s, self.prophet_step_s)
        means = hist.resample(pd.Timedelta(seconds=agg_step)).mean()
        coarse = pd.Series(self.to_log(means), index=means.index).dropna()
        weekly = span >= 2 * WEEK_S
        model = Prophet(
            daily_seasonality=True,
            weekly_seasonality=weekly,
            yearly_seasonality=False,
            changepoint_prior_scale=self.changepoint_prior_scale,
            seasonality_prior_scale=self.seasonality_prior_scale,
            uncertainty_samples=0,
        )
        frame = pd.DataFrame({"ds": pd.DatetimeIndex(coarse.index).tz_localize(None), "y": coarse.to_numpy()})
        # Under two weeks no weekly shape can be fitted, but a weekend's level can, from one weekend seen.
        weekend = _weekend(frame["ds"])
        self._weekend_level = not weekly and 0 < weekend.sum() < len(weekend)
        if self._weekend_level:
            frame["weekend"] = weekend
            model.add_regressor("weekend")
        model.fit(frame)
        self._prophet = model
        self._prophet_cache: dict[int, float] = {}
        self._prophet_table = np.zeros(0)  # the positions prefetched at the fit, 0 to len - 1: read by index

    def _prophet_log(self, positions: np.ndarray) -> np.ndarray:
        """Prophet's log forecast at grid positions (0 = first history row), memoised."""
        positions = np.asarray(positions)
        if (
            len(positions)
            and positions.dtype.kind in "iu"
            and 0 <= positions.min()
            and positions.max() < len(self._prophet_table)
        ):
            return self._prophet_table[positions]
        need = [int(p) for p in positions if int(p) not in self._prophet_cache]
        if need:
            start = self.history["timestamp"].iloc[0]
            ds = (start + pd.to_timedelta(np.asarray(need) * self.step_s, unit="s")).tz_localize(None)
            frame = pd.DataFrame({"ds": ds})
            if self._weekend_level:
                frame["weekend"] = _weekend(frame["ds"])
            values = self._prophet.predict(frame)["yhat"].to_numpy()
            self._prophet_cache.update(zip(need, values))
        return np.array([self._prophet_cache[int(p)] for p in positions])

    def _naive_log(
        self, log_rate: np.ndarray, positions: np.ndarray, season: tuple[int, int, int] | None = None
    ) -> np.ndarray:
        """Median of the same time over ``count`` seasons from ``first`` periods back, ``season`` being (period,
        first, count) in steps (the chosen one by default): a seasonal base that one odd week cannot move."""
        period, skip, count = season or self._season
        src = np.asarray(positions)[:, None] - period * (skip + np.arange(count))[None, :]
        ok = (src >= 0) & (src < len(log_rate))
        values = np.where(ok, log_rate[np.clip(src, 0, len(log_rate) - 1)], np.nan)
        out = np.full(len(src), np.nan)
        has = ok.any(axis=1)
        out[has] = row_nanmedian(values[has])
        return out

    def _season_candidates(self, n: int) -> list[tuple[int, int, int]]:
        """The seasonal base's candidates as (period, first, count) for :meth:`_naive_log`, the calendar's first (a
        week with two weeks of history, else a day, from one period back), then each cycle of ``_CYCLES_S`` (a
        periodic job's) whose plain median beats the calendar's over the held-out days: a cycle must show in the
        data before it is judged as the blend would use it.  A cycle starts from the latest whole cycle that every
        step of the horizon has observed (a 1-hour cycle two cycles back at a 2-hour horizon) over its latest
        ``_CYCLE_REPEATS`` repetitions, so a cycle of spikes shorter than the horizon counts too, and forgets
        them within hours when they stop.  The calendar's period itself is not put to the vote: a few days
        cannot tell a week from a day reliably (holidays moved nyc_taxi's choice back and forth, at a cost),
        while a cycle of spikes shows at once."""
        calendar = (int(round((WEEK_S if n * self.step_s >= 2 * WEEK_S else DAY_S) / self.step_s)), 1, self.seasons)
        cycles = [int(round(period_s / self.step_s)) for period_s in _CYCLES_S]
        cycles = [(c, -(-self.horizon // c), _CYCLE_REPEATS) for c in cycles if c >= 2]  # ceil(horizon / c) back
        holdout = np.arange(max(n - int(min(_HOLDOUT_S, n * self.step_s / 3) // self.step_s), 0), n)
        actual = self.from_log(self.log_rate[holdout])

        def error(season) -> float:
            guess = self.from_log(self._naive_log(self.log_rate, holdout, season))
            return float(np.nanmean(np.abs(guess - actual))) if np.isfinite(guess).any() else np.inf

        return [calendar] + [c for c in cycles if error(c) < error(calendar)]

    def fit(self, history: pd.DataFrame) -> ProphetForecaster:
        started = time.perf_counter()
        self._set_history(history)
        span = len(self.log_rate) * self.step_s
        self.horizon = max(1, int(round(self.horizon_s / self.step_s)))
        self.fallback = ""
        if span < self.min_history_s:
            self.fallback = (
                f"only {span / 3600:.1f} h of history (< {self.min_history_s / 3600:.0f} h): "
                "Prophet is not trusted yet, using the EWMA level"
            )
            self._ewma = EwmaForecaster(interval_width=self.interval_width).fit(history)
            self.fit_seconds = time.perf_counter() - started
            return self
        self._fit_prophet()
        n = len(self.log_rate)
        # One Prophet call covers the history and the next prefetch_s ahead,
        # so predictions between refits are lookups.
        ahead = self.horizon + int(self.prefetch_s // self.step_s)
        self._prophet_table = self._prophet_log(np.arange(n + ahead))
        self._base_prophet = self._prophet_table[:n]
        if self.correct:
            self._fit_blend(n)
        else:
            lasts = np.arange(max(n - 2 * DAY_S // self.step_s, 0), n - 1).astype(int)
            errs = self._errors(lambda last: self._prophet_log(last + 1 + np.arange(self.horizon)), lasts)
            self._band = empirical_band(errs, self.interval_width)
        self.fit_seconds = time.perf_counter() - started
        return self

    def _errors(self, predict_fn, lasts: np.ndarray) -> np.ndarray:
        n = len(self.log_rate)
        errs = np.full((len(lasts), self.horizon), np.nan)
        for k, last in enumerate(lasts):
            end = min(last + 1 + self.horizon, n)
            errs[k, : end - last - 1] = self.log_rate[last + 1 : end] - predict_fn(last)[: end - last - 1]
        return errs

    def _recent_log(self, log_rate: np.ndarray, lasts: np.ndarray, k: int, mean: str = "geometric") -> np.ndarray:
        """The log of the mean rate of the ``k`` buckets up to each of ``lasts``: geometric (one spike barely moves it)
        or arithmetic (a zero bucket barely moves it, while it drags a geometric mean far down)."""
        lo, hi = np.maximum(lasts + 1 - k, 0), lasts + 1
        if len(lasts) == 0:
            return np.zeros(0)
        start = int(lo.min())  # only the span the windows cover: a forecast reads the last k buckets, not the history
        span = log_rate[start : int(hi.max())]
        if mean == "geometric":
            return window_means(span, lo - start, hi - start)
        return self.to_log(window_means(self.from_log(span), lo - start, hi - start))

    def _fit_blend(self, n: int) -> None:
        """Three branches, each judged on held-out days: Prophet and the seasonal median, each with its correction,
        and the recent level (its window chosen there too); per horizon step, the blend of the three with the lowest
        held-out MAE on the rate scale (the error capacity feels; sMAPE would favour predicting zero).  The stages:
        the held-out split, Prophet's correction, the seasonal base, the recent level, the weights, the band."""
        resid_p = self.log_rate - self._base_prophet
        candidates = self._season_candidates(n)
        self._calendar = candidates[0]
        lasts, train, held = self._held_out(n)
        self._corr_p = ResidualCorrection(self.step_s, self.horizon).fit(resid_p, train)
        positions = np.minimum(held.origins[:, None] + held.steps[None, :], n - 1)
        pred_p = self._base_prophet[positions] + self._corr_p.predict(resid_p, held.origins)
        resid_n, pred_n, refit_n = self._choose_seasonal_base(candidates, n, train, held, pred_p)
        pred_r = self._choose_recent_level(held, pred_p)
        final = self._choose_weights(np.stack([pred_p, pred_n, pred_r]), held)  # (branch, origin, step) in
        self._band = empirical_band(held.target - final, self.interval_width)
        a, f = held.actual, self.from_log(final)
        self.holdout_smape = float(np.nanmean(2 * np.abs(f - a) / (np.abs(a) + np.abs(f) + 1e-9)))
        # Refit the corrections on everything now that the weights are chosen.
        self._corr_p.fit(resid_p, lasts)
        if refit_n is not None:
            self._corr_n.fit(resid_n, refit_n)

    def _held_out(self, n: int) -> tuple[np.ndarray, np.ndarray, _HeldOut]:
        """Every origin a correction can learn from, those it learns from while the blend is chosen, and the
        held-out origins it is judged on: several days when the history has them (one day's weights would follow
        that day's accidents)."""
        first = self._calendar[0] + max(self._windows_len(), 1)
        holdout = max(int(min(_HOLDOUT_S, n * self.step_s / 3) // self.step_s), self.horizon)
        lasts = np.arange(first, n - 1)
        train, test = lasts[lasts < n - 1 - holdout], lasts[lasts >= n - 1 - holdout]
        if len(train) < 10 or len(test) < 1:
            train = test = lasts
        return lasts, train, _HeldOut(self, test, n)

    def _choose_seasonal_base(
        self, candidates: list[tuple[int, int, int]], n: int, train: np.ndarray, held: _HeldOut, pred_p: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The seasonal base (a cycle's with or without its correction) whose forecasts have the lowest held-out
        MAE, the calendar's on a tie: judged as the blend will use it, not as a plain median (which on smooth
        traffic favours any short cycle).  Sets ``_season`` and ``_corr_n``; returns the base's residuals, its
        held-out forecasts and the origins its correction is refitted on (None: it has none)."""
        test, steps = held.origins, held.steps
        best_err = None  # the calendar's, judged first, is taken whatever its error: a base is always chosen
        chosen: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None
        for season in candidates:
            calendar = season == self._calendar
            # Each base's correction learns from every origin its median has history for (a cycle's from before the
            # calendar's); all are judged on the same held-out origins.
            own = train if calendar else np.arange(season[0] * season[1] + max(self._windows_len(), 1), test[0])
            if len(own) < 10 and not calendar:  # the calendar stays, however short the history
                continue
            # The seasonal median once per position, history and horizon: the held-out forecasts read each once per
            # step.
            naive = self._naive_log(self.log_rate, np.arange(n + self.horizon), season)
            resid = self.log_rate - naive[:n]
            # A cycle's median is hours old at the target, so its correction may only add noise: judged both ways.
            # The calendar's is a day or a week old, and its correction (the level since then) is what the blend is
            # built on.
            options = (ResidualCorrection(self.step_s, self.horizon).fit(resid, own),)
            options += () if calendar else (ResidualCorrection(self.step_s, self.horizon).off(),)
            for corr in options:
                pred = naive[test[:, None] + steps[None, :]] + corr.predict(resid, test)
                pred = np.where(np.isnan(pred), pred_p, pred)
                err = float(np.nansum(held.mae(pred)))
                if best_err is None or err < best_err:
                    best_err, self._season, self._corr_n = err, season, corr
                    chosen = (resid, pred, np.arange(own[0], n - 1) if corr.on else None)
        assert chosen is not None  # the calendar is always judged
        return chosen

    def _choose_recent_level(self, held: _HeldOut, pred_p: np.ndarray) -> np.ndarray:
        """The recent level's window and mean with the lowest held-out MAE (sets ``recent_k``, ``recent_mean``);
        returns its held-out forecasts, one level for every step."""
        windows = [k for k in _RECENT_BUCKETS if k * self.step_s <= DAY_S] or [1]
        levels = {
            (k, mean): self._recent_log(self.log_rate, held.origins, k, mean)[:, None]
            for k in windows
            for mean in (("geometric", "arithmetic") if k > 1 else ("geometric",))
        }
        chosen = min(levels, key=lambda km: float(np.nansum(held.mae(levels[km]))))
        self.recent_k, self.recent_mean = chosen
        return np.where(np.isnan(levels[chosen]), pred_p, levels[chosen])

    def _choose_weights(self, branches: np.ndarray, held: _HeldOut) -> np.ndarray:
        """Per horizon step, the blend of the (branch, origin, step) forecasts with the lowest held-out MAE (sets
        ``blend_weights``); returns the blended held-out forecasts, (origin, step)."""
        best_w = np.tile([1.0, 0.0, 0.0], (self.horizon, 1))
        best_err = np.full(self.horizon, np.inf)
        for w in _SIMPLEX:
            err = held.mae(np.tensordot(w, branches, axes=1))
            better = err < best_err
            best_w[better], best_err[better] = w, err[better]
        self.blend_weights = best_w
        return np.einsum("sb,bos->os", best_w, branches)

    def _windows_len(self) -> int:
        return max(ResidualCorrection(self.step_s, 1).windows)

    # --- prediction -----------------------------------------------------------

    def predict(self, horizon_steps: int | None = None, history: pd.DataFrame | None = None) -> Forecast:
        """Forecast from the end of the fitted history, or of ``history`` when given.

        ``history`` lets a fitted model use observations that arrived after
        the fit (it must start where the fitted history started), so a
        refit every few minutes is not needed for fresh levels.
        """
        horizon = horizon_steps or self.horizon
        if horizon > self.horizon and not self.fallback and self.correct:
            raise KaleConfigError(
                "horizon_steps",
                f"the model was fitted for at most {self.horizon} steps (horizon_s={self.horizon_s:.0f}); got "
                f"{horizon}",
            )
        if self.fallback:
            assert self._ewma is not None  # fitted with the fallback
            fc = self._ewma.predict(horizon, history=history)
            return _with(fc, fallback=self.fallback, fit_seconds=self.fit_seconds, model=self.name)
        if history is not None:
            self._set_history(history, refit=False)
        log_rate = self.log_rate
        last = len(log_rate) - 1
        future = last + 1 + np.arange(horizon)
        base_p = self._prophet_log(future)
        if not self.correct:
            lo, hi = self._band
            return _with(
                self._forecast(base_p, lo, hi, "prophet (plain)", self.interval_width), fit_seconds=self.fit_seconds
            )
        # The corrections read the residuals of the last few windows only: those, the last at their end.
        positions = np.arange(max(last - self._windows_len() - 1, 0), last + 1)
        resid_p = log_rate[positions] - self._prophet_log(positions)
        resid_n = log_rate[positions] - self._naive_log(log_rate, positions)
        end = np.array([len(positions) - 1])
        pred_p = base_p + self._corr_p.predict(resid_p, end)[0, :horizon]
        pred_n = self._naive_log(log_rate, future) + self._corr_n.predict(resid_n, end)[0, :horizon]
        pred_n = np.where(np.isnan(pred_n), pred_p, pred_n)
        pred_r = np.full(horizon, self._recent_log(log_rate, np.array([last]), self.recent_k, self.recent_mean)[0])
        pred_r = np.where(np.isnan(pred_r), pred_p, pred_r)
        w = self.blend_weights[:horizon]
        point = w[:, 0] * pred_p + w[:, 1] * pred_n + w[:, 2] * pred_r
        lo, hi = self._band
        fc = self._forecast(point, lo, hi, self.name, self.interval_width)
        # Past the horizon, the calendar's seasonal median says how the day goes on (a job's cycle, if the base repeats
        # one, would say only how the next hours repeat), until the first step it has no value for (the horizon's last
        # step included).
        beyond = future[-1] + np.arange(max(int(DAY_S // self.step_s) - horizon, 0) + 1)
        seasonal = self._naive_log(log_rate, beyond, self._calendar)
        seasonal = seasonal[: np.argmax(np.isnan(seasonal))] if np.isnan(seasonal).any() else seasonal
        outlook = self.from_log(seasonal[1:])
        return _with(
            fc, fit_seconds=self.fit_seconds, extras={"blend_weight_prophet": float(np.mean(w[:, 0]))}, outlook=outlook
        )


class _HeldOut:
    """The held-out origins of a blend's fit, what then arrived at each step of the horizon, and the error a
    forecast of it makes."""

    def __init__(self, forecaster: ProphetForecaster, origins: np.ndarray, n: int):
        self.origins = origins
        self.steps = np.arange(1, forecaster.horizon + 1)
        target = np.stack([forecaster.log_rate[np.minimum(origins + h, n - 1)] for h in self.steps], axis=1)
        target[origins[:, None] + self.steps[None, :] >= n] = np.nan
        self.target = target
        self.actual = forecaster.from_log(target)
        self._from_log = forecaster.from_log

    def mae(self, log_pred: np.ndarray) -> np.ndarray:
        """Per step, the mean absolute error on the rate scale, NaN ignored (``np.nanmean``'s sums, without its
        copies: dozens of calls a fit, each on an (origins x steps) array)."""
        error = self._from_log(log_pred) - self.actual
        np.abs(error, out=error)
        unknown = np.isnan(error)
        error[unknown] = 0.0
        with np.errstate(invalid="ignore"):  # a step no origin reaches has no error: NaN, as nanmean gives
            return error.sum(axis=0) / np.count_nonzero(~unknown, axis=0)


def _with(fc: Forecast, **changes) -> Forecast:
    from dataclasses import replace

    return replace(fc, **changes)
