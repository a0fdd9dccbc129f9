"""Traffic forecasters by name: the Prophet-based default and the cheap baselines.

``FORECASTERS`` is the registry: a forecaster is added with its class (see
``base.Forecaster`` for the contract) and one line below.  Everything that
names a forecaster (the pipeline's ``forecaster``, ``kale forecast
--model``, the backtest) reads it from here.
"""

from __future__ import annotations

from collections.abc import Callable

from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast.base import Forecast, Forecaster
from kale_dagster.forecast.naive import DAY_S, WEEK_S, EwmaForecaster, SeasonalNaiveForecaster
from kale_dagster.forecast.prophet import ProphetForecaster

#: name -> factory(horizon_s, interval_width, **options)
FORECASTERS: dict[str, Callable[..., Forecaster]] = {
    "prophet": lambda horizon_s, interval_width, **o: ProphetForecaster(
        horizon_s=horizon_s, interval_width=interval_width, **o
    ),
    "prophet-plain": lambda horizon_s, interval_width, **o: ProphetForecaster(
        horizon_s=horizon_s, interval_width=interval_width, correct=False, **o
    ),
    "seasonal-naive": lambda horizon_s, interval_width, **o: SeasonalNaiveForecaster(
        WEEK_S, interval_width=interval_width, **o
    ),
    "seasonal-naive-day": lambda horizon_s, interval_width, **o: SeasonalNaiveForecaster(
        DAY_S, interval_width=interval_width, **o
    ),
    "seasonal-naive-week": lambda horizon_s, interval_width, **o: SeasonalNaiveForecaster(
        WEEK_S, interval_width=interval_width, **o
    ),
    "ewma": lambda horizon_s, interval_width, **o: EwmaForecaster(interval_width=interval_width, **o),
}


def make_forecaster(name: str, horizon_s: float = 7200.0, interval_width: float = 0.8, **options) -> Forecaster:
    """A fresh forecaster by registered name; ``seasonal-naive`` means a week earlier."""
    if name not in FORECASTERS:
        raise KaleConfigError("forecaster", f"unknown forecaster {name!r}; choose one of {', '.join(FORECASTERS)}")
    return FORECASTERS[name](horizon_s, interval_width, **options)


__all__ = [
    "FORECASTERS",
    "Forecast",
    "Forecaster",
    "EwmaForecaster",
    "ProphetForecaster",
    "SeasonalNaiveForecaster",
    "make_forecaster",
]
