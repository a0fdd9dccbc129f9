"""Validate and regularise an arrival-rate history before any model sees it.

Input: a DataFrame with a ``timestamp`` column (anything pandas parses; naive
times are read as UTC) and a ``rate`` column (samples/s).  Output: the same
columns on a regular grid, sorted, UTC.

What is handled and what is rejected, so models can assume clean input:

* unsorted rows are sorted; duplicate timestamps are averaged;
* NaN rates are missing data; gaps of up to ``max_fill_steps`` steps are
  filled by linear interpolation, longer gaps stay NaN (models skip them);
* negative or infinite rates are rejected: they mean a broken metric, and
  silently clipping them would hide it;
* numeric timestamps are epoch seconds, milliseconds, microseconds or
  nanoseconds, told apart by their magnitude (``parse_timestamps``); a
  unit that puts them outside 1990-2100 is refused, naming the unit assumed;
* a grid of more than ``MAX_GRID_POINTS`` steps (a step of seconds over
  years, or a stray timestamp far from the rest) is refused before it is
  built.
"""

from __future__ import annotations

import warnings
from typing import Literal, cast

import numpy as np
import pandas as pd

from kale_dagster.errors import InputDataError

#: The most steps a regular history may have: a year of one-second steps, about 250 MB of grid.
MAX_GRID_POINTS = 366 * 86_400
#: Epoch timestamps are read in the unit their magnitude says: below 1e11 seconds (until the year 5138), below
#: 1e14 milliseconds, below 1e17 microseconds, else nanoseconds.
_UNIT_LIMITS: tuple[tuple[float, Literal["s", "ms", "us"]], ...] = ((1e11, "s"), (1e14, "ms"), (1e17, "us"))
_PLAUSIBLE = (pd.Timestamp("1990-01-01", tz="UTC"), pd.Timestamp("2100-01-01", tz="UTC"))


def parse_timestamps(values: pd.Series, name: str = "timestamp") -> pd.Series:
    """UTC timestamps from ISO text or epoch numbers (their unit detected from the magnitude); an error that
    says which unit was assumed when the result is not a plausible date."""
    if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
        try:
            with warnings.catch_warnings():  # pandas warns when the first value sets no format; each is parsed anyway
                warnings.simplefilter("ignore", UserWarning)
                return pd.to_datetime(values, utc=True)
        except (ValueError, TypeError, OverflowError) as exc:
            raise InputDataError(f"{name}: values that are not timestamps ({exc})") from None
    numbers = pd.to_numeric(values, errors="coerce").astype(float)
    if not np.isfinite(numbers.to_numpy()).all():
        raise InputDataError(f"{name}: epoch timestamps must be finite numbers")
    top = float(numbers.abs().max())
    unit: Literal["s", "ms", "us", "ns"] = "ns"
    for limit, candidate in _UNIT_LIMITS:
        if top < limit:
            unit = candidate
            break
    try:
        stamps = pd.to_datetime(numbers, unit=unit, utc=True)
    except (ValueError, OverflowError):
        stamps = None
    if stamps is None or stamps.min() < _PLAUSIBLE[0] or stamps.max() > _PLAUSIBLE[1]:
        raise InputDataError(
            f"{name}: read as epoch {unit} (from their magnitude, up to {top:.4g}) they fall outside 1990-2100; "
            "give ISO 8601 timestamps or epoch seconds, milliseconds, microseconds or nanoseconds"
        )
    return stamps


def infer_step_s(timestamps: pd.Series) -> float:
    """The most common spacing between consecutive timestamps, in seconds."""
    diffs = timestamps.sort_values().diff().dropna().dt.total_seconds()
    diffs = diffs[diffs > 0]
    if diffs.empty:
        raise InputDataError("cannot infer the sampling step: need at least two distinct timestamps")
    return float(diffs.mode().iloc[0])


