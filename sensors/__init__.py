"""Dagster sensors of kale-dagster, one builder per sensor (keyword arguments in, a SensorDefinition out).

* ``stream_metrics``: records Kafka telemetry each tick; requests a run on emergency lag;
* ``allocation``: requests a rescale run when the decided worker count changes;
* ``run_failure``: records failed Kale runs on the pipeline's gpu_allocation asset.
"""

from sensors.allocation import AllocationCursor, build_allocation_sensor
from sensors.run_failure import build_run_failure_sensor
from sensors.stream_metrics import StreamMetricsCursor, build_stream_metrics_sensor

__all__ = ["AllocationCursor", "StreamMetricsCursor", "build_allocation_sensor", "build_run_failure_sensor", "build_stream_metrics_sensor"]
