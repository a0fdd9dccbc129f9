"""``kale forecast``: rolling-origin accuracy of a forecaster on a recorded trace."""

from __future__ import annotations

import sys

from kale_dagster.cli import print_json
from kale_dagster.cli.progress import ProgressBar
from kale_dagster.errors import CommandError
from kale_dagster.forecast import FORECASTERS, make_forecaster
from kale_dagster.forecast.evaluate import rolling_origin
from kale_dagster.forecast.history import read_trace_csv


def register(subparsers, summary: str) -> None:
    parser = subparsers.add_parser(
        "forecast",
        help=summary,
        description="Rolling-origin evaluation over the last days of a trace: sMAPE, MAPE, MAE and band "
        "coverage at the horizon, against the better of the daily and weekly seasonal-naive baselines, the best "
        "simple baseline (seasonal naive, persistence, a recent mean) and the noise floor.",
        epilog="example: kale forecast --trace nyc_taxi.csv --horizon 120 --json",
    )
    parser.add_argument("--trace", required=True, help="CSV with header timestamp,value (arrivals per interval)")
    parser.add_argument(
        "--horizon", type=float, gt=0, le=7 * 1440, required=True, metavar="MINUTES", help="forecast horizon in minutes"
    )
    parser.add_argument("--model", default="prophet", choices=list(FORECASTERS), help="forecaster to evaluate")
    parser.add_argument(
        "--eval-days", type=float, gt=0, le=366, default=28.0, help="length of the evaluated tail in days"
    )
    parser.add_argument(
        "--refit-hours", type=float, gt=0, le=366 * 24, default=24.0, help="refit cadence during evaluation"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args) -> int:
    if args.horizon <= 0:
        raise CommandError("--horizon must be > 0 minutes")
    history = read_trace_csv(args.trace)
    horizon_s = args.horizon * 60
    bar = ProgressBar("forecast", enabled=not args.json)
    result = rolling_origin(
        history,
        lambda: make_forecaster(args.model, horizon_s=max(horizon_s, 60.0)),
        horizon_s,
        eval_days=args.eval_days,
        refit_every_s=args.refit_hours * 3600,
        progress=bar.update,
    )
    bar.close()
    if result.note:
        print(f"note: {result.note}", file=sys.stderr)
    if args.json:
        print_json(result.to_json())
        return 0
    ratio = result.smape / result.baseline_smape if result.baseline_smape else float("nan")
    print(f"model {result.model}, horizon {result.horizon_minutes:g} min, {result.folds} folds, {result.refits} refits")
    print(
        f"  sMAPE {result.smape:.4f}  MAPE {result.mape:.4f}  MAE {result.mae:.4g}/s  band coverage "
        f"{result.coverage:.1%}"
    )
    print(f"  baseline {result.baseline}: sMAPE {result.baseline_smape:.4f}  (model/baseline {ratio:.2f}x)")
    print(f"  best seasonal naive MAE {result.baseline_mae:.4g}/s  (relative MAE {result.relative_mae:.2f}x)")
    simple, simple_mae = result.best_simple
    print(f"  best simple baseline {simple}: MAE {simple_mae:.4g}/s  (model/it {result.mae / simple_mae:.2f}x)")
    gap = (
        f"{result.gap_closed:.0%} of the gap to it closed"
        if result.gap_closed == result.gap_closed
        else "no gap: the floor is not below the baseline"
    )
    print(f"  noise floor MAE {result.floor_mae:.4g}/s  ({gap})")
    print(
        f"  on the rate averaged over the plan step: MAE {result.plan_step_mae:.4g}/s, seasonal naive "
        f"{result.plan_step_baseline_mae:.4g}/s"
    )
    if result.fallbacks:
        print(f"  note: {result.fallbacks} folds used the short-history fallback", file=sys.stderr)
    return 0
