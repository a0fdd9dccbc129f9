"""The paper's Algorithm 1: remove short-lived levels from a worker plan.

A rescale costs minutes of downtime, so a level that lasts less than ``tau``
is not worth switching to.  Wherever the plan changes by at least ``rho``
workers, the new level's duration is measured; a level shorter than ``tau``
is raised to the higher of its neighbours.  Raising (never lowering) is what
keeps the stabilizer safe: a short dip is filled, a short peak is kept.

Two readings the paper leaves open, chosen for safety:

* changes smaller than ``rho`` are absorbed upwards: a small dip holds the
  previous level, a small rise is kept (capacity is never reduced);
* the first stretch is the current level, not a new one, and the last
  stretch runs past the horizon, so neither is judged by its visible length.
"""

from __future__ import annotations

from typing import Sequence

from kale_dagster.errors import KaleConfigError


def _runs(plan: list[int]) -> list[tuple[int, int]]:
    """(start, end) index pairs, end exclusive, of runs of equal values."""
    runs, start = [], 0
    for i in range(1, len(plan) + 1):
        if i == len(plan) or plan[i] != plan[start]:
            runs.append((start, i))
            start = i
    return runs


def stabilize(plan: Sequence[int], step_minutes: float, rho: int = 1, tau_minutes: float = 10) -> list[int]:
    """Return the stabilized plan; the input is not modified.

    >>> stabilize([4, 4, 5, 6, 6, 6], step_minutes=10, tau_minutes=15)
    [4, 4, 6, 6, 6, 6]
    """
    if step_minutes <= 0:
        raise KaleConfigError("step_minutes", f"must be > 0, got {step_minutes}")
    if rho < 1:
        raise KaleConfigError("rho", f"must be >= 1 worker, got {rho}")
    if tau_minutes < 0:
        raise KaleConfigError("tau_minutes", f"must be >= 0, got {tau_minutes}")
    out = [int(x) for x in plan]
    for i in range(1, len(out)):
        if 0 < out[i - 1] - out[i] < rho:
            out[i] = out[i - 1]
    changed = True
    while changed:
        changed = False
        runs = _runs(out)
        for k in range(1, len(runs) - 1):
            start, end = runs[k]
            if (end - start) * step_minutes >= tau_minutes:
                continue
            level = max(out[runs[k - 1][0]], out[runs[k + 1][0]], out[start])
            if level != out[start]:
                out[start:end] = [level] * (end - start)
                changed = True
                break  # runs changed shape; rescan from the left
    return out
