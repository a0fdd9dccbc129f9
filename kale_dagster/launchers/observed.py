"""Advisory mode on a trainer Kale did not start: its consumer group, observed, never restarted.

Most teams already run their online trainer.  Before they let anything restart it, they watch what Kale
would do (AWS predictive scaling's forecast-only mode).  ``ObservedGroupLauncherConfig`` is the launcher for that:
it reports the workers that run from the group's membership (``stream.group``), a rebalance as a restart in
progress, and the measured length of each rebalance as a restart time, and it refuses to rescale.  The
throughput is measured from the group's committed offsets, as for any pipeline (``stream.telemetry``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from kale_dagster.launchers.base import Launcher, LauncherConfig, LauncherStatus, RescaleRecord
from kale_dagster.model.limits import MAX_WORKERS
from kale_dagster.model.restarts import RestartSpans
from kale_dagster.rules import check, setting
from kale_dagster.stream.group import REBALANCING, describe_group, worker_count
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.api import TrainerSpec


class ObservedGroup(Launcher):
    """The status of a consumer group Kale watches; it never restarts it."""

    def __init__(self, source: KafkaSource, declared_workers: int | None, clock=time.monotonic):
        self.source, self.declared_workers, self.clock = source, declared_workers, clock
        self._seen = RestartSpans(keep=5)  # its rebalances, across sensor ticks
        self._seen_lock = threading.Lock()  # sensor ticks of one code server may overlap

    def status(self) -> LauncherStatus:
        view = describe_group(self.source.client_config(), self.source.group_id, self.source.topics)
        workers, how = worker_count(view, self.declared_workers)
        if workers is None:  # never read as 0 workers: the controller holds, saying why
            raise RuntimeError(f"cannot tell how many workers consumer group {self.source.group_id!r} runs: {how}")
        rebalancing = view is not None and view.state in REBALANCING
        with self._seen_lock:
            self._seen.saw(rebalancing, self.clock())
            lengths = tuple(self._seen.lengths)
        return LauncherStatus(workers=workers, rescaling=rebalancing, downtimes_s=lengths, observed_from=how)

    def rescale(self, m: int, reason: str = "rescale") -> RescaleRecord | None:
        raise RuntimeError(
            f"consumer group {self.source.group_id!r} is observed, not run, by Kale: it is never rescaled "
            "(declare the pipeline advisory, or a launcher that restarts the workload)"
        )


@dataclass(frozen=True)
class ObservedGroupLauncherConfig(LauncherConfig):
    """Watch the pipeline's consumer group, run by someone else; advisory pipelines only.

    ``workers``: the count to use when membership cannot tell it (consumers that ``assign()`` partitions,
    a KIP-848 group); the decision says when it was used."""

    workers: int | None = setting(
        None,
        ge=1,
        le=MAX_WORKERS,
        description="the group's workers when its membership cannot tell (assign()-based consumers, KIP-848 groups)",
    )

    def __post_init__(self):
        check(self)

    def build(
        self, pipeline: str, source: KafkaSource, trainer: TrainerSpec, workers_per_pod: int = 1
    ) -> ObservedGroup:
        return ObservedGroup(source, self.workers)

    def describe(self) -> str:
        return "the observed consumer group (advisory: never rescaled)"
