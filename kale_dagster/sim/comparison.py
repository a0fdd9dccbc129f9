"""A comparison on one trace: every policy at its defaults, Kale's variants, each baseline's sweep, the optimum.

``compare`` runs them through one ``Backtest`` and reports each one's metrics, each baseline's Pareto frontier of
(GPU hours, accumulated lag), each one's cost over the optimum's, and the headline: Kale against each baseline's
default and its best setting at no more GPU hours than Kale's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kale_dagster.policies import POLICIES
from kale_dagster.sim.backtest import Backtest, Run
from kale_dagster.sim.metrics import excess_cost, objective
from kale_dagster.sim.oracle import OracleSchedule
from kale_dagster.sim.simulate import SimResult


def pareto_frontier(rows: Sequence[dict]) -> list[dict]:
    """Settings no other setting beats on both GPU hours and accumulated lag, by GPU hours."""

    def beaten(r: dict) -> bool:
        return any(
            o["gpu_hours"] <= r["gpu_hours"]
            and o["accumulated_lag_minutes"] <= r["accumulated_lag_minutes"]
            and (o["gpu_hours"], o["accumulated_lag_minutes"]) != (r["gpu_hours"], r["accumulated_lag_minutes"])
            for o in rows
        )

    return sorted((r for r in rows if not beaten(r)), key=lambda r: r["gpu_hours"])


def best_at_kales_gpu_hours(kale: dict, rows: Sequence[dict]) -> dict | None:
    """The baseline setting with the lowest accumulated lag among those with at least Kale's GPU hours."""
    eligible = [r for r in rows if r["gpu_hours"] >= kale["gpu_hours"]]
    return min(eligible, key=lambda r: (r["accumulated_lag_minutes"], r["gpu_hours"])) if eligible else None


def dominating_baselines(kale: dict, sweeps: dict[str, list[dict]]) -> list[str]:
    """Baseline settings with no more GPU hours than Kale and lower accumulated lag."""
    found = []
    for name, rows in sweeps.items():
        for row in rows:
            if (
                row["gpu_hours"] <= kale["gpu_hours"]
                and row["accumulated_lag_minutes"] < kale["accumulated_lag_minutes"]
            ):
                found.append(f"{name} {row['setting']}")
    return found


#: Kale's variants a comparison also runs (with ``variants=True``): what its estimates, its forecast and its
#: changes to the paper do.
KALE_VARIANTS = {
    "kale_oracle": Run(
        "kale", oracle=True
    ),  # plans with the true F(w) and restart time: the gap is what estimating them costs
    "kale_perfect_forecast": Run(
        "kale", perfect_forecast=True
    ),  # the trace's true future: what remains is planning error
    "kale_stabilizer": Run("kale_stabilizer"),  # the estimator, our stabilizer, the restart test
    "kale_paper_stabilizer": Run("kale_stabilizer", {"stabilizer": "paper"}),  # the same with the paper's Algorithm 1
    "kale_outlook": Run(
        "kale_stabilizer", {"outlook_scale_in": True}
    ),  # the stabilizer's scale-in judged over the forecast's outlook, not the horizon
}
VARIANT_LABELS = {
    "kale_oracle": "kale, true F(w) and restart",
    "kale_perfect_forecast": "kale, perfect forecast",
    "kale_stabilizer": "kale, stabilizer planner",
    "kale_paper_stabilizer": "kale, the paper's stabilizer",
    "kale_outlook": "kale, stabilizer, outlook scale-in",
}


