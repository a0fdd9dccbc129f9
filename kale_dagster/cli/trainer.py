"""``kale trainer serve``: run local trainer workers and serve the rescale API for Dagster."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading

from kale_dagster.cli.code_location import add_pipeline_arguments, find_pipeline
from kale_dagster.cli.declared import add_flags, from_flags
from kale_dagster.errors import CommandError, require_extra
from kale_dagster.launchers import LocalLauncher, TrainerSettings
from kale_dagster.launchers.service import LauncherService
from kale_dagster.model.limits import MAX_WORKERS, Limits
from kale_dagster.rules import flag, renamed
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.api import DEFAULT_TRAINER, TrainerSpec, trainer_path_problem
from kale_dagster.trainer.settings import topic_list


def register(subparsers, summary: str) -> None:
    parser = subparsers.add_parser("trainer", help=summary)
    sub = parser.add_subparsers(dest="trainer_command", metavar="ACTION", required=True)
    serve = sub.add_parser(
        "serve",
        help="start N local workers and serve the rescale API that <pipeline>_rescale runs call",
        description="Owns the local workers (warm standbys, crash supervision) and serves GET /status and "
        "POST /rescale on 127.0.0.1:--port until Ctrl-C, which checkpoints and stops every worker. Every request needs "
        "the "
        "bearer token written at start-up to --token-file (mode 0600; by default in your runtime directory, where a "
        "pipeline's LocalLauncherConfig looks for it).",
        epilog="example: kale trainer serve --topics samples --group-id ctr --checkpoint-dir ./ckpt --workers 2",
    )
    serve.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    serve.add_argument(
        "--topics",
        "--topic",
        dest="topics",
        type=topic_list,
        required=True,
        help="the topics the workers train from, comma-separated (their partitions balanced as one set)",
    )
    serve.add_argument("--group-id", required=True, help="the consumer group whose committed offsets they resume from")
    serve.add_argument("--workers", type=int, ge=1, le=MAX_WORKERS, default=1)
    serve.add_argument(
        "--max-workers",
        type=int,
        ge=1,
        le=MAX_WORKERS,
        default=Limits().max_workers,
        help="the most workers a rescale may ask for (a pipeline's limits.max_workers); larger requests get a 400",
    )
    serve.add_argument(
        "--trainer",
        default=DEFAULT_TRAINER,
        help="your trainer factory, module:attribute (default: the built-in CTR demo trainer); see the README's "
        "'Bring your own trainer'",
    )
    serve.add_argument(
        "--trainer-options", type=_json_object, default={}, help="JSON object passed to the factory as its options"
    )
    # Every worker setting, with its rule: the flags the workers themselves take (``TrainerSettings``).
    add_flags(serve, TrainerSettings)
    serve.add_argument("--port", type=int, ge=0, le=65535, default=8765)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind; loopback only (127.0.0.1 or localhost)")
    serve.add_argument(
        "--token-file",
        help="where to write the access token (default: $XDG_RUNTIME_DIR/kale/trainer-PORT.token, "
        "else a directory of yours under the temp directory)",
    )
    serve.set_defaults(handler=run_serve)
    register_profile(sub)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(value).__name__}")
    return value


def run_serve(args) -> int:
    require_extra("torch", "trainer", "kale trainer serve")
    if args.workers > args.max_workers:
        raise CommandError(f"--workers {args.workers} is more than --max-workers {args.max_workers}")
    trainer = renamed(flag, TrainerSpec, trainer=args.trainer, trainer_options=args.trainer_options)
    problem = trainer_path_problem(trainer.trainer)
    if problem is not None:  # before any port is taken or worker spawned
        raise CommandError(f"--trainer: {problem.problem}")
    source = KafkaSource(args.bootstrap_servers, args.topics, args.group_id)
    settings = from_flags(TrainerSettings, args, source=source, trainer=trainer)
    # The port and the token file before any worker: a busy port or a wrong --token-file is one line, with nothing
    # spawned to clean up.
    service = LauncherService(port=args.port, host=args.host, token_file=args.token_file)
    try:
        launcher = LocalLauncher(settings, max_workers=args.max_workers)
    except BaseException:
        service.close()
        raise
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    service.start(launcher)
    try:
        try:
            record = launcher.start(args.workers)
        except (RuntimeError, TimeoutError) as exc:  # the worker's own reason, in one line, instead of a traceback
            raise CommandError(f"could not start {args.workers} workers: {exc}") from None
        print(
            f"{args.workers} workers training (first step after {record.downtime_s:.1f} s); rescale API at "
            f"{service.url}, "
            f"token in {service.token_file}",
            flush=True,
        )
        while not stop.wait(2.0):
            launcher.supervise_once()
    finally:
        service.close()
        launcher.stop()
    return 0


def register_profile(sub) -> None:
    profile = sub.add_parser(
        "profile",
        help="measure the pipeline's trainer at a few worker counts, for its throughput model F(w)",
        description="Runs the pipeline's trainer as local workers at each --workers count in turn, on the records "
        "its topics retain, in a consumer group of its own (<group_id>.kale-profile.<time>: yours is untouched), and "
        "writes each count's capacity to the pipeline's metrics history, where the throughput model and the savings "
        "report fit F(w) on them beside the live measurements. Run it where the workers' GPUs are.",
        epilog="example: kale trainer profile --pipeline ctr --workers 1,2,4 --seconds 60 -m pipelines.definitions",
    )
    add_pipeline_arguments(profile)
    profile.add_argument(
        "--workers", type=_counts, required=True, help="the worker counts to measure, comma-separated (at least 1)"
    )
    profile.add_argument("--seconds", type=float, gt=0, le=3600, default=60.0, help="how long each count is measured")
    add_flags(profile, TrainerSettings, exclude=("checkpoint_dir", "pipeline"))
    profile.set_defaults(handler=run_profile)


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(c) for c in text.split(",") if c.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated worker counts: {text!r}") from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"worker counts are 1 or more, got {text!r}")
    return counts


def run_profile(args) -> int:
    require_extra("torch", "trainer", "kale trainer profile")
    from kale_dagster.launchers.profile import ProfileError, delete_profile_group, profile_settings, profile_throughput

    p = find_pipeline(args, args.pipeline)
    if args.workers[-1] > p.limits.max_workers:
        raise CommandError(f"--workers {args.workers[-1]} is more than {p.name}'s max_workers ({p.limits.max_workers})")
    history = p.history()
    try:
        with tempfile.TemporaryDirectory(prefix="kale-profile-") as checkpoints:
            declared = from_flags(
                TrainerSettings,
                args,
                source=p.source,
                checkpoint_dir=checkpoints,
                trainer=p.trainer_spec,
                pipeline=p.name,
            )

            def record(c) -> None:
                history.append_throughput(p.name, p.clock.now(), c.workers, p.clock.rate(c.samples_per_s), c.emulated)
                print(f"{c.workers} worker(s): {c.samples_per_s:,.1f} samples/s (median of {c.readings})", flush=True)

            settings = profile_settings(declared, checkpoints)
            try:
                profile_throughput(settings, args.workers, args.seconds, on_count=record)
            finally:
                left = delete_profile_group(settings)
                if left:
                    print(left, file=sys.stderr)
    except ProfileError as exc:
        raise CommandError(str(exc)) from None
    finally:
        history.dispose()
    print(f"recorded in {p.name}'s metrics history: its throughput model and savings report fit F(w) on them")
    return 0
