"""Produce demand observations as JSON records: the example's own producer, at a steady rate or, with
``--daily``, following the day of the trial's clock (``trial``)."""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

from demand_forecaster.trial import daily_rate, trial_clock
from demand_forecaster.world import observation


def produce(
    servers: str,
    topic: str,
    rate: float | Callable[[], float],
    seconds: float,
    start_seq: int = 0,
    seed: int = 0,
) -> int:
    """Send ``rate`` observations per second (or ``rate()``, the rate now) for ``seconds``; returns the next
    sequence number."""
    from kafka import KafkaProducer

    rate_now = rate if callable(rate) else lambda: rate

    rng = random.Random(seed + start_seq)
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=5)
    seq, started = start_seq, time.monotonic()
    due, last = float(start_seq), started
    try:
        while (now := time.monotonic()) - started < seconds:
            due, last = due + (now - last) * rate_now(), now
            while seq < int(due):
                producer.send(topic, json.dumps(observation(seq, rng)).encode(), key=str(seq % 16).encode())
                seq += 1
            time.sleep(0.01)
        producer.flush()
    finally:
        producer.close()
    return seq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="demand")
    parser.add_argument("--rate", type=float, default=200.0, help="observations per second")
    parser.add_argument(
        "--daily",
        nargs=2,
        type=float,
        metavar=("NIGHT", "PEAK"),
        help="follow the trial's day instead: NIGHT observations per second at 03:00, PEAK at 15:00",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="how long (wall seconds; 0: until Ctrl-C)")
    args = parser.parse_args()
    rate = args.rate
    if args.daily:
        clock = trial_clock()
        rate = lambda: daily_rate(clock, *args.daily)  # noqa: E731
    try:
        sent = produce(args.bootstrap_servers, args.topic, rate, args.seconds or float("inf"))
    except KeyboardInterrupt:
        return
    print(f"sent {sent} observations to {args.topic}")


if __name__ == "__main__":
    main()
