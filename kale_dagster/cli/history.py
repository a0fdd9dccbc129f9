"""``kale history backfill``: warm-start a pipeline's metrics history from the records Kafka retains."""

from __future__ import annotations

import time

from kale_dagster.cli import print_json
from kale_dagster.cli.code_location import add_pipeline_arguments, find_pipeline
from kale_dagster.cli.progress import ProgressBar
from kale_dagster.errors import CommandError


def register(subparsers, summary: str) -> None:
    parser = subparsers.add_parser("history", help=summary)
    sub = parser.add_subparsers(dest="history_command", metavar="ACTION", required=True)
    backfill = sub.add_parser(
        "backfill",
        help="rebuild a pipeline's arrival history from its topics' retained records",
        description="Rebuild the arrival rate per bucket from the records Kafka retains, so the forecaster starts "
        "warm; "
        "only the span before the metrics sensor's first reading is written.",
        epilog="example: kale history backfill --pipeline ctr --days 7 -m pipelines.definitions",
    )
    add_pipeline_arguments(backfill)
    backfill.add_argument(
        "--days", type=float, gt=0, le=366, default=7.0, help="how far back, at most what Kafka retains"
    )
    backfill.add_argument(
        "--bucket-seconds",
        type=float,
        ge=1,
        le=86_400,
        help="bucket width (default: the pipeline's metrics_interval_seconds)",
    )
    backfill.add_argument("--json", action="store_true", help="print one JSON object")
    backfill.set_defaults(handler=run_backfill)


def run_backfill(args) -> int:
    from kafka.errors import KafkaError

    from kale_dagster.definitions.backfill import backfill_pipeline

    pipeline = find_pipeline(args, args.pipeline)
    started = time.monotonic()
    bar = ProgressBar("backfill", enabled=not args.json)
    try:
        result = backfill_pipeline(pipeline, args.days, bucket_s=args.bucket_seconds, done=bar.update)
    except (KafkaError, LookupError, TimeoutError) as exc:
        raise CommandError(
            f"could not read {', '.join(pipeline.source.topics)} at {pipeline.source.bootstrap_servers}: {exc}"
        ) from exc
    finally:
        bar.close()
    summary = {
        "pipeline": pipeline.name,
        "buckets": len(result.rows),
        "records": int(result.rows["records"].sum()) if len(result.rows) else 0,
        "from": result.start,
        "to": result.end,
        "method": result.method,
        "requests": result.requests,
        "seconds": round(time.monotonic() - started, 2),
        "note": result.note,
    }
    if args.json:
        print_json(summary)
    else:
        start, end = (time.strftime("%Y-%m-%d %H:%M", time.gmtime(t)) for t in (result.start, result.end))
        span = f"{start} to {end} UTC"
        print(
            f"{pipeline.name}: {summary['buckets']} buckets ({summary['records']} records) from {span}, "
            f"by {result.method} in {summary['requests']} requests, {summary['seconds']} s"
            + (f"; {result.note}" if result.note else "")
        )
    return 0
