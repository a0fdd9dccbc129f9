"""Forecaster speed and accuracy.

1. Fit and predict time of the default (Prophet-based) forecaster on 1, 7
   and 14 days of 1-minute synthetic data (median of --repeats runs).
2. Rolling-origin accuracy on ../shared/traces/nyc_taxi.csv over its last
   28 days at 30-minute and 2-hour horizons: plain Prophet, the default
   (residual-corrected, ensembled) model, and the better of the daily and
   weekly seasonal-naive baselines on the same folds.

    python bench/forecast_accuracy.py [--nyc PATH] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

from kale_dagster.forecast import make_forecaster
from kale_dagster.forecast.evaluate import rolling_origin
from kale_dagster.forecast.history import prepare_history, read_trace_csv
from kale_dagster.sim.trace import synth_trace

DEFAULT_NYC = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "nyc_taxi.csv"
TARGETS = {30: 0.5, 120: 0.6}


def timing(repeats: int) -> None:
    print("fit/predict time, default forecaster, 1-minute data (median of %d)" % repeats)
    for days in (1, 7, 14):
        tr = synth_trace(days=days, seed=days)
        hist = prepare_history(pd.DataFrame({"timestamp": tr.timestamp, "rate": tr.value / 60}))
        fits, preds = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model = make_forecaster("prophet", horizon_s=7200).fit(hist)
            t1 = time.perf_counter()
            fc = model.predict(120)
            t2 = time.perf_counter()
            fits.append(t1 - t0)
            preds.append(t2 - t1)
        note = f" (fallback: {fc.fallback[:40]}...)" if fc.fallback else ""
        print(f"  {days:>2} days: fit {statistics.median(fits):6.2f} s, predict 120 steps {statistics.median(preds) * 1000:6.1f} ms{note}")


def accuracy(path: Path) -> None:
    hist = read_trace_csv(path)
    print(f"rolling-origin accuracy on {path.name}, last 28 days, refit daily")
    for minutes, target in TARGETS.items():
        rows = {}
        for name in ("prophet-plain", "prophet"):
            t0 = time.perf_counter()
            rows[name] = rolling_origin(hist, lambda n=name: make_forecaster(n, horizon_s=7200), minutes * 60, eval_days=28)
            rows[name + "_s"] = time.perf_counter() - t0
        base = rows["prophet"]
        print(f"  horizon {minutes:>3} min: baseline {base.baseline} sMAPE {base.baseline_smape:.4f}")
        for name in ("prophet-plain", "prophet"):
            r = rows[name]
            print(f"    {name:<14} sMAPE {r.smape:.4f} ({r.smape / r.baseline_smape:.2f}x baseline)  MAPE {r.mape:.3f}  coverage {r.coverage:.1%}  folds {r.folds}  [{rows[name + '_s']:.0f} s]")
        ratio = base.smape / base.baseline_smape
        print(f"    target <= {target}x: {'met' if ratio <= target else 'MISSED'} ({ratio:.2f}x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nyc", type=Path, default=DEFAULT_NYC)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    timing(args.repeats)
    if not args.nyc.is_file():
        print(f"nyc_taxi trace not found at {args.nyc}", file=sys.stderr)
        return 2
    accuracy(args.nyc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
