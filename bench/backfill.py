"""Warm start from Kafka: rebuild 7 days x 64 partitions of arrivals on the embedded broker.

Records are produced with timestamps spread over the last week (the producer
stamps them), then ``rebuild_arrivals`` rebuilds the per-bucket counts at the
sensor's default cadence (60 s).  Prints the method the probe chose, the
requests made, the wall time (median of --repeats) and whether every
bucket's count equals the produced one.  The embedded broker's time index is
wrong, so this measures the Fetch search; on Apache Kafka the time index
answers with one ListOffsets request per boundary (10,081 here), which
cannot be timed on this machine.

    python bench/backfill.py [--partitions 64] [--days 7] [--records-per-minute 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic

from kale_dagster.stream.backfill import rebuild_arrivals
from kale_dagster.stream.broker import embedded_broker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--records-per-minute", type=float, default=2.0, help="per partition, on average")
    parser.add_argument("--bucket-seconds", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    bucket = args.bucket_seconds
    now = time.time()
    end = int(now // bucket) * bucket
    start = end - args.days * 86_400
    buckets = int(round((end - start) / bucket))
    produced = [0] * buckets
    rng = random.Random(0)
    with embedded_broker() as broker:
        servers = broker.bootstrap_servers
        KafkaAdminClient(bootstrap_servers=servers).create_topics(
            [NewTopic("bench", num_partitions=args.partitions, replication_factor=1)]
        )
        producer = KafkaProducer(bootstrap_servers=servers, linger_ms=50, batch_size=1 << 18)
        began = time.monotonic()
        per_partition = int(args.records_per_minute * args.days * 1440)
        for p in range(args.partitions):
            for t in sorted(rng.uniform(start, end) for _ in range(per_partition)):
                producer.send("bench", value=b"x" * 29, partition=p, timestamp_ms=int(t * 1000))
                produced[min(buckets - 1, int((t - start) // bucket))] += 1
        producer.flush()
        producer.close()
        print(
            f"produced {sum(produced):,} records over {args.days:g} days x {args.partitions} partitions "
            f"in {time.monotonic() - began:.0f} s; {buckets:,} buckets of {bucket:g} s"
        )

        seconds, result = [], None
        for _ in range(args.repeats):
            consumer = KafkaConsumer(
                bootstrap_servers=servers,
                enable_auto_commit=False,
                group_id=None,
                max_partition_fetch_bytes=1 << 20,
                fetch_max_wait_ms=50,
            )
            began = time.monotonic()
            result = rebuild_arrivals(consumer, ["bench"], days=args.days, bucket_s=bucket, now=now)
            seconds.append(time.monotonic() - began)
            consumer.close()
        assert result is not None  # --repeats >= 1
        rebuilt = list(result.rows["records"])
        skipped = buckets - len(rebuilt)  # buckets before the first record are left out
        exact = rebuilt == produced[skipped:]
        print(
            f"method: {result.method}; requests: {result.requests:,} "
            f"({result.requests / args.partitions:.1f} per partition); "
            f"time: median {statistics.median(seconds):.1f} s of {args.repeats} "
            f"({', '.join(f'{s:.1f}' for s in seconds)})"
        )
        print(f"buckets rebuilt: {len(rebuilt):,}; every count equals the produced one: {exact}")
        if result.note:
            print(f"note: {result.note}")
        return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
