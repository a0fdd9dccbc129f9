"""Offsets committed to Kafka off the training thread.

Kafka's committed offsets are what lag is measured from (telemetry, KEDA);
a restarting group resumes from its checkpoint's offsets, not from Kafka's.
So a commit must follow its checkpoint (never run ahead of what was saved)
but must not hold up the group: a slow or frozen broker would otherwise
block rank 0 in the commit while the other ranks time out in the next
collective, and the group would crash-restart for a telemetry write.  Only
the newest offsets matter: a commit still pending when a newer checkpoint
arrives is replaced, not queued.
"""

from __future__ import annotations

import sys
import threading

from kale_dagster.trainer.partitions import StreamPartitions


class OffsetCommitter:
    """Commits the latest submitted offsets of ``stream``'s partitions (keyed as the harness numbers them) for
    ``group_id`` in a background thread, retrying."""

    def __init__(self, kafka_config: dict, group_id: str, stream: StreamPartitions, retry_s: float = 1.0):
        self.kafka_config, self.group_id, self.stream, self.retry_s = kafka_config, group_id, stream, retry_s
        self._pending: dict[int, int] | None = None
        self._wake = threading.Condition()
        self._idle = threading.Event()
        self._idle.set()
        self._closed = False
        self._consumer = None
        self.committed: dict[int, int] | None = None  # the last offsets Kafka acknowledged
        self._thread = threading.Thread(target=self._run, name="offset-committer", daemon=True)
        self._thread.start()

    def submit(self, offsets: dict[int, int]) -> None:
        """Commit ``offsets`` soon (they replace any not yet committed); returns at once."""
        with self._wake:
            self._pending = dict(offsets)
            self._idle.clear()
            self._wake.notify()

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the pending commit; whether Kafka has the latest offsets."""
        return self._idle.wait(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Commit what is pending (up to ``timeout_s``), then stop."""
        self.flush(timeout_s)
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=1.0)
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # closing a connection to a broker that is gone
                pass

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                offsets = self._pending
            assert offsets is not None  # woken with offsets to commit
            try:
                self._commit(offsets)
            except Exception as exc:  # the broker is down or slow: keep the offsets unless newer ones came
                print(
                    f"offset commit failed, retrying in {self.retry_s:g} s: {type(exc).__name__}: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
                with self._wake:
                    self._wake.wait(self.retry_s)
                continue
            with self._wake:
                self.committed = offsets
                if self._pending is offsets:
                    self._pending = None
                    self._idle.set()

    def _commit(self, offsets: dict[int, int]) -> None:
        from kafka import KafkaConsumer
        from kafka.structs import OffsetAndMetadata, TopicPartition

        if self._consumer is None:  # kept open: a connection per checkpoint would add to every rescale
            self._consumer = KafkaConsumer(**self.kafka_config, group_id=self.group_id, enable_auto_commit=False)
        self._consumer.commit(
            {TopicPartition(*self.stream.topic_partition(p)): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
        )
