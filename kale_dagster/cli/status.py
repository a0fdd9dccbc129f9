"""``kale status``: each pipeline's workers, lag against its SLO, forecast, last decision and health."""

from __future__ import annotations


def register(subparsers, summary: str) -> None:
    parser = subparsers.add_parser(
        "status",
        help=summary,
        description="Reads the Dagster instance ($DAGSTER_HOME) alone: the latest gpu_allocation decision of each "
        "pipeline, its metrics sensor's state and its failed runs of the last hour.",
        epilog="example: DAGSTER_HOME=~/dagster kale status --pipeline ctr",
    )
    parser.add_argument("--pipeline", help="only this pipeline")
    parser.add_argument(
        "--json", action="store_true", help="one JSON object: schema_version, and pipelines (one object each)"
    )
    parser.set_defaults(handler=run_status)


def open_instance():
    """The Dagster instance of ``DAGSTER_HOME``, or one line saying why there is none."""
    from dagster import DagsterInstance

    from kale_dagster.errors import CommandError

    try:
        return DagsterInstance.get()
    except Exception as exc:  # DAGSTER_HOME unset or not an instance
        raise CommandError(f"no Dagster instance: {str(exc).splitlines()[0]} (set DAGSTER_HOME)") from None


def run_status(args) -> int:
    from kale_dagster.cli import print_json
    from kale_dagster.definitions.status import format_status, read_status
    from kale_dagster.errors import CommandError

    instance = open_instance()
    try:
        statuses = read_status(instance, args.pipeline)
    finally:
        instance.dispose()
    if args.pipeline and not statuses:
        raise CommandError(f"pipeline {args.pipeline!r} has not decided in this instance")
    if args.json:
        print_json({"pipelines": [s.to_dict() for s in statuses]}, indent=1)
    else:
        print(format_status(statuses))
    return 0