def prepare_history(history: pd.DataFrame, step_s: float | None = None, max_fill_steps: int = 5) -> pd.DataFrame:
    """Return a clean, regular ``timestamp``/``rate`` frame (see module docstring)."""
    if not isinstance(history, pd.DataFrame):
        raise InputDataError(f"history must be a pandas DataFrame, got {type(history).__name__}")
    missing = {"timestamp", "rate"} - set(history.columns)
    if missing:
        raise InputDataError(
            f"history needs columns 'timestamp' and 'rate'; missing {sorted(missing)} (have {list(history.columns)})"
        )
    if history.empty:
        raise InputDataError("history is empty")
    ts, rate = history["timestamp"], history["rate"]
    # A forecaster re-reads a growing history every few minutes, mostly already typed and clean: checked on arrays.
    utc = isinstance(ts.dtype, pd.DatetimeTZDtype) and str(ts.dtype.tz) == "UTC"
    typed = utc and rate.dtype == np.float64
    if not utc:
        ts = parse_timestamps(ts, "history.timestamp")
    if rate.dtype != np.float64:
        rate = pd.to_numeric(rate, errors="coerce").astype(float)
    values = rate.to_numpy()
    bad = np.isinf(values) | (values < 0)
    if bad.any():
        first = int(np.argmax(bad))
        raise InputDataError(
            f"history.rate must be finite and >= 0; {int(bad.sum())} bad values, first at {ts.iloc[first]} "
            f"({values[first]})"
        )
    if not _is_regular(ts, values, step_s):
        return _regularise(ts, rate, step_s, max_fill_steps)
    if typed and list(history.columns) == ["timestamp", "rate"] and history.index.equals(pd.RangeIndex(len(history))):
        # Already clean, as a growing history re-read every few minutes mostly is: a shallow copy, which
        # copy-on-write keeps apart from the caller's frame, instead of a new frame of the same values.
        return history.copy(deep=False)
    return pd.DataFrame({"timestamp": pd.DatetimeIndex(ts), "rate": np.array(values, dtype=float)})


def _regularise(ts: pd.Series, rate: pd.Series, step_s: float | None, max_fill_steps: int) -> pd.DataFrame:
    """Sorted, duplicates averaged, on a regular grid, short gaps filled.

    In numpy, as pandas' groupby and resample would do it (bins from midnight UTC of the first day, labelled by
    their left edge, NaN ignored): a live history is irregular (readings at wall times) and is regularised at
    every decision."""
    index = pd.DatetimeIndex(ts)
    unit, stamps, values = index.unit, index.asi8, rate.to_numpy(dtype=float)  # epoch counts in the column's unit
    tick = pd.Timedelta(np.timedelta64(1, unit))
    order = np.argsort(stamps, kind="stable")
    unique, position = np.unique(stamps[order], return_inverse=True)
    means = _bin_means(position, values[order], len(unique))
    if np.isnan(means).all():
        raise InputDataError("history has no usable (non-NaN) rate values")
    step = step_s or _mode_step_s(unique, tick)
    first, last = index.min(), index.max()
    points = (last - first).total_seconds() / step
    if points > MAX_GRID_POINTS:
        raise InputDataError(
            f"the history from {first} to {last} at a {step:g} s step is {points:,.0f} steps, over "
            f"the {MAX_GRID_POINTS:,} a history may have: check for a stray timestamp, or resample to a longer step"
        )
    try:
        step_count = pd.Timedelta(seconds=step).as_unit(unit) // tick
    except (OverflowError, ValueError) as exc:  # a step of centuries: pandas cannot build the grid
        raise InputDataError(
            f"cannot put the history on a regular {step:g} s grid from {first} to {last}; check the timestamps ({exc})"
        ) from None
    if step_count < 1:
        raise InputDataError(f"a {step:g} s step is finer than the timestamps' unit ({unit}); give a longer step")
    day = pd.Timedelta(days=1) // tick
    origin = int(unique[0]) - int(unique[0]) % day  # bins from midnight UTC of the first day, as resample's
    bins = (unique - origin) // step_count
    regular = _fill_short_gaps(_bin_means(bins - bins[0], means, int(bins[-1] - bins[0]) + 1), max_fill_steps)
    grid = (origin + (bins[0] + np.arange(len(regular))) * step_count).astype(f"datetime64[{unit}]")
    return pd.DataFrame({"timestamp": pd.DatetimeIndex(grid).tz_localize("UTC"), "rate": regular})


