"""How fast `kale backtest` runs: the 14-day synthetic trace (seed 0, 7 days warm-up), as the README's backtest runs it.

1. Kale, the oracle and the default baselines (`kale backtest --no-sweeps --no-variants`), wall time on every core;
2. every policy, every baseline's grid and the oracle (`kale backtest --no-variants`), wall time on every core;
3. the whole report, Kale's variants too (`kale backtest`), wall time on every core;
4. one simulation per policy at its defaults in one process: simulated days per second (Kale simulates the whole
   trace, the baselines a day's lead-in and the scored span: ``BacktestSettings.lead_in_days``);
5. what the cores add: the same independent simulations (HPA at its defaults, four times) in one process and on
   every core.

Medians of --repeats runs, each on a freshly prepared backtest as one `kale backtest` invocation is: Kale's
forecasts (the Prophet refits) are recorded in every run, never replayed from an earlier one.  Run it against
another checkout (PYTHONPATH=that/checkout) to measure a change with the same script on the same machine.

    python bench/backtest_speed.py [--repeats 3] [--skip-grid]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import pandas as pd

from kale_dagster.forecast.history import prepare_history
from kale_dagster.policies import POLICIES
from kale_dagster.sim.backtest import Backtest, BacktestSettings, Run
from kale_dagster.sim.comparison import KALE_VARIANTS, compare
from kale_dagster.sim.trace import synth_trace


def backtest(processes=None) -> Backtest:
    synth = synth_trace(days=14, seed=0)
    history = prepare_history(pd.DataFrame({"timestamp": synth.timestamp, "rate": synth.value / 60}))
    return Backtest(history, BacktestSettings(warmup_days=7, processes=processes))


def timed(fn, repeats: int, processes=None) -> tuple[float, Any]:
    """Median wall time of ``fn(backtest)``, each call on a new backtest (its preparation not timed)."""
    walls, result = [], None
    for _ in range(repeats):
        bt = backtest(processes)
        started = time.perf_counter()
        result = fn(bt)
        walls.append(time.perf_counter() - started)
    return statistics.median(walls), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-grid", action="store_true", help="leave out the reports with the sweeps (minutes)")
    args = parser.parse_args()
    days = len(backtest().rates) / 1440
    names = POLICIES.compared()
    wall, report = timed(lambda bt: compare(bt, names, sweeps=False, variants=()), args.repeats)
    runs = len(names) + 1  # and the oracle's replay
    print(
        f"Kale, the oracle and the defaults ({runs} simulations and the dynamic program, {days:.0f} days): "
        f"{wall:.1f} s",
        flush=True,
    )
    if not args.skip_grid:
        for label, variants in (("every policy, the sweeps and the oracle", ()), ("the whole report", KALE_VARIANTS)):
            wall, report = timed(
                lambda bt, variants=variants: compare(bt, names, variants=tuple(variants)), args.repeats
            )
            runs = len(names) + len(report["kale_variants"]) + sum(len(rows) for rows in report["sweeps"].values()) + 1
            print(f"{label} ({runs} simulations and the dynamic program): {wall:.1f} s", flush=True)
    for name in names:
        wall, result = timed(lambda bt, name=name: bt.run(name), args.repeats, processes=1)
        simulated = len(result.timeline) / 1440
        recorded = " (recording its forecasts included)" if POLICIES[name].uses_forecast else ""
        print(
            f"{name}, one process: {wall:.1f} s ({simulated:.0f} days simulated, {simulated / wall:.2f} days/s)"
            f"{recorded}",
            flush=True,
        )
    wall, _ = timed(lambda bt: bt.optimum(), args.repeats, processes=1)
    print(f"oracle (dynamic program and its replay), one process: {wall:.1f} s", flush=True)
    same = [Run("hpa")] * 4
    one, _ = timed(lambda bt: bt.run_many(same), args.repeats, processes=1)
    every, _ = timed(lambda bt: bt.run_many(same), args.repeats)
    print(
        f"{len(same)} HPA simulations: one process {one:.1f} s, every core ({os.cpu_count()}) {every:.1f} s: "
        f"{one / every:.2f}x",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
