"""The decision model: what policies observe and decide, and the arithmetic they plan with.

Pure logic (numpy and scipy; no Dagster, Kafka or torch), shared by the
Dagster control path and the simulator:

* ``types``: Observation, Decision, PartitionOffsets and the ScalingPolicy contract;
* ``throughput``: the resource-throughput model F(w), fitted by NNLS;
* ``backlog``: the FIFO fluid model of a topic's backlog, with exact sample ages;
* ``estimator``: workers per plan step from a forecast and the backlog;
* ``stabilizer``: the paper's Algorithm 1;
* ``projection``: lag over the horizon for "keep" versus "rescale now".
"""
