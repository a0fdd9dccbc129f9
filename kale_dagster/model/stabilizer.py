"""Remove short-lived levels from a worker plan: the paper's Algorithm 1, and our variant.

A rescale costs minutes of downtime, so a level that lasts less than ``tau``
is not worth switching to.  The paper (``mode="paper"``): wherever the plan
changes by at least ``rho`` workers, the new level's duration is measured,
and a level shorter than ``tau`` is set to the higher of its two
neighbouring levels.

Our variant (``mode="kale"``, the default) differs in three ways, each for
safety:

* a short level is raised to the highest of itself and its neighbours, so a
  short dip is filled but a short peak is kept (the paper lowers a short
  peak to its higher neighbour, leaving the peak's traffic uncovered);
* changes smaller than ``rho`` are absorbed upwards: a small dip holds the
  previous level, a small rise is kept (the paper leaves them in the plan);
* the rescan repeats until no short level is left (the paper makes one pass).

In both, the first stretch is the current level, not a new one, and the
last stretch runs past the horizon with one neighbour, so neither is judged
by its visible length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from kale_dagster.errors import KaleConfigError

Mode = Literal["kale", "paper"]
MODES: tuple[str, ...] = get_args(Mode)


def _runs(plan: list[int]) -> list[tuple[int, int]]:
    """(start, end) index pairs, end exclusive, of runs of equal values."""
    runs, start = [], 0
    for i in range(1, len(plan) + 1):
        if i == len(plan) or plan[i] != plan[start]:
            runs.append((start, i))
            start = i
    return runs


def stabilize(
    plan: Sequence[int], step_minutes: float, rho: int = 1, tau_minutes: float = 10, mode: Mode = "kale"
) -> list[int]:
    """Return the stabilized plan; the input is not modified.

    >>> stabilize([4, 4, 5, 6, 6, 6], step_minutes=10, tau_minutes=15)
    [4, 4, 6, 6, 6, 6]
    >>> stabilize([4, 4, 8, 4, 4, 4], step_minutes=10, tau_minutes=15, mode="paper")
    [4, 4, 4, 4, 4, 4]
    """
    if step_minutes <= 0:
        raise KaleConfigError("step_minutes", f"must be > 0, got {step_minutes}")
    if rho < 1:
        raise KaleConfigError("rho", f"must be >= 1 worker, got {rho}")
    if tau_minutes < 0:
        raise KaleConfigError("tau_minutes", f"must be >= 0, got {tau_minutes}")
    if mode not in MODES:
        raise KaleConfigError("stabilizer", f"must be 'kale' or 'paper', got {mode!r}")
    out = [int(x) for x in plan]
    if mode == "paper":
        return _paper(out, step_minutes, rho, tau_minutes)
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


def _paper(out: list[int], step_minutes: float, rho: int, tau_minutes: float) -> list[int]:
    """Algorithm 1 as the paper states it: one pass; a new level after a change of >= rho lasts until the
    next such change; if shorter than tau (and followed by another level) it takes the higher neighbour."""
    i = 1
    while i < len(out):
        if abs(out[i] - out[i - 1]) < rho:
            i += 1
            continue
        end = i + 1
        while end < len(out) and abs(out[end] - out[i]) < rho:
            end += 1
        if end < len(out) and (end - i) * step_minutes < tau_minutes:
            out[i:end] = [max(out[i - 1], out[end])] * (end - i)
        i = end
    return out
