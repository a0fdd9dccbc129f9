"""Dagster sensors of kale-dagster, one builder per sensor (keyword arguments in, a SensorDefinition out).

* ``stream_metrics``: records Kafka telemetry at every tick and, given a pipeline's control,
  decides its allocation and requests rescale and refit runs;
* ``run_failure``: records failed Kale runs on the pipeline's gpu_allocation asset.
"""

from kale_dagster.sensors.run_failure import build_run_failure_sensor
from kale_dagster.sensors.stream_metrics import StreamMetricsCursor, build_stream_metrics_sensor

__all__ = ["StreamMetricsCursor", "build_run_failure_sensor", "build_stream_metrics_sensor"]
