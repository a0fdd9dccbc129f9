"""Kale's cost over the offline optimum's on the development set, over several draws of the simulator's noise,
and a candidate configuration's against it, seed by seed.

One run draws its restart times and throughput measurements from a seed, and that draw alone moves Kale's cost
over the optimum's by several hundredths on a 14-day trace.  A change to the planner or the forecaster is worth
keeping only where it wins on the same draws: this runs Kale at its defaults and, with ``--candidate``, Kale with
those ``KaleConfig`` options, on every seed, and prints per trace each one's cost over the optimum's (median and
range over the seeds) and the candidate's difference from the default on each seed: "better" when it is lower on
every seed, "worse" when higher on every seed, otherwise "within noise".  The forecasts and the optimum's schedule
depend on the trace alone, so each is computed once per trace (``Backtest.with_seed``).  The traces are
``backtest_vs_baselines.py``'s (synthetic 14 days, nyc_taxi's last 35, the others' last 14, 7 days of warm-up).

    python bench/kale_vs_optimum.py [--seeds 3] [--candidate '{"plan_quantile": 0.6}'] [--perfect]
        [--only nyc_taxi --only IBM] [--traces DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from backtest_vs_baselines import DEFAULT_TRACES, development_set

from kale_dagster.errors import KaleConfigError
from kale_dagster.policies.kale import KaleConfig
from kale_dagster.sim.backtest import Backtest, BacktestSettings, Run
from kale_dagster.sim.metrics import objective


def spread(values: list[float], signed: bool = False) -> str:
    """Median [lowest to highest]: ratios as "1.154x", differences with their sign."""
    show = "{:+.3f}".format if signed else "{:.3f}x".format
    return f"{show(statistics.median(values))} [{show(min(values))} to {show(max(values))}]"


def verdict(differences: list[float]) -> str:
    if all(d < 0 for d in differences):
        return "better"
    if all(d > 0 for d in differences):
        return "worse"
    return "within noise"


def measure(history, seeds: list[int], runs: dict[str, Run]) -> dict[str, list[float]]:
    """Each run's cost over the optimum's on each seed, the same trace and forecasts throughout."""
    ratios: dict[str, list[float]] = {key: [] for key in runs}
    base: Backtest | None = None
    for seed in seeds:
        bt = Backtest(history, BacktestSettings(warmup_days=7, seed=seed)) if base is None else base.with_seed(seed)
        base = base or bt
        results, best = bt.run_many(list(runs.values()), optimum=True)
        assert best is not None  # asked for
        minutes = float(len(bt.rates) - bt.sim_config.warmup_steps)
        optimum = objective(best[1].metrics.to_json(), minutes)
        for key, result in zip(runs, results):
            ratios[key].append(objective(result.metrics.to_json(), minutes) / optimum)
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="draws of the simulator's noise: seeds 0 to N-1")
    parser.add_argument("--candidate", type=json.loads, help="KaleConfig options to measure against the defaults")
    parser.add_argument("--perfect", action="store_true", help="also Kale with a perfect forecast (planning error)")
    parser.add_argument("--only", action="append", default=[], help="traces whose key contains this (repeatable)")
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="the development set")
    parser.add_argument("--json", type=Path, help="write all figures to this file (rewritten after each trace)")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    if not (args.traces / "nyc_taxi.csv").is_file():
        parser.error(f"the development set is not at {args.traces}; pass --traces DIR")
    if args.candidate is not None:
        try:
            KaleConfig(**args.candidate)
        except (KaleConfigError, TypeError) as e:
            parser.error(f"--candidate: {e}")
    runs = {"kale": Run("kale")}
    if args.candidate is not None:
        runs["candidate"] = Run("kale", args.candidate)
    if args.perfect:
        runs["perfect_forecast"] = Run("kale", perfect_forecast=True)
    seeds = list(range(args.seeds))
    out: dict = {"seeds": seeds, "candidate": args.candidate, "traces": {}}
    verdicts = []
    for key, label, history in development_set(args.traces, dev=True):
        if args.only and not any(part in key for part in args.only):
            continue
        started = time.perf_counter()
        ratios = measure(history, seeds, runs)
        line = f"{label} ({len(seeds)} seeds, {time.perf_counter() - started:.0f} s): Kale {spread(ratios['kale'])}"
        if "candidate" in ratios:
            differences = [c - k for c, k in zip(ratios["candidate"], ratios["kale"])]
            verdicts.append(verdict(differences))
            line += (
                f"; candidate {spread(ratios['candidate'])}, difference {spread(differences, signed=True)}: "
                f"{verdicts[-1]}"
            )
        if "perfect_forecast" in ratios:
            line += f"; perfect forecast {spread(ratios['perfect_forecast'])}"
        print(line, flush=True)
        out["traces"][key] = ratios
        if args.json:
            args.json.write_text(json.dumps(out, indent=2))
    if verdicts:
        print(
            f"candidate {json.dumps(args.candidate)}: "
            + ", ".join(f"{verdicts.count(v)} {v}" for v in ("better", "within noise", "worse"))
            + f" of {len(verdicts)} traces"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
