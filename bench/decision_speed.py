"""How long one Kale decision takes at 32 workers and a 6-hour horizon, and at the 12 hours it plans on a forecast
that proved accurate: the receding planner's program (``model.schedule.plan_from_now``) and the whole
``KalePolicy.decide``, on a diurnal forecast with a backlog.  Target: within 1 s.  Medians and 90th percentiles of
--repeats, each on a fresh policy (no cached plan).

    python bench/decision_speed.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from kale_dagster import Forecast, KalePolicy, Limits, Observation, Sizing, ThroughputModel
from kale_dagster.model.schedule import plan_from_now

MODEL = ThroughputModel.asynchronous((1e-3, 0.0, 2e-6))  # the backtests' default
LIMITS = Limits(max_workers=32, slo_minutes=20, restart_minutes=10)


def _case(seed: int, hours: int) -> tuple[np.ndarray, Observation]:
    """A forecast of ``hours``, and a recent error that has the planner plan over all of them."""
    rng = np.random.default_rng(seed)
    minutes = np.arange(hours * 60)
    peak = float(MODEL.predict(30))
    daily = 0.55 + 0.4 * np.sin(minutes / 360 * np.pi)  # half a day's rise and fall every 6 hours
    rates = np.clip(peak * daily + rng.normal(0, 0.03 * peak, len(minutes)), 0, None)
    forecast = Forecast(start=0.0, step_s=60.0, point=rates, lower=rates * 0.9, upper=rates * 1.1, model="bench")
    obs = Observation(
        time=0.0,
        workers=20,
        arrival_rate=float(rates[0]),
        consumption_rate=float(rates[0]),
        backlog=float(rates[0]) * 300,
        time_lag_s=300.0,
        utilization=1.0,
        forecast=forecast,
        forecast_error=0.05 if hours > 6 else None,
    )
    return rates, obs


def _quantiles(times: list[float]) -> str:
    return f"median {statistics.median(times) * 1000:.0f} ms, p90 {np.quantile(times, 0.9) * 1000:.0f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    for hours in (6, 12):
        program, decide = [], []
        for seed in range(args.repeats):
            rates, obs = _case(seed, hours)
            started = time.perf_counter()
            plan_from_now(rates, MODEL, LIMITS, LIMITS.restart_s, obs.workers, obs.backlog, obs.time_lag_s)
            program.append(time.perf_counter() - started)
            policy = KalePolicy(Sizing(LIMITS, MODEL))
            started = time.perf_counter()
            decision = policy.decide(obs)
            decide.append(time.perf_counter() - started)
            assert len(decision.plan) == hours * 6, decision.reason
        print(
            f"one decision at up to 32 workers, a {hours}-hour horizon ({hours * 6} steps of 10 min), "
            f"{args.repeats} repeats:"
        )
        print(f"  the planner's program: {_quantiles(program)}")
        print(f"  KalePolicy.decide:     {_quantiles(decide)}  (target: within 1 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
