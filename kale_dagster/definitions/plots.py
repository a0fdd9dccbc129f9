"""PNG plots for the CLI and for Dagster asset metadata (matplotlib, headless)."""

from __future__ import annotations

import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def plot_backtest(timelines: dict[str, pd.DataFrame], slo_minutes: float, path) -> Path:
    """The arrivals (top row), then one row per policy: its workers, each restart a marker, its lag against the
    SLO on the right axis; the warm-up (not scored) shaded, and the scored totals in each row's title."""
    fig, axes = plt.subplots(len(timelines) + 1, 1, figsize=(12, 1.9 * (len(timelines) + 1)), sharex=True)
    # A policy that neither forecasts nor learns starts a day before scoring (``BacktestSettings.lead_in_days``):
    # the arrivals and the warm-up are drawn from the longest timeline.
    longest = max(timelines.values(), key=len)
    warmup = longest["time"][~longest["scored"].astype(bool)]
    axes[0].plot(longest["time"], longest["arrival_rate"], color="black", lw=0.8)
    axes[0].set_ylabel("samples/s")
    axes[0].set_title("arrivals", fontsize=9, loc="left")
    for ax, (name, tl) in zip(axes[1:], timelines.items()):
        in_score = tl["scored"].astype(bool)
        scored = tl[in_score]
        changed = tl["workers"].diff().fillna(0) != 0
        ax.step(tl["time"], tl["workers"], where="post", color="tab:blue", lw=1)
        ax.plot(tl["time"][changed], tl["workers"][changed], "v", color="tab:blue", ms=3)
        ax.set_ylabel("workers")
        lag = ax.twinx()
        lag.plot(tl["time"], tl["lag_s"] / 60, color="tab:orange", lw=0.7)
        lag.axhline(slo_minutes, color="red", ls="--", lw=0.8)
        lag.set_ylabel("lag (min)", fontsize=8)
        gpu_h = float(scored["workers"].sum()) / 60
        restarts = int(changed[in_score].sum())
        lag_min = float(scored["lag_s"].sum()) / 60  # a row a minute: minutes of lag, summed, are lag-minutes
        ax.set_title(
            f"{name}: {gpu_h:,.0f} GPU h, {lag_min:,.0f} lag-min, {restarts} restarts (scored span)",
            fontsize=9,
            loc="left",
        )
    if len(warmup):
        for ax in axes:
            ax.axvspan(warmup.iloc[0], warmup.iloc[-1], color="grey", alpha=0.15, lw=0)
    fig.suptitle(
        f"Backtest: workers per policy (markers: restarts), lag against the {slo_minutes:g}-minute SLO (dashed); "
        "shaded: warm-up, not scored",
        fontsize=10,
    )
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
    """Workers that ran and workers decided (in advisory mode: what Kale would have run) over time, with the plan
    ahead (top); time lag against the SLO (bottom)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    if "workers" in stream and stream["workers"].notna().any():
        top.step(stream["timestamp"], stream["workers"], where="post", color="black", lw=1.2, label="ran")
    if "decided_workers" in stream and stream["decided_workers"].notna().any():
        top.step(stream["timestamp"], stream["decided_workers"], where="post", color="tab:blue", lw=1, label="decided")
    top.step(plan_times, plan_workers, where="post", color="tab:blue", lw=1.5, ls="--", label="plan")
    top.set_ylabel("workers")
    top.legend(loc="upper left", fontsize=8)
    bottom.plot(stream["timestamp"], stream["time_lag_s"] / 60, color="tab:orange", lw=1, label="time lag")
    bottom.axhline(slo_minutes, color="red", ls="--", lw=1, label="SLO")
    bottom.set_ylabel("lag (min)")
    bottom.legend(loc="upper left", fontsize=8)
    top.set_title(title)
    return _save(fig, path)


def plot_savings(ran: pd.DataFrame, kale: pd.DataFrame, slo_minutes: float, path, title: str) -> Path:
    """The savings report's span: the recorded arrivals (top), the workers that ran and Kale's simulated ones
    (middle), the lag of each against the SLO (bottom)."""
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(11, 7), sharex=True)
    scored = kale[kale["scored"].astype(bool)]
    top.plot(ran["timestamp"], ran["arrival_rate"], color="black", lw=0.8)
    top.set_ylabel("arrivals/s")
    middle.step(ran["timestamp"], ran["workers"], where="post", color="black", lw=1.2, label="ran")
    middle.step(scored["time"], scored["workers"], where="post", color="tab:blue", lw=1, label="Kale (simulated)")
    middle.set_ylabel("workers")
    middle.legend(loc="upper left", fontsize=8)
    bottom.plot(ran["timestamp"], ran["time_lag_s"] / 60, color="black", lw=0.8, label="ran")
    bottom.plot(scored["time"], scored["lag_s"] / 60, color="tab:blue", lw=0.8, label="Kale (simulated)")
    bottom.axhline(slo_minutes, color="red", ls="--", lw=1, label="SLO")
    bottom.set_ylabel("lag (min)")
    bottom.legend(loc="upper left", fontsize=8)
    top.set_title(title, fontsize=9, loc="left")
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