def compare(
    backtest: Backtest,
    names: Sequence[str],
    sweeps: bool = True,
    variants: Sequence[str] = tuple(KALE_VARIANTS),
    optimum: bool = True,
    done: Callable[[int, int], None] | None = None,
) -> dict:
    """Every named policy at its defaults, Kale's ``variants`` (keys of ``KALE_VARIANTS``), each baseline's
    sweep and frontier, the offline optimum, each one's cost over the optimum's, and the headline: Kale
    against each baseline's default and its best setting at no fewer GPU hours."""
    extra = [(key, KALE_VARIANTS[key]) for key in variants] if "kale" in names else []
    runs = [Run(name) for name in names] + [run for _, run in extra]
    grid = (
        [(name, label, options) for name in names for label, options in POLICIES[name].sweep(backtest.sizing)]
        if sweeps
        else []
    )
    results, best = backtest.run_many(runs + [Run(name, options) for name, _, options in grid], done, optimum=optimum)
    report: dict = {
        "policies": {name: r.metrics.to_json() for name, r in zip(names, results)},
        "timelines": {name: r.timeline for name, r in zip(names, results)},
    }
    report["kale_variants"] = {key: r.metrics.to_json() for (key, _), r in zip(extra, results[len(names) :])}
    swept: dict = {}
    for (name, label, _), result in zip(grid, results[len(runs) :]):
        swept.setdefault(name, []).append({"setting": label, **result.metrics.to_json()})
    report["sweeps"] = swept
    report["frontiers"] = {name: pareto_frontier(rows) for name, rows in swept.items()}
    kale = report["policies"].get("kale")
    report["kale_dominated_by"] = dominating_baselines(kale, swept) if kale else []
    if optimum and best is not None:
        _score_against_optimum(report, best, names, float(len(backtest.rates) - backtest.sim_config.warmup_steps))
    report["headline"] = _headline(kale, report["policies"], swept) if kale else {}
    return report


def _score_against_optimum(
    report: dict, best: tuple[OracleSchedule, SimResult], names: Sequence[str], minutes: float
) -> None:
    """The optimum's metrics, each run's cost (the objective) and its ratio to the optimum's, the best baseline
    by cost (Kale's variants are not baselines), and Kale's excess cost over it."""
    schedule, replay = best
    report["optimum"] = {
        **replay.metrics.to_json(),
        "max_labels": schedule.max_labels,
        "step_minutes": schedule.step_minutes,
    }
    costs = {"optimum": objective(report["optimum"], minutes)}
    costs.update({name: objective(m, minutes) for name, m in report["policies"].items()})
    costs.update({key: objective(m, minutes) for key, m in report["kale_variants"].items()})
    baselines = [
        (objective(r, minutes), f"{name} {r['setting']}") for name, rows in report["sweeps"].items() for r in rows
    ]
    ours = [name for name in names if name == "kale" or POLICIES[name].variant_of == "kale"]
    baselines += [(costs[name], f"{name} (default)") for name in names if name not in ours]
    if baselines:
        costs["best_baseline"], report["best_baseline_by_cost"] = min(baselines)
    report["costs"] = costs
    report["cost_over_optimum"] = {k: c / costs["optimum"] for k, c in costs.items()}
    perfect = report["kale_variants"].get("kale_perfect_forecast")
    if "kale" in report["policies"] and perfect is not None:
        report["excess_cost"] = excess_cost(report["policies"]["kale"], perfect, report["optimum"], minutes)


def _headline(kale: dict, policies: dict, swept: dict) -> dict:
    """Kale against each swept baseline: its default, and its best setting at no more GPU hours than Kale's."""
    headline = {}
    for name, rows in swept.items():
        best = best_at_kales_gpu_hours(kale, rows)
        default = policies[name]
        headline[name] = {
            "default": default,
            "lag_ratio_vs_default": lag_ratio(kale, default),
            "best_at_kales_gpu_hours": best,
            "lag_ratio_vs_best": lag_ratio(kale, best) if best else None,
        }
    return headline


def lag_ratio(kale: dict, other: dict) -> float | None:
    """Kale's accumulated lag over another's (None when the other has none)."""
    lag = other["accumulated_lag_minutes"]
    return kale["accumulated_lag_minutes"] / lag if lag else None
