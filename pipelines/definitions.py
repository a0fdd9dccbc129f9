"""The code location: every example pipeline in one Dagster Definitions.

``demo`` runs entirely on embedded defaults (the broker `kale demo` or
`kale broker` starts on 127.0.0.1:9092); ``ctr_production`` shows a
production declaration in advisory mode (decisions recorded, nothing
rescaled) against a SASL-secured Kafka, its password read from an
environment variable at run time, with its workers declared for
Kubernetes (`kale k8s render --pipeline ctr_production --workers 8`).
"""

import os

from kale_dagster import KafkaSource, OnlineTrainingPipeline, ThroughputModel, build_definitions
from kale_dagster.launchers.kubernetes import KubernetesTrainerConfig

demo = OnlineTrainingPipeline(
    name="demo",
    source=KafkaSource(
        bootstrap_servers=os.environ.get("KALE_DEMO_BOOTSTRAP", "127.0.0.1:9092"),
        topics=("samples",),
        group_id="demo-trainer",
        request_timeout_ms=3000,
    ),
    min_workers=1,
    max_workers=4,
    slo_minutes=float(os.environ.get("KALE_DEMO_SLO_MINUTES", "20")),
    restart_minutes=float(os.environ.get("KALE_DEMO_RESTART_MINUTES", "10")),
    throughput_prior=ThroughputModel.linear(float(os.environ.get("KALE_DEMO_WORKER_RATE", "200"))),
    local_trainer_url=os.environ.get("KALE_DEMO_TRAINER_URL", "http://127.0.0.1:8765"),
)

ctr_production = OnlineTrainingPipeline(
    name="ctr_production",
    source=KafkaSource(
        bootstrap_servers="127.0.0.1:9093",
        topics=("clicks", "impressions"),
        group_id="ctr-trainer",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="kale",
        sasl_password_env="KALE_CTR_KAFKA_PASSWORD",
    ),
    min_workers=2,
    max_workers=32,
    throughput_prior=ThroughputModel.sync(16384, (0.00035, 2.5726, 0.9824, 0.02786)),
    global_batch=16384,
    advisory=True,
    kubernetes=KubernetesTrainerConfig(
        image="registry.example.com/ctr-trainer:1.4",
        namespace="ml",
        bootstrap_servers="kafka-0.kafka.ml.svc:9093",
        topic="clicks",
        group_id="ctr-trainer",
        checkpoint_pvc="ctr-checkpoints",
        kafka_secret="ctr-kafka-credentials",
        node_selector={"nvidia.com/gpu.product": "NVIDIA-A10"},
        tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
        service_account="kale-trainer",
    ),
)

defs = build_definitions(demo, ctr_production)
