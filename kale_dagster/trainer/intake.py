"""One rank's partitions for one group: read from Kafka into its sample queue, in arrival order, decoded by the
user's trainer, and where each partition's next record is (what a checkpoint resumes at).

The rank's partitions (the source's topics' as one set, ``partitions``) are assigned by measured rate
(``balance``), opened at the checkpoint's offsets (or the group's committed ones, before the first checkpoint), and
paused while they run ahead of the rank's oldest backlog (``ordering``).  A record the user's ``decode`` refuses
(``ValueError``) is skipped and counted.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import numpy as np

from kale_dagster.stream.record_time import usable_ms
from kale_dagster.stream.security import security_settings
from kale_dagster.stream.source import WORKER_ENV, Secret
from kale_dagster.trainer.api import Record, TrainerFailure
from kale_dagster.trainer.balance import assign_by_rate, round_robin
from kale_dagster.trainer.ordering import ArrivalOrder
from kale_dagster.trainer.partitions import StreamPartitions
from kale_dagster.trainer.sample_queue import ORIGIN, SampleQueue, Samples

# A partition that may deliver and does not for this long stops holding this rank's others back (ordering).
ORDER_STALL_S = 2.0


def kafka_config(servers: str) -> dict:
    """kafka-python settings: servers from the command line, security from the environment.

    On Kubernetes the environment comes from the pipeline's Secret (envFrom),
    so credentials never appear in a manifest or on a command line.
    """
    config: dict[str, object] = {"bootstrap_servers": servers.split(",")}
    for env, key in WORKER_ENV.items():
        if os.environ.get(env):
            config[key] = os.environ[env]
    for secret in ("sasl_plain_password", "ssl_password"):  # kafka-python logs its configuration at DEBUG
        if secret in config:
            config[secret] = Secret(str(config[secret]))
    tls = {k: config.pop(k, None) for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password")}
    provider = config.pop("sasl_oauth_token_provider", None)
    return {**config, **security_settings(**tls, sasl_oauth_token_provider=provider)}  # type: ignore[arg-type]


def _unblock_resumed_partitions(consumer) -> None:
    """Work around kafka-python 3.0.12: records parked while their partition was paused come back on resume only
    when no partition's records are in line, and it tests that with ``is None`` while a drained partition's
    records stay in line (empty, not None).  Until then the resumed partition is neither handed out nor fetched
    again, and the rank stops training it.  An emptied line is cleared so the next poll restores the parked data."""
    fetcher = getattr(consumer, "_fetcher", None)
    in_line = getattr(fetcher, "_next_partition_records", None)
    if (
        fetcher is not None
        and in_line is not None
        and not in_line
        and getattr(fetcher, "_paused_partition_records", None)
    ):
        fetcher._next_partition_records = None


class PartitionIntake:
    """A rank's partitions for one group (see the module docstring)."""

    def __init__(self, args, rank: int, world: int, decode: Callable, on_poison: Callable[[int], None], state: dict):
        from kafka import KafkaConsumer
        from kafka.structs import TopicPartition

        self.args, self.decode, self.on_poison = args, decode, on_poison
        self.samples_per_record = 1  # as last seen: turns the queue's room into a record count
        consumer = self.consumer = KafkaConsumer(
            **kafka_config(self.args.bootstrap_servers),
            enable_auto_commit=False,
            group_id=None,
            max_partition_fetch_bytes=1 << 20,
            fetch_max_wait_ms=50,
        )
        self.stream = stream = StreamPartitions(tuple(self.args.topics))
        partitions = []
        for topic in stream.topics:
            found = consumer.partitions_for_topic(topic)
            if not found:
                raise RuntimeError(f"topic {topic!r} has no partitions")
            partitions += [stream.key(topic, p) for p in sorted(found)]
        rates = state.get("partition_rates") or {p: 1.0 for p in partitions}
        rates = {p: float(rates.get(p, 1.0)) for p in partitions}  # one set of partitions over every topic
        plan = assign_by_rate(rates, world) if self.args.balance == "rates" else round_robin(partitions, world)
        self.assigned = {p: TopicPartition(*stream.topic_partition(p)) for p in plan[rank]}
        if self.assigned:  # more workers than partitions: this one trains forwarded samples only
            consumer.assign(list(self.assigned.values()))
        offsets = stream.restored(state.get("offsets", {}), state.get("topics"))
        # Partitions the checkpoint does not cover (none before the first; a topic added since) resume at the group's
        # committed offsets.
        committed = self._committed([p for p in self.assigned if p not in offsets])
        for p, tp in self.assigned.items():
            pos = offsets.get(p, committed.get(p))
            if pos is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, pos)
        self.next_pos: dict[int, int] = {p: consumer.position(tp) or 0 for p, tp in self.assigned.items()}  # seeked
        self.start_pos = dict(self.next_pos)
        self.order = ArrivalOrder(lead_ms=int(self.args.order_lead_s * 1000), stall_s=ORDER_STALL_S)
        self.partitions = list(self.assigned)

    def close(self) -> None:
        self.consumer.close()

    def _committed(self, keys: list[int]) -> dict[int, int]:
        if not keys:
            return {}
        from kafka import KafkaConsumer

        c = KafkaConsumer(
            **kafka_config(self.args.bootstrap_servers), group_id=self.args.group_id, enable_auto_commit=False
        )
        try:
            return {p: off for p in keys if (off := c.committed(self.assigned[p])) is not None}
        finally:
            c.close()

    def fill(self, queue: SampleQueue) -> None:
        """Queue what has arrived, as much as the queue has room for, the partitions kept in arrival order."""
        consumer = self.consumer
        room = self.args.max_queue - len(queue.own)
        if room <= 0 or not self.next_pos:
            return
        # kafka-python drives its network I/O inside poll(): with a batch queued
        # a zero timeout just collects what has arrived; a starving worker waits
        # 5 ms, enough for a fetch to complete without stalling the collective.
        wait_ms = 0 if len(queue) >= self.args.batch_size else 5
        while room > 0:
            # A batch's worth at a time: the partitions that run ahead are paused before the rest of the room fills.
            want = max(min(room, self.args.batch_size) // self.samples_per_record, 1)
            _unblock_resumed_partitions(consumer)
            polled = consumer.poll(timeout_ms=wait_ms, max_records=want)
            wait_ms, got, newest = 0, 0, {}
            for tp, records in polled.items():
                if not records:
                    continue
                got += len(records)
                key = self.stream.key(tp.topic, tp.partition)
                newest[key] = usable_ms(records[-1].timestamp, time.time())
                self._queue_records(key, records, queue)
            self._keep_arrival_order(consumer, newest)
            if got < want:
                return  # nothing more fetched for the partitions that may deliver
            room = self.args.max_queue - len(queue.own)

    def _queue_records(self, partition: int, records: list, queue: SampleQueue) -> None:
        """Decode with the user's ``decode``; a record it refuses (``ValueError``) is skipped and counted, never
        retried: its offset is passed like any other."""
        decode, now = self.decode, time.time()
        topic, number = self.stream.topic_partition(partition)
        items: list = []
        origin: list[tuple[int, int, int]] = []
        refused: list[tuple[int, str]] = []
        most = 0
        for r in records:
            record = Record(r.value, r.key, usable_ms(r.timestamp, now), number, r.offset, topic)
            try:
                samples = list(decode(record))
            except ValueError as exc:
                refused.append((r.offset, str(exc)))
                continue
            except Exception as exc:  # a bug in decode, not a bad record: skipping would lose good records
                raise TrainerFailure(
                    f"{self.args.trainer}: decode raised {type(exc).__name__}: {exc} on "
                    f"{self.stream.label(partition)} offset {r.offset} (raise ValueError for a record to skip)"
                ) from exc
            items.extend(samples)
            # Every sample of a packed record carries the record's offset: a checkpoint resumes at that record.
            origin.extend((partition, r.offset, i) for i in range(len(samples)))
            most = max(most, len(samples))
        if refused:
            self.on_poison(len(refused))
            offset, why = refused[0]
            print(
                f"skipped {len(refused)} record(s) that {self.args.trainer}'s decode refused in "
                f"{self.stream.label(partition)}, first at offset {offset}: {why}"[:1000],
                file=sys.stderr,
                flush=True,
            )
        queue.add_own(Samples(items, np.array(origin, dtype=ORIGIN)))
        self.samples_per_record = most or self.samples_per_record
        self.next_pos[partition] = records[-1].offset + 1

    def _keep_arrival_order(self, consumer, newest: dict[int, int | None]) -> None:
        """Pause the partitions that run ahead of this rank's oldest backlog, resume the others (``ordering``)."""
        backlogged = [
            p for p, tp in self.assigned.items() if (hw := consumer.highwater(tp)) is None or self.next_pos[p] < hw
        ]
        paused = self.order.held
        held = self.order.polled(newest, backlogged, time.monotonic())
        if held != paused:
            consumer.resume(*(self.assigned[p] for p in paused - held))
            consumer.pause(*(self.assigned[p] for p in held - paused))

    def caught_up(self) -> bool:
        """Every partition of this rank has reported its high watermark and been read up to it."""
        consumer = self.consumer
        return all(
            (hw := consumer.highwater(tp)) is not None and self.next_pos[p] >= hw for p, tp in self.assigned.items()
        )
