"""The savings report: what ran on a pipeline's own traffic, beside what Kale and the best tuned baselines would
have run on it, each simulated figure with the simulator's measured error.

A team adopts an autoscaler after watching it (AWS predictive scaling starts forecast-only and charts what it
would have done).  The report answers the question they ask of that watching: over the last days, what did we
run and how far behind were we, and what would Kale have cost and risked instead?

- What ran comes from the metrics history alone: every reading's workers and time lag, each holding until the
  next (``sim.metrics.score_readings``); a restart is a change in the workers that ran, downtime the readings
  that saw a restart or a rebalance under way.
- What Kale and the baselines would have run is the recorded arrivals replayed in the simulator, with F(w)
  fitted on the throughput the pipeline measured and the restart time measured from its restarts (the
  declared one when none was seen, and the report says so).  The baselines are each one's best setting of
  the grid its users would tune, by Kale's objective, as in every comparison (``sim.comparison``).
- The simulator is not the world: each simulated figure carries its error as a band, the largest relative
  error ``bench/end_to_end.py`` measured between live and simulated runs of the policies compared here
  (``simulator_error.json``).  A saving inside the band is reported as none.

The report refuses what it cannot support (too short a history, no throughput measured) and says what is
missing, rather than print a figure.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from kale_dagster.model.limits import Limits
from kale_dagster.model.restarts import RestartSpans
from kale_dagster.model.throughput import ThroughputModel, estimate_throughput
from kale_dagster.sim.metrics import objective, score_readings

if TYPE_CHECKING:
    from kale_dagster.sim.backtest import BacktestSettings

DAY_S = 86_400.0
#: The scored span a report needs at least, and the forecaster's history before it that it uses at most.
MIN_SCORED_HOURS = 3.0
MAX_WARMUP_DAYS = 2.0
#: Minutes over the SLO beyond what ran by more than this share (and a minute) make a GPU saving a trade, said so.
SLO_MARGIN = 0.1
#: Readings further apart than this are a gap in the history (the sensor stopped), not one long reading.
GAP_READINGS = 5


class ReportRefused(RuntimeError):
    """The history cannot support a report; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class SimulatorError:
    """The simulator's relative error per figure, measured live against simulated (``bench/end_to_end.py``)."""

    gpu_hours: float
    accumulated_lag_minutes: float
    measured: str  # where and when: the bench, its commit, the policies

    @classmethod
    def shipped(cls) -> SimulatorError:
        """The band this version ships with: the largest error over the policies the report simulates."""
        saved = json.loads(resources.files("kale_dagster.sim").joinpath("simulator_error.json").read_text())
        errors = saved["relative_error"]
        return cls(
            gpu_hours=max(abs(e["gpu_hours"]) for e in errors.values()),
            accumulated_lag_minutes=max(abs(e["accumulated_lag_minutes"]) for e in errors.values()),
            measured=f"{saved['bench']} at {saved['commit']} ({', '.join(errors)})",
        )

    def band(self, figure: str) -> float | None:
        return getattr(self, figure, None)


@dataclass(frozen=True)
class Inputs:
    """What the simulated part of the report was given, as the report states it."""

    model: str  # F(w) and where it came from
    restart: str  # the restart time and where it came from
    readings: int
    warmup_hours: float  # the forecaster's history before the scored span


@dataclass(frozen=True)
class SavingsReport:
    """What ran and what each policy would have run over ``start``-``end`` (epoch seconds, pipeline time)."""

    pipeline: str
    start: float
    end: float
    ran: dict  # PaperMetrics' figures and minutes_over_slo
    kale: dict
    baselines: dict[str, dict]  # name -> its best setting's figures and "setting"
    error: SimulatorError
    inputs: Inputs

    @property
    def hours(self) -> float:
        return (self.end - self.start) / 3600.0

    def gpu_hours_saved(self) -> tuple[float, float, float]:
        """Kale's saving over what ran as a share of what ran: (point, low, high), the range from the band."""
        ran, kale, e = self.ran["gpu_hours"], self.kale["gpu_hours"], self.error.gpu_hours
        if ran <= 0:
            return 0.0, 0.0, 0.0
        return 1 - kale / ran, 1 - kale * (1 + e) / ran, 1 - kale * (1 - e) / ran

    def summary(self) -> str:
        """One line for the UI and the terminal."""
        point, low, high = self.gpu_hours_saved()
        if low <= 0 <= high:
            gpu = f"about the GPU-hours that ran (within the simulator's {self.error.gpu_hours:.0%})"
        else:
            least, most = sorted((abs(low), abs(high)))
            gpu = f"{abs(point):.0%} {'fewer' if point > 0 else 'more'} GPU-hours ({least:.0%}-{most:.0%})"
        over_kale, over_ran = self.kale["minutes_over_slo"], self.ran["minutes_over_slo"]
        # GPU-hours saved by more time over the SLO are not a saving: said first, as the trade it is.
        worse = over_kale > over_ran * (1 + SLO_MARGIN) + 1
        return (
            f"Kale would have used {gpu}, {'but ' if worse and point > 0 else ''}{over_kale:,.0f} min over the SLO "
            f"against {over_ran:,.0f} that ran{': not a saving at the same service' if worse and point > 0 else ''} "
            f"({self.hours:,.0f} h of {self.pipeline})"
        )

    def to_json(self) -> dict:
        out = asdict(self)
        out["summary"] = self.summary()
        out["gpu_hours_saved"] = dict(zip(("point", "low", "high"), self.gpu_hours_saved()))
        return out


