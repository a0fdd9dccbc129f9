"""The source's partitions as the harness numbers them: one integer per (topic, partition).

Kafka names a partition by its topic and number; the harness's queues, checkpoints, balance and arrival order key
by one integer, so a source of several topics is balanced as one set of partitions.  The i-th declared topic's
partition p is ``i * TOPIC_STRIDE + p``: a one-topic source keeps Kafka's numbers, so checkpoints written before
several topics were trained restore as they were.  A checkpoint names its topics, so a reordered or extended
``topics`` restores each offset to its own topic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Above any topic's partition count (Kafka's practical limit is thousands per cluster).
TOPIC_STRIDE = 1 << 20


@dataclass(frozen=True)
class StreamPartitions:
    """The numbering of one source's topics (in their declared order)."""

    topics: tuple[str, ...]

    def __post_init__(self):
        if not self.topics or len(set(self.topics)) != len(self.topics):
            raise ValueError(f"topics must be distinct and at least one, got {self.topics}")

    def key(self, topic: str, partition: int) -> int:
        if not 0 <= partition < TOPIC_STRIDE:
            raise ValueError(f"{topic}[{partition}]: a partition number must be below {TOPIC_STRIDE}")
        return self.topics.index(topic) * TOPIC_STRIDE + partition

    def topic_partition(self, key: int) -> tuple[str, int]:
        index, partition = divmod(key, TOPIC_STRIDE)
        return self.topics[index], partition

    def restored(self, offsets: Mapping[int, int], saved_topics: Sequence[str] | None) -> dict[int, int]:
        """A checkpoint's offsets keyed for these topics: ``saved_topics`` numbered them (None: a checkpoint of a
        one-topic harness, this source's first topic); a topic the checkpoint did not have is left out."""
        saved = StreamPartitions(tuple(saved_topics or self.topics[:1]))
        out = {}
        for key, offset in offsets.items():
            topic, partition = saved.topic_partition(int(key))
            if topic in self.topics:
                out[self.key(topic, partition)] = offset
        return out

    def label(self, key: int) -> str:
        """How messages name a partition: ``topic[partition]``."""
        topic, partition = self.topic_partition(key)
        return f"{topic}[{partition}]"
