"""Telemetry snapshot latency at 8, 100 and 800 partitions on the embedded broker.

Each partition holds records and a committed offset behind its end, so the
snapshot reads every partition's oldest unconsumed record.  Prints the
median of --repeats snapshots per size.

    python bench/telemetry_snapshot.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata, TopicPartition

from kale_dagster.definitions.resources import KafkaStreamResource
from kale_dagster.stream.broker import embedded_broker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with embedded_broker() as broker:
        servers = broker.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=servers)
        producer = KafkaProducer(bootstrap_servers=servers, linger_ms=20)
        for partitions in (8, 100, 800):
            topic = f"bench{partitions}"
            admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
            for p in range(partitions):
                for _ in range(10):
                    producer.send(topic, value=b"x" * 32, partition=p)
            producer.flush()
            consumer = KafkaConsumer(bootstrap_servers=servers, group_id=f"g{partitions}", enable_auto_commit=False)
            consumer.commit({TopicPartition(topic, p): OffsetAndMetadata(4, "", -1) for p in range(partitions)})
            consumer.close()
            resource = KafkaStreamResource(bootstrap_servers=servers, topics=[topic], group_id=f"g{partitions}")
            times, lag = [], None
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                snap = resource.snapshot(fetch_timeout_s=30)
                times.append(time.perf_counter() - t0)
                lag = snap.sample_lag
            assert lag == 6 * partitions, (lag, partitions)
            print(
                f"{partitions:>4} partitions: median snapshot {statistics.median(times) * 1000:7.1f} ms "
                f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}; lag {lag} exact, time lag complete "
                f"{snap.time_lag_complete})"
            )
        producer.close()
        admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
