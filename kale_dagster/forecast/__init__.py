"""Traffic forecasters: Prophet-based default, seasonal-naive and EWMA baselines."""

from __future__ import annotations

from .base import Forecast, Forecaster
from .naive import DAY_S, WEEK_S, EwmaForecaster, SeasonalNaiveForecaster
from .prophet import ProphetForecaster

#: Names accepted by the CLI and pipeline config.
MODELS = ("prophet", "prophet-plain", "seasonal-naive", "seasonal-naive-day", "seasonal-naive-week", "ewma")


def make_forecaster(name: str, horizon_s: float = 7200.0, interval_width: float = 0.8, **options) -> Forecaster:
    """Build a forecaster by name; ``seasonal-naive`` means a week earlier."""
    if name == "prophet":
        return ProphetForecaster(horizon_s=horizon_s, interval_width=interval_width, **options)
    if name == "prophet-plain":
        return ProphetForecaster(horizon_s=horizon_s, interval_width=interval_width, correct=False, **options)
    if name in ("seasonal-naive", "seasonal-naive-week"):
        return SeasonalNaiveForecaster(WEEK_S, interval_width=interval_width)
    if name == "seasonal-naive-day":
        return SeasonalNaiveForecaster(DAY_S, interval_width=interval_width)
    if name == "ewma":
        return EwmaForecaster(interval_width=interval_width, **options)
    from ..errors import KaleConfigError

    raise KaleConfigError("model", f"unknown forecaster {name!r}; choose one of {', '.join(MODELS)}")


__all__ = ["Forecast", "Forecaster", "EwmaForecaster", "ProphetForecaster", "SeasonalNaiveForecaster", "MODELS", "make_forecaster"]