def _bin_means(bins: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """The mean of the non-NaN ``values`` in each of ``size`` bins (NaN for a bin with none)."""
    known = ~np.isnan(values)
    sums = np.bincount(bins, weights=np.where(known, values, 0.0), minlength=size)
    counts = np.bincount(bins, weights=known.astype(float), minlength=size)
    return np.divide(sums, counts, out=np.full(size, np.nan), where=counts > 0)


def _mode_step_s(unique: np.ndarray, tick: pd.Timedelta) -> float:
    """``infer_step_s`` on sorted, distinct epoch counts of ``tick``."""
    diffs = np.diff(unique)
    if not len(diffs):
        raise InputDataError("cannot infer the sampling step: need at least two distinct timestamps")
    spacings, counts = np.unique(diffs, return_counts=True)
    return (tick * int(spacings[np.argmax(counts)])).total_seconds()


def _is_regular(ts: pd.Series, rate: np.ndarray, step_s: float | None) -> bool:
    """Whether the history is already clean: sorted, one row per step on the step's grid, no gaps (UTC ``ts``)."""
    if len(ts) < 2 or np.isnan(rate).any():
        return False
    stamps = pd.DatetimeIndex(ts).asi8  # in the column's own unit
    first_step = int(stamps[1] - stamps[0])
    if first_step <= 0 or np.any(np.diff(stamps) != first_step):
        return False
    per_second = pd.Timedelta(1, unit="s") // pd.Timedelta(1, unit=cast(pd.DatetimeTZDtype, ts.dtype).unit)
    if step_s is not None and first_step != step_s * per_second:
        return False
    # On the grid resampling would put it on: whole steps from midnight (UTC, so midnight is a whole day in epoch time).
    return int(stamps[0]) % (86_400 * per_second) % first_step == 0


def _fill_short_gaps(values: np.ndarray, max_steps: int) -> np.ndarray:
    """Interpolate runs of at most ``max_steps`` missing values between known ones; longer runs stay missing."""
    missing = np.isnan(values)
    known = np.flatnonzero(~missing)
    if not missing.any() or len(known) < 2:
        return values
    starts = np.flatnonzero(missing & ~np.r_[False, missing[:-1]])
    ends = np.flatnonzero(missing & ~np.r_[missing[1:], False])
    short_inside = (ends - starts + 1 <= max_steps) & (starts > known[0]) & (ends < known[-1])
    fill = np.zeros(len(values), dtype=bool)
    fill[missing] = np.repeat(short_inside, ends - starts + 1)
    filled = values.copy()
    filled[fill] = np.interp(np.flatnonzero(fill), known, values[known])
    return filled


def read_trace_csv(path) -> pd.DataFrame:
    """Read a ``timestamp,value`` trace (values are arrivals per interval) as a rate history."""
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace file not found: {p}")
    try:
        raw = pd.read_csv(p)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputDataError(f"{p}: not a readable CSV ({exc})") from exc
    if list(raw.columns[:2]) != ["timestamp", "value"]:
        raise InputDataError(f"{p}: expected a header 'timestamp,value', got {','.join(map(str, raw.columns))}")
    if raw.empty:
        raise InputDataError(f"{p}: the trace has no rows")
    try:
        ts = parse_timestamps(raw["timestamp"])
    except InputDataError as exc:
        raise InputDataError(f"{p}: {exc}") from None
    values = pd.to_numeric(raw["value"], errors="coerce")
    if values.isna().any():
        row = int(values.isna().to_numpy().nonzero()[0][0]) + 2
        raise InputDataError(f"{p}: line {row}: value {raw['value'].iloc[row - 2]!r} is not a number")
    try:
        step = infer_step_s(ts)
        return prepare_history(pd.DataFrame({"timestamp": ts, "rate": values / step}), step_s=step)
    except InputDataError as exc:  # say which file, as every other message here does
        raise InputDataError(f"{p}: {exc}") from None
