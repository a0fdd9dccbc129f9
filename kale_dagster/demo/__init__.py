"""``kale demo``: the live demo (``run``) and its Dagster code location (``definitions``)."""

#: The demo's topic, the trainer's consumer group and the pipeline's name, shared by both modules.
TOPIC, GROUP, PIPELINE = "samples", "demo-trainer", "demo"
