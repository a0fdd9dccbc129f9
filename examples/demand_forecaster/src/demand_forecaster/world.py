"""The hidden world the producer samples: demand per store and hour, with temperature and noise.

A model that learns it shows a falling mean absolute error, so the metric means something.
"""

from __future__ import annotations

import math
import random

STORES = 200


def store_level(store: int) -> float:
    return 20.0 + 15.0 * math.sin(store * 1.7) ** 2


def demand(store: int, hour: float, temp_c: float, rng: random.Random) -> float:
    daily = 1.0 + 0.6 * math.sin(2 * math.pi * (hour - 9) / 24)
    heat = 0.02 * max(temp_c - 18.0, 0.0) * store_level(store)
    return max(store_level(store) * daily + heat + rng.gauss(0.0, 2.0), 0.0)


def observation(seq: int, rng: random.Random) -> dict:
    store = rng.randrange(STORES)
    hour = rng.uniform(0, 24)
    temp_c = rng.uniform(-5, 35)
    return {
        "seq": seq,
        "store": store,
        "hour": round(hour, 3),
        "temp_c": round(temp_c, 2),
        "demand": round(demand(store, hour, temp_c, rng), 3),
    }
