"""Simulation: the production policies replayed on a trace.

* ``simulate``: the trace-driven simulator (FIFO lag, pause-and-restart, telemetry as the policies see it);
* ``backtest``: every registered policy and the baselines' sweeps on one trace;
* ``metrics``: the paper's metrics, shared with live runs;
* ``trace``: seeded synthetic traces shaped like the paper's traffic.
"""
