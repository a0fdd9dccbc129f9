"""Kale's cost over the offline optimum's on the development set, over several draws of the simulator's noise,
and a candidate configuration's against it, seed by seed.

One run draws its restart times and throughput measurements from a seed, and that draw alone moves Kale's cost
over the optimum's by several hundredths on a 14-day trace.  A change to the planner or the forecaster is worth
keeping only where it wins on the same draws: this runs Kale at its defaults and, with ``--candidate``, Kale with
those ``KaleConfig`` options, on every seed, and prints per trace each one's cost over the optimum's (median and
range over the seeds) and the candidate's difference from the default on each seed: "better" when it is lower on
every seed, "worse" when higher on every seed, otherwise "within noise"; beside each, its share of minutes above
the SLO on each seed (the targets ask for no more of them).  The forecasts and the optimum's schedule
depend on the trace alone, so each is computed once per trace (``Backtest.with_seed``).  The traces are
``backtest_vs_baselines.py``'s (synthetic 14 days, nyc_taxi's last 35, the others' last 14, 7 days of warm-up).

With ``--baselines`` every baseline's swept settings and default run on the same seeds too, and each trace's
line adds the cheapest one's cost over the optimum's and whether Kale is cheaper than it on every seed: one seed's
baseline is as much a draw of the noise as Kale's (KEDA on KO: 1.35x, 1.85x and 1.52x on seeds 0-2).

Each run's cost and SLO violation rate (and the optimum's) are kept in ``--cache`` under the code that measured
them: the bytes of every source file of kale_dagster and bench, the versions of numpy, pandas and prophet, the
trace's rates, the run and the seed.  A candidate measured after the defaults runs only itself; any edit to the
code measures everything again.

With ``--burst-free CAP`` Kale also runs on a forecast that is perfect but for the bursts: the trace's true future
with every minute above CAP times the median of the hour around it cut to that (``sim.oracle.without_bursts``).
Between it and the live forecast lies what a better forecast of the usual traffic could win; between it and the
optimum, what the bursts cost a policy that cannot see them coming.

    python bench/kale_vs_optimum.py [--seeds 3] [--candidate '{"plan_quantile": 0.6}'] [--perfect] [--burst-free 2]
        [--baselines] [--only nyc_taxi --only IBM] [--traces DIR] [--json FILE] [--cache DIR | --no-cache]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import NamedTuple

import pandas as pd
from backtest_vs_baselines import DEFAULT_TRACES, development_set

import kale_dagster
from kale_dagster.errors import KaleConfigError
from kale_dagster.policies import POLICIES
from kale_dagster.policies.kale import KaleConfig
from kale_dagster.sim.backtest import Backtest, BacktestSettings, Run
from kale_dagster.sim.metrics import objective


def spread(values: list[float], signed: bool = False) -> str:
    """Median [lowest to highest]: ratios as "1.154x", differences with their sign."""
    show = "{:+.3f}".format if signed else "{:.3f}x".format
    return f"{show(statistics.median(values))} [{show(min(values))} to {show(max(values))}]"


def percents(rates: list[float]) -> str:
    """SLO violation rates, one per seed, as percentages."""
    return ", ".join(f"{rate:.3%}" for rate in rates)


def verdict(differences: list[float]) -> str:
    if all(d < 0 for d in differences):
        return "better"
    if all(d > 0 for d in differences):
        return "worse"
    return "within noise"


def code_key() -> str:
    """What a measured cost depends on besides the trace and the run: every source file the bench and the library
    run, and the numeric libraries' versions."""
    digest = hashlib.sha256()
    for root in (Path(kale_dagster.__file__).parent, Path(__file__).parent):
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    for package in ("numpy", "pandas", "prophet"):
        digest.update(f"{package}=={version(package)}".encode())
    return digest.hexdigest()


class Scored(NamedTuple):
    """One run's cost by Kale's objective over the scored minutes, and its share of minutes above the SLO."""

    cost: float
    slo_violation: float

    @classmethod
    def of(cls, metrics: dict, minutes: float) -> Scored:
        return cls(objective(metrics, minutes), metrics["slo_violation_rate"])


class CostCache:
    """Runs already scored (``Scored``: the cost and the SLO violation rate), one JSON file per trace; entries made
    by other code are never read.  ``directory`` None keeps nothing."""

    def __init__(self, directory: Path | None):
        self.directory, self.code = directory, code_key() if directory is not None else ""
        self.entries: dict[str, list[float]] = {}
        self.path: Path | None = None
        self.rates = ""

    def open(self, key: str, history: pd.DataFrame) -> None:
        """The entries of one trace (its rates, not just its name, are part of the key)."""
        if self.directory is None:
            return
        self.rates = hashlib.sha256(pd.util.hash_pandas_object(history, index=False).to_numpy().tobytes()).hexdigest()
        self.path = self.directory / f"{key}.json"
        stored = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.entries = stored.get("entries", {}) if stored.get("code") == [self.code, self.rates] else {}

    @staticmethod
    def entry(seed: int, run: Run | None) -> str:
        return f"{seed}:optimum" if run is None else f"{seed}:{json.dumps(run._asdict(), sort_keys=True)}"

    def get(self, seed: int, run: Run | None) -> Scored | None:
        stored = self.entries.get(self.entry(seed, run))
        return Scored(*stored) if stored is not None else None

    def put(self, seed: int, run: Run | None, scored: Scored) -> None:
        if self.path is None:
            return
        self.entries[self.entry(seed, run)] = list(scored)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"code": [self.code, self.rates], "entries": self.entries}, indent=1))


