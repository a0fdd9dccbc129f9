"""The demo's Dagster code location: the ``demo`` pipeline only, shipped inside the package.

``kale demo`` serves it with ``dagster dev -m kale_dagster.demo.definitions``
(no source checkout needed); ``bench/end_to_end.py`` serves it too, once per
policy it measures.  Where the broker and the trainer service listen, how
the day is compressed and which policy decides are in one settings file
the run writes into its Dagster home (``$DAGSTER_HOME/kale/demo.json``);
without one, the defaults match ``kale broker`` and ``kale trainer serve``
in real time.
"""

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from kale_dagster.control.clock import PipelineClock
from kale_dagster.definitions.build import build_definitions
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.demo import GROUP, PIPELINE, TOPIC
from kale_dagster.launchers.service import DEFAULT_URL, LocalLauncherConfig
from kale_dagster.model.limits import Limits
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.stream.source import KafkaSource


@dataclass(frozen=True)
class DemoLocation:
    """What the demo's code location needs to know of the running demo."""

    bootstrap_servers: str = "127.0.0.1:9092"
    trainer_url: str = DEFAULT_URL
    time_scale: float = 1.0
    wall_start: float | None = None
    pipeline_start: float | None = None
    worker_rate: float = 200.0  # EMULATED samples per wall second per worker: the throughput prior
    limits: Limits = field(default_factory=lambda: Limits(max_workers=5))
    policy: str = "kale"
    policy_options: dict = field(default_factory=dict)  # JSON: an HPA's behavior as Kubernetes writes it
    samples_per_record: int = 1
    autostart: bool = True  # False: the sensors wait for an operator (or a benchmark) to start them

    @staticmethod
    def path(home: str) -> Path:
        return Path(home) / "kale" / "demo.json"

    def save(self, home: str) -> None:
        self.path(home).write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, home: str | None) -> "DemoLocation":
        if not home or not cls.path(home).is_file():
            return cls()
        known = {f.name for f in fields(cls)}
        saved = {k: v for k, v in json.loads(cls.path(home).read_text()).items() if k in known}
        return cls(**{**saved, "limits": Limits(**saved.get("limits", {}))})

    def pipeline(self) -> OnlineTrainingPipeline:
        clock = PipelineClock(self.time_scale, self.wall_start, self.pipeline_start)
        return OnlineTrainingPipeline(
            name=PIPELINE,
            source=KafkaSource(
                bootstrap_servers=self.bootstrap_servers,
                topics=(TOPIC,),
                group_id=GROUP,
                request_timeout_ms=3000,
                samples_per_record=self.samples_per_record,
            ),
            limits=self.limits,
            policy=self.policy,
            policy_options=self.policy_options,
            throughput_prior=ThroughputModel.linear(clock.rate(self.worker_rate)),
            launcher=LocalLauncherConfig(self.trainer_url),
            advisory=False,  # the demo shows Kale rescaling its own trainer
            clock=clock,
            autostart=self.autostart,
        )


demo = DemoLocation.load(os.environ.get("DAGSTER_HOME")).pipeline()
defs = build_definitions(demo)
