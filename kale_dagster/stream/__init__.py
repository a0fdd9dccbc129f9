"""The stream side: what the trainer consumes and what Kale reads of it.

* ``source``: ``KafkaSource``, the one declaration of a pipeline's stream;
* ``telemetry``: lag, rates and time lag from the broker (pure arithmetic in ``build_snapshot``);
* ``history``: the metrics history (SQLite or Postgres) the forecaster and the throughput model read;
* ``samples`` and ``producer``: the CTR sample format and a trace replayer;
* ``broker``: the embedded Kafka-protocol broker for demos and tests.

Modules import their heavy dependencies themselves; importing this package imports nothing.
"""
