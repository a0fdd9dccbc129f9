"""What every worker of a pipeline is started with: one spec, ``TrainerSettings``, from which its flags are derived.

The launchers write the flags (``TrainerSettings.argv``: the local launcher's processes, the Kubernetes Job's
torchrun line), the worker reads them back (``worker_parser``, then ``TrainerSettings.from_args`` checks them
with the same field rules), and ``kale trainer serve`` offers the same ones (``cli.declared.add_flags``).  A new
setting is one field here, with its rule: nothing else spells its flag.

The stream (``--bootstrap-servers``, ``--topics``, ``--group-id``) comes from the pipeline's ``KafkaSource`` and
the trainer (``--trainer``, ``--trainer-options``) from its ``TrainerSpec``; their secrets never become flags
(``KafkaSource.worker_env``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass

from kale_dagster.errors import KaleConfigError
from kale_dagster.rules import check, flag, flag_arguments, renamed, rule_of, setting
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer import location
from kale_dagster.trainer.api import DEFAULT_TRAINER, TrainerSpec
from kale_dagster.trainer.protocol import COLLECTIVE_TIMEOUT_S


@dataclass(frozen=True)
class TrainerSettings:
    """What every worker of a pipeline is started with; the stream comes from the pipeline's source and the
    trainer from its ``TrainerSpec``.  Each ruled field is one flag of the worker."""

    source: KafkaSource
    checkpoint_dir: str = setting(
        description="where checkpoints are written, shared by every worker: a path or an s3://, gs:// or az:// URL",
        # An unknown scheme taken as a path would write into a local folder named "foo:", lost with the pod.
        pattern=location.PATTERN,
        hint=location.HINT,
    )
    batch_size: int = setting(256, ge=1, le=1_000_000, description="samples per worker step")
    emulate_gpu_rate: float = setting(0.0, ge=0, le=1e9, description="EMULATION of one GPU's samples/s; 0: off")
    emulate_restore_s: float = setting(
        0.0, ge=0, le=86_400, unit="s", description="EMULATION of a large model's restore at every (re)start; 0: off"
    )
    checkpoint_every_s: float = setting(5.0, gt=0, le=86_400, unit="s", description="how often a checkpoint is written")
    keep: int = setting(3, ge=1, le=1000, description="checkpoints kept (older ones are pruned)")
    checkpoint_timeout_s: float = setting(
        600.0,
        gt=0,
        le=86_400,
        unit="s",
        description="one call to an object store at most: an upload past it fails, the last checkpoint stays",
    )
    metrics_every_s: float = setting(2.0, gt=0, le=3600, unit="s", description="the workers' metrics window")
    balance: str = setting(
        "rates",
        choices=("rates", "round-robin"),
        description="rates: partitions by measured rate, overflow forwarded; round-robin: neither (a baseline)",
    )
    order_lead_s: float = setting(
        0.5,
        ge=0,
        le=3600,
        unit="s",
        description="how far (record time) a partition may run ahead of the rank's oldest backlog before it is paused",
    )
    max_queue: int = setting(2048, ge=1, le=10_000_000, description="samples a rank may hold queued")
    high_watermark: int = setting(768, ge=1, le=10_000_000, description="queued samples at which fetching pauses")
    low_watermark: int = setting(256, ge=0, le=10_000_000, description="queued samples at which fetching resumes")
    collective_timeout_s: float = setting(
        COLLECTIVE_TIMEOUT_S, gt=0, le=3600, unit="s", description="how long a collective waits for a hung rank"
    )
    trained_log: str | None = setting(
        None,
        description="a directory for per-rank logs of every trained (partition, offset, sample seq): end-to-end "
        "accounting for tests and benchmarks",
    )
    trainer: TrainerSpec = dataclasses.field(default_factory=TrainerSpec)  # --trainer, --trainer-options
    pipeline: str = setting("", description="the pipeline's name, as the trainer factory's context tells it")

    def __post_init__(self):
        check(self, self._watermark_problems)

    def _watermark_problems(self) -> list[KaleConfigError]:
        """Each field of a pair out of order is named: either may be the one to fix."""
        low, high, most = self.low_watermark, self.high_watermark, self.max_queue
        problems = []
        if not low < high:
            problems += [
                KaleConfigError("low_watermark", f"must be below high_watermark ({high}), got {low}"),
                KaleConfigError("high_watermark", f"must be above low_watermark ({low}), got {high}"),
            ]
        if not high <= most:
            problems += [
                KaleConfigError("high_watermark", f"must be at most max_queue ({most}), got {high}"),
                KaleConfigError("max_queue", f"must be at least high_watermark ({high}), got {most}"),
            ]
        return problems

    def argv(self) -> list[str]:
        """The worker's flags for these settings (no secret: those travel in ``KafkaSource.worker_env``)."""
        src = self.source
        args = ["--bootstrap-servers", src.bootstrap_servers, "--topics", ",".join(src.topics)]
        args += ["--group-id", src.group_id]
        for f in _flag_fields():
            value = getattr(self, f.name)
            if value is not None:
                args += [flag(f.name), str(value)]
        return args + self.trainer.argv(self.pipeline)

    def env(self) -> dict[str, str]:
        """The workers' environment: this process's, plus the source's Kafka security settings."""
        return dict(os.environ, PYTHONUNBUFFERED="1", **self.source.worker_env(include_password=True))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainerSettings:
        """The settings a worker's parsed flags say, checked by the same field rules (errors name the flags)."""
        source = renamed(
            flag, KafkaSource, bootstrap_servers=args.bootstrap_servers, topics=args.topics, group_id=args.group_id
        )
        trainer = renamed(flag, TrainerSpec, trainer=args.trainer, trainer_options=json.loads(args.trainer_options))
        values = {f.name: getattr(args, f.name) for f in _flag_fields()}
        return renamed(flag, cls, source=source, trainer=trainer, pipeline=args.pipeline, **values)


def _flag_fields() -> list[dataclasses.Field]:
    """The ruled fields, each one flag (``pipeline`` rides with the trainer's flags)."""
    return [f for f in dataclasses.fields(TrainerSettings) if rule_of(f) is not None and f.name != "pipeline"]


def topic_list(flag_value: str) -> tuple[str, ...]:
    """``--topics a,b``: Kafka's topic names hold no comma."""
    return tuple(t.strip() for t in flag_value.split(",") if t.strip())


def worker_parser() -> argparse.ArgumentParser:
    """The worker's command line: every flag ``TrainerSettings.argv`` writes, and ``--standby``."""
    parser = argparse.ArgumentParser(description="kale trainer worker")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topics", "--topic", dest="topics", required=True, type=topic_list, help="comma-separated")
    parser.add_argument("--group-id", required=True)
    parser.add_argument("--trainer", default=DEFAULT_TRAINER, help="the trainer factory, module:attribute")
    parser.add_argument("--trainer-options", default="{}", help="JSON object passed to the factory as options")
    for f in [*_flag_fields(), next(f for f in dataclasses.fields(TrainerSettings) if f.name == "pipeline")]:
        parser.add_argument(flag(f.name), **flag_arguments(TrainerSettings, f))
    parser.add_argument("--standby", action="store_true", help="wait for rank/world on stdin (warm standby)")
    return parser
