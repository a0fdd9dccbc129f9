"""Produce demand observations as JSON records, at a steady rate: the example's own producer."""

from __future__ import annotations

import argparse
import json
import random
import time

from demand_forecaster.world import observation


def produce(servers: str, topic: str, rate: float, seconds: float, start_seq: int = 0, seed: int = 0) -> int:
    """Send ``rate`` observations per second for ``seconds``; returns the next sequence number."""
    from kafka import KafkaProducer

    rng = random.Random(seed + start_seq)
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=5)
    seq, started = start_seq, time.monotonic()
    try:
        while (elapsed := time.monotonic() - started) < seconds:
            due = start_seq + int(elapsed * rate)
            while seq < due:
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
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    sent = produce(args.bootstrap_servers, args.topic, args.rate, args.seconds)
    print(f"sent {sent} observations to {args.topic}")


if __name__ == "__main__":
    main()
