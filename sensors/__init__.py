"""Dagster sensors of kale-dagster, each built by a builder function."""

from .stream_metrics import StreamMetricsCursor, build_stream_metrics_sensor

__all__ = ["StreamMetricsCursor", "build_stream_metrics_sensor"]