def baseline_runs(base: Backtest) -> dict[str, Run]:
    """Every baseline's (every policy but Kale's) default and swept settings, as the backtest's report runs them."""
    runs = {}
    for name in POLICIES.compared():
        if name != "kale":
            runs[f"{name} (default)"] = Run(name)
            runs.update({f"{name} {label}": Run(name, options) for label, options in POLICIES[name].sweep(base.sizing)})
    return runs


def measure(
    base: Backtest, seeds: list[int], runs: dict[str, Run], cache: CostCache
) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """Each run's cost over the optimum's, and its SLO violation rate, on each seed of ``base``'s trace, the same
    forecasts throughout; and how many of the runs the cache answered."""
    ratios: dict[str, list[float]] = {key: [] for key in runs}
    violations: dict[str, list[float]] = {key: [] for key in runs}
    cached = 0
    for seed in seeds:
        scored = {key: cache.get(seed, run) for key, run in runs.items()}
        optimum = cache.get(seed, None)
        missing = [key for key, known in scored.items() if known is None]
        cached += len(runs) - len(missing)
        if missing or optimum is None:
            bt = base.with_seed(seed)
            results, best = bt.run_many([runs[key] for key in missing], optimum=True)
            assert best is not None  # asked for
            minutes = float(len(bt.rates) - bt.sim_config.warmup_steps)
            optimum = Scored.of(best[1].metrics.to_json(), minutes)
            cache.put(seed, None, optimum)
            for key, result in zip(missing, results):
                measured = scored[key] = Scored.of(result.metrics.to_json(), minutes)
                cache.put(seed, runs[key], measured)
        for key, known in scored.items():
            assert known is not None  # measured above if the cache had none
            ratios[key].append(known.cost / optimum.cost)
            violations[key].append(known.slo_violation)
    return ratios, violations, cached


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="draws of the simulator's noise: seeds 0 to N-1")
    parser.add_argument("--candidate", type=json.loads, help="KaleConfig options to measure against the defaults")
    parser.add_argument("--perfect", action="store_true", help="also Kale with a perfect forecast (planning error)")
    parser.add_argument(
        "--burst-free",
        type=float,
        metavar="CAP",
        help="also Kale with a forecast perfect but for the bursts (no minute above CAP x the hour's median): what "
        "the bursts cost",
    )
    parser.add_argument("--baselines", action="store_true", help="also every baseline setting: the cheapest per seed")
    parser.add_argument("--only", action="append", default=[], help="traces whose key contains this (repeatable)")
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="the development set")
    parser.add_argument("--json", type=Path, help="write all figures to this file (rewritten after each trace)")
    parser.add_argument(
        "--cache", type=Path, default=Path(__file__).parent / ".cache" / "kale_vs_optimum", help="measured costs"
    )
    parser.add_argument("--no-cache", action="store_true", help="measure every run again and keep nothing")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    if args.burst_free is not None and args.burst_free < 1:
        parser.error(f"--burst-free must be at least 1 (a multiple of the hour's median rate), got {args.burst_free}")
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
    if args.burst_free is not None:
        runs["burst_free"] = Run("kale", perfect_forecast=True, burst_cap=args.burst_free)
    seeds = list(range(args.seeds))
    cache = CostCache(None if args.no_cache else args.cache)
    out: dict = {"seeds": seeds, "candidate": args.candidate, "traces": {}}
    verdicts = []
    for key, label, history in development_set(args.traces, dev=True):
        if args.only and not any(part in key for part in args.only):
            continue
        started = time.perf_counter()
        cache.open(key, history)
        base = Backtest(history, BacktestSettings(warmup_days=7))
        baselines = baseline_runs(base) if args.baselines else {}
        ratios, violations, cached = measure(base, seeds, {**runs, **baselines}, cache)
        reused = f", {cached} of {(len(runs) + len(baselines)) * len(seeds)} runs from the cache" if cached else ""
        took = f"{len(seeds)} seeds, {time.perf_counter() - started:.0f} s{reused}"
        line = f"{label} ({took}): Kale {spread(ratios['kale'])} (SLO violation {percents(violations['kale'])})"
        if "candidate" in ratios:
            differences = [c - k for c, k in zip(ratios["candidate"], ratios["kale"])]
            verdicts.append(verdict(differences))
            line += (
                f"; candidate {spread(ratios['candidate'])} (SLO violation {percents(violations['candidate'])}), "
                f"difference {spread(differences, signed=True)}: {verdicts[-1]}"
            )
        if "perfect_forecast" in ratios:
            line += f"; perfect forecast {spread(ratios['perfect_forecast'])}"
        if "burst_free" in ratios:
            line += f"; perfect but for the bursts {spread(ratios['burst_free'])}"
        if baselines:
            best = [min(ratios[name][i] for name in baselines) for i in range(len(seeds))]
            dearer = [seed for seed, kale, other in zip(seeds, ratios["kale"], best) if kale >= other]
            line += f"; best baseline {spread(best)}, " + (
                f"as cheap as Kale or cheaper on seeds {dearer}" if dearer else "dearer than Kale on every seed"
            )
            ratios = {key: value for key, value in ratios.items() if key not in baselines} | {"best_baseline": best}
        print(line, flush=True)
        out["traces"][key] = ratios | {
            f"{name}_slo_violation": violations[name] for name in ("kale", "candidate") if name in violations
        }
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
