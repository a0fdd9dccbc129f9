"""A trial on one machine: time compressed, each worker standing for one GPU.

``DEMAND_TIME_SCALE`` pipeline seconds pass per wall second (300: a day in under 5 minutes), the same in every
process of the trial (the Dagster daemon, ``kale report``, the producer), since the trial's start is kept in
``$DAGSTER_HOME/demand-trial.json``.  Unset (production), time is time.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from kale_dagster.control.clock import PipelineClock

#: EMULATED: in the trial each worker stands for one GPU that trains this many observations per wall second.
TRIAL_GPU_RATE = 100.0


def trial_clock() -> PipelineClock:
    """Real time, or the trial's compressed clock, started once for every process of the trial."""
    scale = float(os.environ.get("DEMAND_TIME_SCALE", "1"))
    if scale == 1:
        return PipelineClock()
    saved = Path(os.environ.get("DAGSTER_HOME", ".")) / "demand-trial.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    try:  # the first process of the trial starts it; the others find it
        with saved.open("x") as out:
            json.dump({"wall_start": time.time(), "time_scale": scale}, out)
    except FileExistsError:
        pass
    trial = json.loads(saved.read_text())
    if trial["time_scale"] != scale:
        raise ValueError(f"{saved} began a trial at DEMAND_TIME_SCALE={trial['time_scale']:g}: use it, or remove it")
    return PipelineClock(scale, trial["wall_start"])


def daily_rate(clock: PipelineClock, night: float, peak: float) -> float:
    """Observations per wall second now: ``night`` at 03:00 of the clock's day, rising to ``peak`` at 15:00."""
    hour = clock.now() % 86_400 / 3600
    return night + (peak - night) * 0.5 * (1 - math.cos(2 * math.pi * (hour - 3) / 24))
