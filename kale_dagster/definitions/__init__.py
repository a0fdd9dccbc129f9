"""The Dagster wiring: everything in kale_dagster that imports Dagster.

* ``pipeline``: ``OnlineTrainingPipeline``, the declaration of one kept-sized trainer;
* ``build``: pipelines to ``dagster.Definitions``;
* ``assets``, ``checks``, ``jobs``: what each pipeline gets;
* ``resources``: ``KafkaStreamResource``, the telemetry connection;
* ``plots``: PNG plots for asset metadata and the CLI.

The sensors are built by the top-level ``sensors`` package.
"""
