"""``kale backtest``: replay a trace through Kale and the baselines and compare the paper's metrics."""

from __future__ import annotations

from kale_dagster.cli import print_json
from kale_dagster.cli.declared import add_flags, from_flags
from kale_dagster.cli.progress import ProgressBar
from kale_dagster.forecast.history import read_trace_csv
from kale_dagster.model.limits import Limits
from kale_dagster.policies import POLICIES
from kale_dagster.sim.backtest import Backtest, BacktestSettings
from kale_dagster.sim.comparison import KALE_VARIANTS, VARIANT_LABELS, compare

_COLUMNS = (
    ("accumulated_lag_minutes", "acc. lag (min)", "{:,.0f}"),
    ("slo_violation_rate", "SLO viol.", "{:.2%}"),
    ("downtime_minutes", "downtime (min)", "{:,.0f}"),
    ("gpu_hours", "GPU h", "{:,.1f}"),
    ("rescales", "rescales", "{:d}"),
    ("max_lag_minutes", "max lag (min)", "{:,.1f}"),
)


def register(subparsers, summary: str) -> None:
    parser = subparsers.add_parser(
        "backtest",
        help=summary,
        description="Trace-driven backtest with the production policy code. The trace is scaled so its peak "
        "equals the throughput of --peak-workers workers; the first --warmup-days are Kale's forecaster's history "
        "(simulated, not scored); the baselines start a day before the scored span.",
        epilog="example: kale trace synth --days 14 --out t.csv && kale backtest --trace t.csv --warmup-days 7 "
        "--no-sweeps",
    )
    parser.add_argument("--trace", required=True, help="CSV timestamp,value (arrivals per interval)")
    parser.add_argument(
        "--policies", default=",".join(POLICIES.compared()), help="comma-separated subset of " + ",".join(POLICIES)
    )
    parser.add_argument(
        "--peak-workers", type=int, ge=1, le=1024, default=28, help="the trace is scaled so its peak needs this many"
    )
    add_flags(parser, Limits)
    parser.add_argument("--warmup-days", type=float, ge=0, le=366, default=0.0)
    parser.add_argument(
        "--hpa-target", type=int, ge=1, le=1000, default=80, help="HPA target GPU utilization in percent"
    )
    parser.add_argument("--forecaster", default="prophet", help="Kale's forecaster")
    parser.add_argument(
        "--refit-minutes", type=float, gt=0, le=366 * 1440, default=1440.0, help="forecaster refit cadence"
    )
    parser.add_argument("--no-sweeps", action="store_true", help="skip the baseline sweeps")
    parser.add_argument(
        "--no-variants",
        action="store_true",
        help="skip Kale's variants: planning with the true F(w) and restart time, a perfect forecast, the paper's "
        "stabilizer, "
        "scale-in judged over the forecast's outlook",
    )
    parser.add_argument(
        "--no-optimum", action="store_true", help="skip the offline optimum (perfect foresight, dynamic program)"
    )
    parser.add_argument(
        "--no-retarget",
        action="store_true",
        help="the launcher cannot redirect a restart under way (a command hook)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", metavar="PNG", help="write arrivals, capacity and lag per policy to this PNG")
    parser.set_defaults(handler=run)


def run(args) -> int:
    names = POLICIES.parse(args.policies)
    settings = BacktestSettings(
        limits=from_flags(Limits, args),
        peak_workers=args.peak_workers,
        warmup_days=args.warmup_days,
        policy_options={"hpa": {"target_utilization": args.hpa_target}},
        forecaster=args.forecaster,
        refit_minutes=args.refit_minutes,
        retargets=not args.no_retarget,
    )
    backtest = Backtest(read_trace_csv(args.trace), settings)
    bar = ProgressBar("backtest", enabled=not args.json)
    report = compare(
        backtest,
        names,
        sweeps=not args.no_sweeps,
        variants=() if args.no_variants else tuple(KALE_VARIANTS),
        optimum=not args.no_optimum,
        done=bar.update,
    )
    bar.close()
    if args.plot:
        from kale_dagster.definitions.plots import plot_backtest

        plot_backtest({name: report["timelines"][name] for name in names}, settings.limits.slo_minutes, args.plot)
    del report["timelines"]
    if args.json:
        print_json(report)
        return 0
    _print_report(report)
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def _print_report(report: dict) -> None:
    """The report as tables: each policy at its defaults and Kale's variants, each baseline's frontier, the headline
    and each one's cost over the optimum's."""
    rows = {**report["policies"], **{VARIANT_LABELS[k]: m for k, m in report["kale_variants"].items()}}
    if "optimum" in report:
        rows["offline optimum"] = report["optimum"]
    _print_table(rows, "policy (defaults)")
    for name, frontier in report["frontiers"].items():
        print()
        _print_table(
            {_label(row["setting"]): row for row in frontier},
            f"{name}: Pareto frontier of {len(report['sweeps'][name])} settings",
        )
    if report["headline"]:
        print()
        for name, h in report["headline"].items():
            best = h["best_at_kales_gpu_hours"]
            line = f"Kale vs {name}: lag {_times(h['lag_ratio_vs_default'])} of the default's"
            line += (
                f"; {_times(h['lag_ratio_vs_best'])} of the best setting with >= Kale's GPU hours "
                f"({_label(best['setting'])}, "
                f"{best['gpu_hours']:,.0f} GPU h)"
                if best
                else "; no setting uses as many GPU hours as Kale"
            )
            print(line)
        beaten = report["kale_dominated_by"]
        print(
            "swept settings with <= Kale's GPU hours and lower accumulated lag: "
            + (", ".join(beaten) if beaten else "none")
        )
    if "cost_over_optimum" in report:
        print()
        print(
            "cost (GPU-min + 8 x lag-min + 100 x violation-min) over the offline optimum's: "
            + ", ".join(
                f"{VARIANT_LABELS.get(k, k)} {r:.3g}x" for k, r in report["cost_over_optimum"].items() if k != "optimum"
            )
            + (f" (best baseline: {report['best_baseline_by_cost']})" if "best_baseline_by_cost" in report else "")
        )


def _times(ratio) -> str:
    return "n/a (it has no lag)" if ratio is None else f"{ratio:.3g}x"


def _label(setting: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items())


def _print_table(rows: dict, title: str) -> None:
    width = max([len(title)] + [len(k) for k in rows]) + 2
    print(title.ljust(width) + "".join(label.rjust(16) for _, label, _ in _COLUMNS))
    for name, metrics in rows.items():
        print(name.ljust(width) + "".join(fmt.format(metrics[key]).rjust(16) for key, _, fmt in _COLUMNS))
