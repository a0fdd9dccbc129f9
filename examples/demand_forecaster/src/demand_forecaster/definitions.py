"""The Dagster declaration: Kale watches this team's own trainer on the topic ``demand``, advisory first.

The team runs its trainer (``kale trainer serve`` here, or the image of ``Dockerfile`` on Kubernetes) at a size of
its choosing; Kale reads the stream and the workers, decides at every reading, records what it would have done, and
each morning writes ``demand/savings``: what ran beside what Kale would have run.  Nothing is rescaled until the
team declares ``advisory=False``.

A trial on one machine compresses time (``demand_forecaster.trial``); in production, time is time.
"""

from __future__ import annotations

import os

from demand_forecaster.trial import TRIAL_GPU_RATE, trial_clock
from kale_dagster import (
    KafkaSource,
    Limits,
    LocalLauncherConfig,
    OnlineTrainingPipeline,
    ThroughputModel,
    build_definitions,
)

clock = trial_clock()
demand = OnlineTrainingPipeline(
    name="demand",
    source=KafkaSource(os.environ.get("DEMAND_KAFKA", "127.0.0.1:9092"), ("demand",), "demand-trainer"),
    limits=Limits(min_workers=1, max_workers=4, slo_minutes=20, restart_minutes=2),
    trainer="demand_forecaster.train:make_trainer",
    trainer_options={"lr": 0.01},
    # Until `kale trainer profile` (or the live group) has measured F(w): a guess, never a decision's sole basis.
    throughput_prior=ThroughputModel.linear(clock.rate(TRIAL_GPU_RATE)),
    launcher=LocalLauncherConfig(),  # the trainer service `kale trainer serve` runs; on Kubernetes:
    # launcher=KubernetesLauncherConfig(image="registry.example.com/demand-forecaster:0.1", checkpoint_pvc=...),
    forecaster="ewma" if clock.time_scale > 1 else "prophet",  # a trial's few hours are no season for Prophet
    metrics_interval_seconds=clock.time_scale * 5 if clock.time_scale > 1 else 60,
    clock=clock,
    report_days=1 if clock.time_scale > 1 else 7,
    # advisory: the default.  Declare advisory=False once the savings report has earned it.
)
defs = build_definitions(demand)