def what_ran(stream: pd.DataFrame, start: float, end: float, slo_s: float) -> dict:
    """The paper's figures of the readings in [start, end]: each reading's workers and lag hold until the next
    (a gap in the readings holds nothing: it is left out), restarts are changes in the workers that ran."""
    rows = stream[(stream["ts"] >= start) & (stream["ts"] <= end) & stream["workers"].notna()]
    if rows.empty:
        raise ReportRefused("no reading with the workers that ran in the span")
    t = rows["ts"].to_numpy(dtype=float)
    dt = np.diff(np.append(t, end))
    interval = float(np.median(dt)) if len(dt) > 1 else dt[0]
    held = np.minimum(dt, GAP_READINGS * interval)  # a reading holds at most a few intervals across a gap
    workers = rows["workers"].to_numpy(dtype=float)
    lag = rows["time_lag_s"].fillna(0.0).to_numpy(dtype=float)
    restarting = rows["restarting"].fillna(False).to_numpy(dtype=bool) if "restarting" in rows else np.zeros(len(t))
    minutes = np.cumsum(np.concatenate([[0.0], held[:-1]])) / 60.0
    m = score_readings(
        minutes,
        lag,
        workers,
        end_minute=float(held.sum()) / 60.0,
        slo_s=slo_s,
        downtime_minutes=float(held[restarting.astype(bool)].sum()) / 60.0,
        rescales=int(np.count_nonzero(np.diff(workers))),
    ).to_json()
    return {**m, "minutes_over_slo": m["slo_violation_rate"] * float(held.sum()) / 60.0}


def measured_restart_s(stream: pd.DataFrame, declared_s: float) -> tuple[float, str]:
    """The median length of the restarts the readings saw (runs of readings marked restarting), else the
    declared one, and where it came from."""
    if "restarting" not in stream or not stream["restarting"].fillna(False).any():
        return declared_s, f"declared {declared_s / 60:.1f} min (Limits.restart_minutes: no restart was recorded)"
    seen = RestartSpans()
    for on, ts in zip(stream["restarting"].fillna(False).astype(bool), stream["ts"].astype(float)):
        seen.saw(on, ts)
    lengths = list(seen.lengths)
    if not lengths:
        return declared_s, f"declared {declared_s / 60:.1f} min (the one restart recorded has not ended)"
    median = float(np.median(lengths))
    return median, f"measured {median / 60:.1f} min (median of {len(lengths)} restarts)"


def fitted_model(throughput: pd.DataFrame, prior: ThroughputModel, global_batch: float | None) -> ThroughputModel:
    """F(w) fitted on the throughput the pipeline measured; without enough of it the report is refused."""
    model, source = estimate_throughput(
        throughput["workers"],
        throughput["samples_per_s"],
        prior,
        form="sync" if global_batch else "async",
        global_batch=global_batch,
    )
    if source != "fitted":
        counts = sorted(int(w) for w in throughput["workers"].unique())
        raise ReportRefused(
            "no throughput model: the workers' throughput was measured at "
            + (f"{len(counts)} worker count(s) ({', '.join(map(str, counts))})" if counts else "no worker count")
            + f", and F(w) needs {'4' if global_batch else '3'}: profile the trainer at more sizes (`kale trainer "
            "profile --workers 1,2,4`), or let the group run at more sizes (its throughput is measured while it "
            "falls behind its arrivals)"
        )
    return model


def scored_span(stream: pd.DataFrame, window_start: float, end: float) -> tuple[float, float]:
    """The span scored, and the forecaster's warm-up before it: the history before the window up to
    ``MAX_WARMUP_DAYS``, or, when the history begins inside the window, its first half up to that."""
    first = float(stream["ts"].iloc[0])
    before = window_start - first
    warmup = min(MAX_WARMUP_DAYS * DAY_S, before if before > 0 else (end - first) / 2)
    start = max(window_start, first + warmup)
    if (end - start) / 3600.0 < MIN_SCORED_HOURS:
        raise ReportRefused(
            f"not enough history: {(end - first) / 3600.0:.1f} h of stream metrics, and the report needs "
            f"{MIN_SCORED_HOURS:g} h scored after the forecaster's warm-up; let the metrics sensor run longer "
            "or backfill the arrivals (kale history backfill)"
        )
    return start, warmup


