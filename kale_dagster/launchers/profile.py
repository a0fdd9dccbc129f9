"""F(w) profiled before going live (the paper's section 3.3): the pipeline's trainer run at a few worker counts on the
records its topics retain, each count's capacity written to the metrics history as the sensor writes live ones.

A team that runs its trainer at one size never shows F(w) at others, and without them neither the controller nor the
savings report has a throughput model.  Profiling runs local workers of the pipeline's trainer (on the machine whose
GPUs they stand for) in a consumer group of their own, ``<group_id>.kale-profile.<start time>`` (deleted after it,
where the brokers allow), and a checkpoint directory of their own: the team's committed offsets and checkpoints
are untouched, and every profile starts from the oldest record retained.  Each count trains on from where the
previous one stopped; only readings in which no worker waited for data are its capacity (``saturated``), so a topic
whose retained records run out says so rather than record the arrival rate as F(w).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kale_dagster.launchers.local import LocalLauncher
from kale_dagster.trainer.settings import TrainerSettings

#: The profile's own consumer group: the team's committed offsets stay where their trainer left them.
PROFILE_GROUP_SUFFIX = ".kale-profile"


class ProfileError(RuntimeError):
    """A count could not be measured; the message says which and what to change."""


@dataclass(frozen=True)
class ProfiledCount:
    """One worker count's capacity: the median of its saturated readings (samples per wall second)."""

    workers: int
    samples_per_s: float
    readings: int
    emulated: bool


def profile_settings(settings: TrainerSettings, checkpoint_dir: str) -> TrainerSettings:
    """The workers' settings for a profile: the same trainer and stream, a group and checkpoints of its own."""
    group = f"{settings.source.group_id}{PROFILE_GROUP_SUFFIX}.{int(time.time())}"
    return dataclasses.replace(
        settings, source=dataclasses.replace(settings.source, group_id=group), checkpoint_dir=checkpoint_dir
    )


def delete_profile_group(settings: TrainerSettings) -> str:
    """Delete the profile's consumer group; what to do by hand where the brokers refuse (empty when deleted)."""
    from kafka import KafkaAdminClient

    group = settings.source.group_id
    try:
        admin = KafkaAdminClient(**settings.source.client_config())
        try:
            admin.delete_consumer_groups([group])
        finally:
            admin.close()
    except Exception as exc:  # the profile is measured either way: say what is left behind
        return f"the profile's consumer group {group} remains ({type(exc).__name__}: {exc}); delete it with your tools"
    return ""


def profile_throughput(
    settings: TrainerSettings,
    counts: Sequence[int],
    seconds: float,
    poll_s: float = 1.0,
    on_count: Callable[[ProfiledCount], None] | None = None,
) -> list[ProfiledCount]:
    """Run ``settings``' trainer at each of ``counts`` workers for ``seconds`` after its first full report, and
    return each count's capacity (``on_count`` is told each as it is measured, to record it at once)."""
    launcher = LocalLauncher(settings, pool_size=1, max_workers=max(counts))
    measured = []
    try:
        for n in counts:
            launcher.rescale(n, reason=f"profile at {n}")
            measured.append(_measure(launcher, n, seconds, poll_s))
            if on_count is not None:
                on_count(measured[-1])
    finally:
        launcher.stop()
    return measured


def _measure(launcher: LocalLauncher, n: int, seconds: float, poll_s: float) -> ProfiledCount:
    """The median of the saturated readings over ``seconds`` from the group's first full report."""
    rates: list[float] = []
    starved, emulated, deadline = 0, False, None
    while deadline is None or time.monotonic() < deadline:
        launcher.supervise_once()
        status = launcher.status()
        if status.failed:
            raise ProfileError(f"the workers failed at {n}: {status.failed}")
        if status.samples_per_s is not None:
            deadline = deadline or time.monotonic() + seconds
            emulated = status.emulated
            if status.saturated:
                rates.append(status.samples_per_s)
            else:
                starved += 1
        time.sleep(poll_s)
    if not rates:
        raise ProfileError(
            f"at {n} worker(s) the workers waited for data in all {starved} readings: the topics' retained records "
            "ran out, so their capacity was not reached; produce more (or profile fewer counts, for less time)"
        )
    return ProfiledCount(n, statistics.median(rates), len(rates), emulated)
