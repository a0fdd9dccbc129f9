"""The control loop's logic, free of Dagster: observations in, decisions and rescales out.

* ``clock``: pipeline time, the one time scale of a compressed run;
* ``controller``: observe -> decide -> act for one pipeline, shared by the
  metrics sensor and the ``gpu_allocation`` asset (``definitions.control``
  gathers its inputs in Dagster).
"""
