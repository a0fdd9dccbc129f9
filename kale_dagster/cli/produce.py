"""``kale produce``: replay a trace into Kafka as CTR samples."""

from __future__ import annotations

import signal
import threading

from kale_dagster.errors import CommandError
from kale_dagster.forecast.history import read_trace_csv
from kale_dagster.stream.producer import ReplaySettings, replay


def register(subparsers, summary: str) -> None:
    parser = subparsers.add_parser(
        "produce",
        help=summary,
        description="Produces CTR samples (user, item, dense features, a label from a fixed hidden model) at the "
        "trace's rate x --rate-scale, time-compressed by --speedup. --hot-share puts that share of traffic on "
        "partition 0 (a hot partition, as in the paper).",
        epilog="example: kale produce --trace t.csv --topic samples --speedup 48",
    )
    parser.add_argument("--trace", required=True, help="CSV with header timestamp,value (arrivals per interval)")
    parser.add_argument("--topic", required=True, help="the topic to produce into (created if missing)")
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--speedup", type=float, gt=0, le=1_000_000, default=1.0, help="trace seconds per wall second")
    parser.add_argument("--rate-scale", type=float, gt=0, le=1_000_000, default=1.0, help="multiply the trace's rates")
    parser.add_argument(
        "--partitions", type=int, ge=1, le=10_000, default=8, help="partitions when the topic is created"
    )
    parser.add_argument(
        "--hot-share",
        "--skew",
        dest="hot_share",
        type=float,
        ge=0,
        lt=1,
        default=0.0,
        help="traffic share of partition 0, e.g. 0.5",
    )
    parser.add_argument("--seed", type=int, ge=0, le=2**32 - 1, default=0)
    parser.add_argument(
        "--samples-per-record",
        type=int,
        ge=1,
        le=100_000,
        default=1,
        help="pack this many samples in each Kafka record (set the same on the pipeline's KafkaSource)",
    )
    parser.add_argument(
        "--max-seconds", type=float, gt=0, le=366 * 86_400, default=None, help="stop after this many wall seconds"
    )
    parser.set_defaults(handler=run)


def run(args) -> int:
    settings = ReplaySettings(
        topic=args.topic,
        speedup=args.speedup,
        rate_scale=args.rate_scale,
        partitions=args.partitions,
        hot_share=args.hot_share,
        seed=args.seed,
        samples_per_record=args.samples_per_record,
    )
    history = read_trace_csv(args.trace)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    from kafka.errors import KafkaError

    try:
        sent = replay(args.bootstrap_servers, history, settings, stop=stop, max_wall_s=args.max_seconds)
    except KafkaError as exc:
        raise CommandError(f"could not produce to {args.bootstrap_servers}: {exc}") from None
    print(f"produced {sent} samples to {args.topic}")
    return 0
