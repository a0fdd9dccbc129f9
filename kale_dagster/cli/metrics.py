"""``kale metrics serve``: each pipeline's state in Prometheus format, read from the Dagster instance."""

from __future__ import annotations

import signal
import threading


def register(subparsers, summary: str) -> None:
    parser = subparsers.add_parser("metrics", help=summary)
    sub = parser.add_subparsers(dest="metrics_command", metavar="ACTION", required=True)
    serve = sub.add_parser(
        "serve",
        help="serve /metrics for Prometheus to scrape",
        description="Every scrape reads the Dagster instance ($DAGSTER_HOME): run it beside the Dagster daemon, "
        "on the same instance (in Kubernetes, a container in the daemon's pod, scraped through its port).",
        epilog="example: DAGSTER_HOME=~/dagster kale metrics serve --port 9464",
    )
    serve.add_argument("--port", type=int, ge=0, le=65535, default=9464)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for a scraper on another host)")
    serve.set_defaults(handler=run_serve)


def run_serve(args) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    from kale_dagster.cli.status import open_instance
    from kale_dagster.definitions.prometheus import PipelineCollector
    from kale_dagster.errors import CommandError

    open_instance().dispose()  # one line now, rather than at every scrape, when there is no instance
    registry = CollectorRegistry()
    registry.register(PipelineCollector(open_instance))
    try:
        server, _ = start_http_server(args.port, addr=args.host, registry=registry)
    except OSError as exc:
        raise CommandError(f"cannot listen on {args.host}:{args.port} ({exc.strerror})") from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"Prometheus metrics at http://{args.host}:{server.server_port}/metrics", flush=True)
    stop.wait()
    server.shutdown()
    return 0
