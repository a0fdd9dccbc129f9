"""Backtest Kale against HPA, KEDA and static, each tuned as its users would, on two traces.

1. a 14-day synthetic trace (seed 0), first 7 days warm-up;
2. ../shared/traces/nyc_taxi.csv (NAB), its last 35 days, first 7 warm-up;
3. with --dev, every other trace there, its last 14 days, first 7 warm-up.

Prints the paper's metrics per policy at its defaults, Kale planning with the
true F(w) and restart time (what estimating them costs), Kale with a perfect
forecast (its planning error alone), Kale with the paper's Algorithm 1
instead of our stabilizer, the offline optimum (perfect foresight), each
policy's cost over the optimum's (Kale's own objective), each baseline's
Pareto frontier over its swept grid, the headline (Kale against the best
setting with at least Kale's GPU hours, and against the default), any swept
setting that dominates Kale, and the wall time.

    python bench/backtest_vs_baselines.py [--traces DIR] [--skip-nyc] [--dev] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

from kale_dagster.forecast.history import prepare_history, read_trace_csv
from kale_dagster.policies import POLICIES
from kale_dagster.sim.backtest import Backtest, BacktestSettings
from kale_dagster.sim.comparison import KALE_VARIANTS, VARIANT_LABELS, compare
from kale_dagster.sim.trace import synth_trace

DEFAULT_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
# The rest of the development set runs Kale's perfect-forecast and stabilizer-planner variants only.
DEV_VARIANTS = ("kale_perfect_forecast", "kale_stabilizer")
ROW = "{:<34}{:>14,.0f}{:>10.2%}{:>10,.0f}{:>9,.0f}{:>10}{:>9.1f}"


def _row(label: str, m: dict) -> str:
    return ROW.format(
        label[:34],
        m["accumulated_lag_minutes"],
        m["slo_violation_rate"],
        m["downtime_minutes"],
        m["gpu_hours"],
        m["rescales"],
        m["max_lag_minutes"],
    )


def run(label: str, history: pd.DataFrame, warmup_days: float, variants=tuple(KALE_VARIANTS)) -> dict:
    started = time.perf_counter()
    bt = Backtest(history, BacktestSettings(warmup_days=warmup_days))
    report = compare(bt, POLICIES.compared(), variants=variants)
    elapsed = time.perf_counter() - started
    del report["timelines"]
    days = len(bt.rates) / 1440
    runs = (
        len(POLICIES.compared()) + len(report["kale_variants"]) + sum(len(rows) for rows in report["sweeps"].values())
    )
    report["wall_s"] = elapsed
    print(f"\n== {label}: {days:.1f} days, {warmup_days:g} warm-up; {runs} runs in {elapsed:.0f} s ==")
    print(
        f"{'policy':<34}{'acc lag min':>14}{'SLO viol':>10}{'downtime':>10}{'GPU h':>9}{'rescales':>10}{'max lag':>9}"
    )
    for name, m in report["policies"].items():
        print(_row(name + (" (default)" if name != "kale" else ""), m))
    for key, m in report["kale_variants"].items():
        print(_row(VARIANT_LABELS[key], m))
    print(_row("offline optimum", report["optimum"]))
    for name, frontier in report["frontiers"].items():
        print(f"{name} frontier ({len(frontier)} of {len(report['sweeps'][name])} settings):")
        for r in frontier:
            print(_row("  " + ",".join(str(v) for v in r["setting"].values()), r))

    def times(ratio) -> str:
        return "n/a (no lag)" if ratio is None else f"{ratio:.3f}x"

    for name, h in report["headline"].items():
        best = h["best_at_kales_gpu_hours"]
        print(
            f"Kale / {name}: lag {times(h['lag_ratio_vs_default'])} of the default's; "
            + (
                f"{times(h['lag_ratio_vs_best'])} of the best setting with >= Kale's GPU hours ({best['setting']}, "
                f"{best['gpu_hours']:,.0f} GPU h)"
                if best
                else "no setting with >= Kale's GPU hours"
            )
        )
    print(
        "cost over the offline optimum's: "
        + ", ".join(f"{k} {r:.3f}x" for k, r in report["cost_over_optimum"].items() if k != "optimum")
        + f" (best baseline: {report['best_baseline_by_cost']})"
    )
    excess = report.get("excess_cost")
    if excess:
        parts = ("gpu", "lag", "slo")
        print(
            "Kale's excess cost over the optimum's, GPU-minutes by part (gpu / 8 x lag / 100 x SLO): forecast error "
            + " / ".join(f"{excess['forecast'][p]:+,.0f}" for p in parts)
            + "; planning error "
            + " / ".join(f"{excess['planning'][p]:+,.0f}" for p in parts)
            + "; rescales: Kale {kale}, perfect forecast {perfect_forecast}, optimum {optimum}".format(
                **excess["rescales"]
            )
        )
    beaten = report["kale_dominated_by"]
    print(
        "swept settings with <= Kale's GPU hours and lower accumulated lag: "
        + (", ".join(beaten) if beaten else "none")
    )
    return report


def last_days(history: pd.DataFrame, days: float) -> pd.DataFrame:
    return history[history["timestamp"] >= history["timestamp"].iloc[-1] - pd.Timedelta(days=days)].reset_index(
        drop=True
    )


def development_set(traces: Path, nyc: bool = True, dev: bool = False):
    """(key, label, history) of the backtested traces: the 14-day synthetic trace (seed 0), nyc_taxi's last 35
    days, and with ``dev`` every other trace in ``traces``, its last 14 days; each with 7 days of warm-up."""
    synth = synth_trace(days=14, seed=0)
    yield (
        "synthetic_14d",
        "synthetic 14 days (seed 0)",
        prepare_history(pd.DataFrame({"timestamp": synth.timestamp, "rate": synth.value / 60})),
    )
    path = traces / "nyc_taxi.csv"
    if nyc:
        yield "nyc_taxi_last_35d", "nyc_taxi, last 35 days", last_days(read_trace_csv(path), 35)
    if dev:
        for other in sorted(traces.glob("*.csv")):
            if other.name != path.name:
                yield other.stem + "_last_14d", f"{other.stem}, last 14 days", last_days(read_trace_csv(other), 14)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--traces", type=Path, default=DEFAULT_TRACES, help="the development set (nyc_taxi.csv and the others)"
    )
    parser.add_argument("--skip-nyc", action="store_true")
    parser.add_argument(
        "--dev",
        action="store_true",
        help="also every other trace of the development set, its last 14 days "
        "(7 warm-up), with the perfect-forecast and stabilizer-planner variants only",
    )
    parser.add_argument("--json", type=Path, help="write all figures to this file (rewritten after each trace)")
    args = parser.parse_args()
    if (not args.skip_nyc or args.dev) and not (args.traces / "nyc_taxi.csv").is_file():
        print(f"the development set is not at {args.traces}; pass --traces DIR, or --skip-nyc", file=sys.stderr)
        return 2
    out = {}
    for key, label, history in development_set(args.traces, nyc=not args.skip_nyc, dev=args.dev):
        variants = tuple(KALE_VARIANTS) if key in ("synthetic_14d", "nyc_taxi_last_35d") else DEV_VARIANTS
        out[key] = run(label, history, 7, variants=variants)
        if args.json:
            args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