def savings_report(
    pipeline: str,
    stream: pd.DataFrame,
    throughput: pd.DataFrame,
    limits: Limits,
    *,
    days: float,
    end: float,
    prior: ThroughputModel,
    global_batch: float | None = None,
    forecaster: str = "prophet",
    policy: str = "kale",
    baselines: tuple[str, ...] = ("hpa", "keda"),
    error: SimulatorError | None = None,
    processes: int | None = None,
) -> tuple[SavingsReport, pd.DataFrame]:
    """The report over the ``days`` before ``end``, and Kale's simulated timeline (for the plot).  ``policy`` is
    the pipeline's own (Kale or a variant of it); ``baselines`` are registered policies, each at its best setting
    of its sweep by Kale's objective (the simulator's error is measured for the HPA, not for KEDA)."""
    from kale_dagster.sim.backtest import BacktestSettings

    stream = stream[stream["ts"] <= end].reset_index(drop=True)
    arrivals = stream[stream["arrival_rate"].notna()]
    if arrivals.empty:
        raise ReportRefused("no recorded arrivals: the metrics sensor has not read the stream yet")
    ran_from = stream.loc[stream["workers"].notna(), "ts"]
    if ran_from.empty:
        raise ReportRefused("no reading recorded the workers that ran: is the metrics sensor deciding?")
    # The span begins at the first reading that knew the workers: earlier arrivals (a backfill) only warm up.
    start, warmup_s = scored_span(arrivals, max(end - days * DAY_S, float(ran_from.iloc[0])), end)
    model = fitted_model(throughput, prior, global_batch)
    restart_s, restart_source = measured_restart_s(stream, limits.restart_s)
    history = pd.DataFrame({"timestamp": arrivals["timestamp"], "rate": arrivals["arrival_rate"].astype(float)})
    history = history[arrivals["ts"] >= start - warmup_s].reset_index(drop=True)
    settings = BacktestSettings(
        limits=replace(limits, restart_minutes=restart_s / 60.0),
        peak_workers=limits.whole_pods(min(model.peak_workers(limits.max_workers), limits.max_workers)),
        warmup_days=(start - float(history["timestamp"].iloc[0].timestamp())) / DAY_S,
        forecaster=forecaster,
        model=model,
        scale_trace=False,
        processes=processes,
    )
    kale, best = _replay(history, settings, policy, baselines, (end - start) / 60.0)
    report = SavingsReport(
        pipeline=pipeline,
        start=start,
        end=end,
        ran=what_ran(stream, start, end, limits.slo_s),
        kale=_figures(kale.metrics.to_json(), (end - start) / 60.0),
        baselines=best,
        error=error or SimulatorError.shipped(),
        inputs=Inputs(
            model=f"{model.describe()} (fitted on {len(throughput)} measurements)",
            restart=restart_source,
            readings=int(((stream["ts"] >= start) & (stream["ts"] <= end)).sum()),
            warmup_hours=round(settings.warmup_days * 24, 2),
        ),
    )
    return report, kale.timeline


def _replay(history: pd.DataFrame, settings: BacktestSettings, policy: str, baselines: tuple[str, ...], minutes: float):
    """Kale's simulated run, and each baseline's best setting of its sweep by Kale's objective (its figures)."""
    from kale_dagster.policies import POLICIES
    from kale_dagster.sim.backtest import Backtest, Run

    bt = Backtest(history, settings)
    grid = [(name, label, options) for name in baselines for label, options in POLICIES[name].sweep(bt.sizing)]
    results, _ = bt.run_many([Run(policy)] + [Run(name, options) for name, _, options in grid], optimum=False)
    best: dict[str, dict] = {}
    for (name, label, _), result in zip(grid, results[1:]):
        row = {"setting": label, **_figures(result.metrics.to_json(), minutes)}
        if name not in best or objective(row, minutes) < objective(best[name], minutes):
            best[name] = row
    return results[0], best


def _figures(metrics: dict, minutes: float) -> dict:
    return {**metrics, "minutes_over_slo": metrics["slo_violation_rate"] * minutes}


def fmt_band(value: float, band: float | None) -> str:
    """``12.3 (11.8-12.8)``: a simulated figure with the simulator's error band."""
    if band is None or not math.isfinite(value):
        return f"{value:,.1f}"
    return f"{value:,.1f} ({value * (1 - band):,.1f}-{value * (1 + band):,.1f})"
