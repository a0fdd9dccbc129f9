"""The example code location (``workspace.yaml`` loads it): a production declaration.

``ctr_production`` runs in advisory mode (decisions recorded, nothing
rescaled) against a SASL-secured Kafka, its password read from an
environment variable at run time, with its workers declared for
Kubernetes on 8-GPU nodes, a pod per node (``kale k8s render --pipeline
ctr_production --workers 16``: two pods of eight).
The stream is declared once: telemetry, the manifests and the workers all
read ``source``.  The live demo's pipeline ships inside the package
(``kale_dagster.demo.definitions``).
"""

from kale_dagster import (
    KafkaSource,
    KubernetesLauncherConfig,
    Limits,
    OnlineTrainingPipeline,
    ThroughputModel,
    build_definitions,
)

ctr_production = OnlineTrainingPipeline(
    name="ctr_production",
    source=KafkaSource(
        bootstrap_servers="kafka-0.kafka.ml.svc:9093",
        topics=("clicks",),
        group_id="ctr-trainer",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="kale",
        sasl_password_env="KALE_CTR_KAFKA_PASSWORD",
    ),
    limits=Limits(min_workers=8, max_workers=32, workers_per_pod=8),
    throughput_prior=ThroughputModel.sync(16384, (0.00035, 2.5726, 0.9824, 0.02786)),
    global_batch=16384,
    advisory=True,
    autostart=False,  # an example: its sensors and schedule wait for an operator, not for a cluster that is not there
    launcher=KubernetesLauncherConfig(
        image="registry.example.com/ctr-trainer:1.4",
        namespace="ml",
        checkpoint_pvc="ctr-checkpoints",
        kafka_secret="ctr-kafka-credentials",
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        cpu="64",
        memory="512Gi",
        tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
        service_account="kale-trainer",
        rescale_service_account="kale-rescaler",  # only the ctr_production_rescale runs (docs/kubernetes/rbac.yaml)
    ),
)

defs = build_definitions(ctr_production)
