"""``kale broker``: run the embedded Kafka-protocol broker in the foreground."""

from __future__ import annotations

import signal
import threading

from kale_dagster.errors import CommandError
from kale_dagster.stream.broker import BrokerError, start_broker


def register(subparsers, summary: str) -> None:
    parser = subparsers.add_parser(
        "broker",
        help=summary,
        description="Run the embedded Kafka-protocol broker on 127.0.0.1 until Ctrl-C. "
        "Memory only: stopping it loses every topic and offset.",
        epilog="example: kale broker --port 9092",
    )
    parser.add_argument("--port", type=int, ge=1, le=65535, default=9092, help="loopback port to listen on")
    parser.set_defaults(handler=run)


def run(args) -> int:
    try:
        broker = start_broker(port=args.port)
    except BrokerError as exc:
        raise CommandError(str(exc)) from exc
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"broker ready: bootstrap servers {broker.bootstrap_servers} (Ctrl-C stops it)", flush=True)
    try:
        while not stop.wait(0.5):
            if not broker.is_running():
                raise CommandError(f"the broker exited with code {broker.process.returncode}:\n{broker.log_tail()}")
    finally:
        broker.stop()
    print("broker stopped", flush=True)
    return 0
