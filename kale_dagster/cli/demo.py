"""``kale demo``: run the live demo on embedded defaults."""

from __future__ import annotations

import signal
import threading

from kale_dagster.demo.run import DemoSettings, run_demo


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="live demo: embedded broker, compressed diurnal day, torch trainer on emulated GPUs kept sized by Kale, Dagster UI",
        description="Starts the embedded broker, a producer replaying one synthetic day of CTR samples compressed into "
        "--day-minutes, torch trainer workers each EMULATING one GPU, the Kale control loop and `dagster dev` "
        "on 127.0.0.1:3000. Ctrl-C stops every process.",
    )
    parser.add_argument("--day-minutes", type=float, default=15.0, help="wall minutes for one day (default 15)")
    parser.add_argument("--max-minutes", type=float, default=None, help="stop after this many wall minutes")
    parser.add_argument("--no-dagster", action="store_true", help="do not start dagster dev")
    parser.add_argument("--port", type=int, default=9092, help="broker port on 127.0.0.1 (default 9092)")
    parser.add_argument("--ui-port", type=int, default=3000, help="Dagster UI port on 127.0.0.1 (default 3000)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from kale_dagster.errors import CommandError

    if args.day_minutes <= 0:
        raise CommandError("--day-minutes must be > 0")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    settings = DemoSettings(day_minutes=args.day_minutes, dagster=not args.no_dagster, port=args.port, ui_port=args.ui_port)
    run_demo(settings, stop=stop, max_wall_s=args.max_minutes * 60 if args.max_minutes else None)
    return 0
