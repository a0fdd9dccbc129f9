"""PNG plots for the CLI and for Dagster asset metadata (matplotlib, headless)."""

from __future__ import annotations

import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def plot_backtest(timelines: dict[str, pd.DataFrame], slo_minutes: float, path) -> Path:
    """Arrivals and capacity per policy (top), lag per policy against the SLO (bottom)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    first = next(iter(timelines.values()))
    top.plot(first["time"], first["arrival_rate"], color="black", lw=1, label="arrivals")
    for name, tl in timelines.items():
        top.plot(tl["time"], tl["capacity"], lw=0.9, label=f"{name} capacity")
        bottom.plot(tl["time"], tl["lag_s"] / 60, lw=0.9, label=name)
    bottom.axhline(slo_minutes, color="red", ls="--", lw=1, label="SLO")
    top.set_ylabel("samples/s")
    bottom.set_ylabel("lag (min)")
    top.legend(loc="upper left", fontsize=8)
    bottom.legend(loc="upper left", fontsize=8)
    top.set_title("Backtest: arrivals, capacity and lag per policy")
    return _save(fig, path)


def plot_forecast(
    history: pd.DataFrame,
    forecast_frame: pd.DataFrame,
    path,
    title: str = "Traffic forecast",
    lookback: pd.Timedelta | None = pd.Timedelta(days=2),
) -> Path:
    """Recent history, point forecast and band."""
    fig, ax = plt.subplots(figsize=(10, 4))
    hist = history
    if lookback is not None and len(history):
        hist = history[history["timestamp"] >= history["timestamp"].iloc[-1] - lookback]
    ax.plot(hist["timestamp"], hist["rate"], color="black", lw=1, label="measured")
    ax.plot(forecast_frame["timestamp"], forecast_frame["point"], color="tab:blue", lw=1.5, label="forecast")
    ax.fill_between(
        forecast_frame["timestamp"],
        forecast_frame["lower"],
        forecast_frame["upper"],
        color="tab:blue",
        alpha=0.25,
        label="band",
    )
    ax.set_ylabel("samples/s")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, path)


def plot_allocation(stream: pd.DataFrame, plan_times, plan_workers, slo_minutes: float, path, title: str) -> Path:
    """Workers over time with the plan ahead (top), time lag against the SLO (bottom)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    if "workers" in stream and stream["workers"].notna().any():
        top.step(stream["timestamp"], stream["workers"], where="post", color="black", lw=1.2, label="workers")
    top.step(plan_times, plan_workers, where="post", color="tab:blue", lw=1.5, ls="--", label="plan")
    top.set_ylabel("workers")
    top.legend(loc="upper left", fontsize=8)
    bottom.plot(stream["timestamp"], stream["time_lag_s"] / 60, color="tab:orange", lw=1, label="time lag")
    bottom.axhline(slo_minutes, color="red", ls="--", lw=1, label="SLO")
    bottom.set_ylabel("lag (min)")
    bottom.legend(loc="upper left", fontsize=8)
    top.set_title(title)
    return _save(fig, path)


def _save(fig, path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


#: Plots kept per pipeline and kind: a day of the allocation plot at its 10-minute cadence.
KEEP_PLOTS = 144


def plot_file(directory, pipeline: str, what: str, at: float) -> Path:
    """Where the ``what`` plot made at ``at`` goes: ``<directory>/<pipeline>/<what>-<UTC time>.png``.  The event
    log keeps only this path (an inline image cost about 52 KB an event); the oldest beyond ``KEEP_PLOTS`` go."""
    folder = Path(directory) / pipeline
    kept = sorted(folder.glob(f"{what}-*.png"))
    for old in kept[: max(len(kept) - KEEP_PLOTS + 1, 0)]:
        old.unlink(missing_ok=True)
    return folder / f"{what}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(at))}.png"


def plot_metadata(fig_path):
    """A plot file as metadata: its path (the UI's Plots tab charts the numeric metadata beside it)."""
    from dagster import MetadataValue

    return MetadataValue.path(str(fig_path))
