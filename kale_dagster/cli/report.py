"""``kale report``: the savings report of one pipeline, from its metrics history, in the terminal."""

from __future__ import annotations

import time

from kale_dagster.cli import print_json
from kale_dagster.cli.code_location import add_pipeline_arguments, find_pipeline
from kale_dagster.errors import CommandError


def register(subparsers, summary: str) -> None:
    parser = subparsers.add_parser(
        "report",
        help=summary,
        description="What ran over the last days (measured from the metrics history) beside what Kale and the best "
        "tuned HPA and KEDA settings would have run on the same arrivals (simulated, each figure with the "
        "simulator's measured error). The same report as the pipeline's savings asset.",
        epilog="example: kale report --pipeline ctr --days 7 -m pipelines.definitions",
    )
    add_pipeline_arguments(parser)
    parser.add_argument(
        "--days", type=float, gt=0, le=35, help="the span covered (default: the pipeline's report_days)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run_report)


def run_report(args) -> int:
    from kale_dagster.definitions.savings import pipeline_savings, report_rows
    from kale_dagster.sim.savings import ReportRefused, fmt_band

    pipeline = find_pipeline(args, args.pipeline)
    try:
        report, _, _ = pipeline_savings(pipeline, args.days)
    except ReportRefused as exc:
        raise CommandError(f"no savings report for {pipeline.name!r}: {exc}") from None
    if args.json:
        print_json(report.to_json(), indent=1)
        return 0
    span = " to ".join(time.strftime("%Y-%m-%d %H:%M", time.gmtime(t)) for t in (report.start, report.end))
    print(f"{pipeline.name}: {span} UTC ({report.hours:,.1f} h, {report.inputs.readings:,} readings)")
    e = report.error
    rows = report_rows(report)
    width = max(len(label) for label, *_ in rows) + 2
    print(f"{'':<{width}}{'GPU h':>22}{'acc. lag (min)':>26}{'min over SLO':>14}{'restarts':>10}")
    for label, m, simulated, _ in rows:
        gpu = fmt_band(m["gpu_hours"], e.gpu_hours if simulated else None)
        lag = fmt_band(m["accumulated_lag_minutes"], e.accumulated_lag_minutes if simulated else None)
        print(f"{label:<{width}}{gpu:>22}{lag:>26}{m['minutes_over_slo']:>14,.0f}{m['rescales']:>10}")
    print()
    for label, *_, setting in rows:
        if setting:
            print(f"{label}: {setting}")
    print(report.summary())
    print(f"simulated with {report.inputs.model}; restart time {report.inputs.restart}")
    print(
        f"bands: the simulator's error measured by {e.measured}: GPU h +-{e.gpu_hours:.0%}, lag "
        f"+-{e.accumulated_lag_minutes:.0%}"
    )
    return 0
