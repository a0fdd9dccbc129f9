"""The demo's Dagster code location: the ``demo`` pipeline only, shipped inside the package.

``kale demo`` serves it with ``dagster dev -m kale_dagster.demo.definitions``
(no source checkout needed) and passes where the demo's broker and trainer
service listen, and the demo's compressed durations, through the
environment.  The defaults match ``kale broker`` and ``kale trainer serve``.
"""

import os

from kale_dagster.definitions.build import build_definitions
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.demo import GROUP, PIPELINE, TOPIC
from kale_dagster.launchers.service import LocalLauncherConfig
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.stream.source import KafkaSource

demo = OnlineTrainingPipeline(
    name=PIPELINE,
    source=KafkaSource(
        bootstrap_servers=os.environ.get("KALE_DEMO_BOOTSTRAP", "127.0.0.1:9092"),
        topics=(TOPIC,),
        group_id=GROUP,
        request_timeout_ms=3000,
    ),
    min_workers=1,
    max_workers=4,
    slo_minutes=float(os.environ.get("KALE_DEMO_SLO_MINUTES", "20")),
    restart_minutes=float(os.environ.get("KALE_DEMO_RESTART_MINUTES", "10")),
    throughput_prior=ThroughputModel.linear(float(os.environ.get("KALE_DEMO_WORKER_RATE", "200"))),
    launcher=LocalLauncherConfig(os.environ.get("KALE_DEMO_TRAINER_URL", "http://127.0.0.1:8765")),
)

defs = build_definitions(demo)
