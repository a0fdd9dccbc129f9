"""The forecasts a simulated Kale sees over a trace, as the Dagster pipeline's refits and re-anchored forecasts
would give them (``ForecastFeed``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from kale_dagster.control.controller import arrivals_over_forecast
from kale_dagster.forecast.base import Forecast
from kale_dagster.forecast.evaluate import smape, smape_terms
from kale_dagster.sim.config import MINUTE, SimConfig


class ForecastFeed:
    """Kale's forecasts over a trace: refit on cadence, re-predicted from fresh history every ``forecast_every_s``.

    ``prior`` is what was recorded before the trace (the forecaster sees it, the simulated workers never did).
    What it forecasts depends on the trace alone, never on a policy's actions, so a backtest records it once and
    every run of a forecasting policy on that trace replays the same forecasts.  A refit starts afresh from the
    history alone, so the trace splits into refit periods (:meth:`periods`) that can be recorded apart, in parallel
    (:meth:`record_period`), and joined (:meth:`replay`).
    """

    def __init__(
        self,
        factory: Callable,
        times: pd.DatetimeIndex,
        rates: np.ndarray,
        cfg: SimConfig,
        prior: pd.DataFrame | None = None,
    ):
        self.factory = factory
        self.times = times
        self.rates = rates
        self.cfg = cfg
        self.prior = (
            prior if prior is not None else pd.DataFrame({"timestamp": pd.DatetimeIndex([], tz="UTC"), "rate": []})
        )
        self._every = max(int(cfg.forecast_every_s // MINUTE), 1)
        # What the forecaster has seen by minute m is this frame's first len(prior) + m rows.
        self._history = pd.concat([self.prior, pd.DataFrame({"timestamp": times, "rate": rates})], ignore_index=True)
        self._start(0)
        self._recorded: list | None = None

    def _start(self, minute: int) -> None:
        """Forget every fit: the next forecast, at ``minute`` or after, refits."""
        self.model, self.next_refit, self.forecast = None, minute, None
        self.one_step = np.full(len(self.rates), np.nan)  # per minute: the forecast made for it before it

    def _forecasts_at(self, minute: int) -> bool:
        return minute + len(self.prior) >= 2 and minute % self._every == 0

    def periods(self) -> list[tuple[int, int]]:
        """[start, stop) minutes, each starting with a refit (the first with what comes before any forecast)."""
        refits, next_refit = [], None
        for minute in range(len(self.rates)):
            if self._forecasts_at(minute) and (next_refit is None or minute >= next_refit):
                refits.append(minute)
                next_refit = minute + int(self.cfg.refit_every_s // MINUTE)
        bounds = [0] + [m for m in refits[1:]] + [len(self.rates)]
        return list(zip(bounds[:-1], bounds[1:]))

    def record_period(self, start: int, stop: int) -> tuple[list, np.ndarray]:
        """The forecasts of minutes [start, stop) of a period, and the one-step forecasts made in it."""
        self._start(start)
        forecasts = [self._predict(minute) for minute in range(start, stop)]
        return forecasts, self.one_step

    def replay(self, parts: list[tuple[list, np.ndarray]]) -> ForecastFeed:
        """Join recorded periods, in order; :meth:`update` then replays them.  The recent error is the same as live:
        at a minute it reads only predictions made at or before it."""
        self._recorded = [fc for forecasts, _ in parts for fc in forecasts]
        self.one_step = np.full(len(self.rates), np.nan)
        for _, one_step in parts:
            made = ~np.isnan(one_step)
            self.one_step[made] = one_step[made]
        self.factory = self.model = self._history = (
            None  # a replay needs none, and it travels to other processes without them
        )
        self._recent_errors = self._every_recent_error()
        return self

    def record(self) -> ForecastFeed:
        """Forecast the whole trace now, period by period."""
        return self.replay([self.record_period(*period) for period in self.periods()])

    def update(self, minute: int) -> Forecast | None:
        """Called at minute boundaries; ``minute`` observations are known."""
        return self._recorded[minute] if self._recorded is not None else self._predict(minute)

    def _predict(self, minute: int) -> Forecast | None:
        if not self._forecasts_at(minute):
            return self.forecast
        assert self._history is not None and self.factory is not None, "a replayed feed predicts nothing"
        history = self._history.iloc[: len(self.prior) + minute]
        steps = max(int(self.cfg.forecast_horizon_s // MINUTE), 1)
        if self.model is None or minute >= self.next_refit:
            self.model = self.factory().fit(history)
            self.next_refit = minute + int(self.cfg.refit_every_s // MINUTE)
            fc = self.model.predict(steps)
        else:
            fc = self.model.predict(steps, history=history)
        self.forecast = fc
        ahead = fc.point[: min(self._every, len(self.rates) - minute)]
        self.one_step[minute : minute + len(ahead)] = ahead
        return fc

    def recent_error(self, minute: int) -> float | None:
        """sMAPE of the one-step forecasts over the error window before ``minute``; None until half of it has one."""
        if self._recorded is not None:
            error = self._recent_errors[minute]
            return None if np.isnan(error) else float(error)
        return self._window_error(minute)

    def recent_ratio(self, minute: int) -> float | None:
        """What arrived over the ratio window before ``minute`` divided by what its one-step forecasts said would;
        None until half of it has one."""
        pairs = self._window_pairs(minute, self.cfg.ratio_window_s)
        return arrivals_over_forecast(*pairs) if pairs is not None else None

    def _window_error(self, minute: int) -> float | None:
        """:meth:`recent_error` from the one-step forecasts made so far."""
        pairs = self._window_pairs(minute, self.cfg.error_window_s)
        return smape(*pairs) if pairs is not None else None

    def _window_pairs(self, minute: int, window_s: float) -> tuple[np.ndarray, np.ndarray] | None:
        """(arrived, forecast) of the minutes within ``window_s`` before ``minute`` that had a one-step forecast; None
        until half of them had one."""
        window = int(window_s // MINUTE)
        lo = max(minute - window, 0)
        predicted = self.one_step[lo:minute]
        made = ~np.isnan(predicted)
        if np.count_nonzero(made) < window // 2:
            return None
        return self.rates[lo:minute][made], predicted[made]

    def _every_recent_error(self) -> np.ndarray:
        """:meth:`recent_error` at every minute (NaN for None) from the recorded one-step forecasts: windows that
        are all forecast at once (numpy's mean of each, the same figures), the others one by one."""
        window, n = int(self.cfg.error_window_s // MINUTE), len(self.rates)
        made = ~np.isnan(self.one_step)
        minutes = np.arange(n)
        lo = np.maximum(minutes - window, 0)
        count = np.concatenate([[0], np.cumsum(made)])
        known = count[minutes] - count[lo]
        whole = (minutes >= window) & (known == window)
        terms = smape_terms(self.rates, np.where(made, self.one_step, 0.0))
        out = np.full(n, np.nan)
        if n > window:
            out[window:] = np.where(
                whole[window:], sliding_window_view(terms, window)[: n - window].mean(axis=1), np.nan
            )
        for minute in np.flatnonzero(~whole & (known >= window // 2) & (known > 0)):
            out[minute] = self._window_error(int(minute))
        return out
