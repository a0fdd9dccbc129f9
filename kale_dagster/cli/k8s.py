"""``kale k8s render``: print the Kubernetes manifests a pipeline's workers would run as."""

from __future__ import annotations

from kale_dagster.cli.code_location import add_pipeline_arguments, find_pipeline
from kale_dagster.errors import CommandError


def register(subparsers, summary: str) -> None:
    parser = subparsers.add_parser("k8s", help=summary)
    sub = parser.add_subparsers(dest="k8s_command", metavar="ACTION", required=True)
    render = sub.add_parser(
        "render",
        help="print the Service and Job manifests for a pipeline at N workers",
        epilog="example: kale k8s render --pipeline ctr_production --workers 8 --validate 1.37.0",
    )
    render.add_argument("--workers", type=int, ge=1, le=1024, required=True, help="the group size to render")
    add_pipeline_arguments(render)
    render.add_argument(
        "--validate",
        metavar="K8S_VERSION",
        help="also validate offline against this Kubernetes version's schema, e.g. 1.37.0",
    )
    render.set_defaults(handler=run_render)


def run_render(args) -> int:
    import yaml

    from kale_dagster.launchers.kubernetes import KubernetesLauncherConfig
    from kale_dagster.launchers.kubernetes_render import render

    pipeline = find_pipeline(args, args.pipeline)
    if not isinstance(pipeline.launcher, KubernetesLauncherConfig):
        raise CommandError(f"pipeline {args.pipeline!r} is not declared with launcher=KubernetesLauncherConfig(...)")
    manifests = render(
        pipeline.name,
        pipeline.launcher,
        pipeline.source,
        args.workers,
        trainer=pipeline.trainer_spec,
        workers_per_pod=pipeline.limits.workers_per_pod,
    )
    if args.validate:
        import kubernetes_validate

        for manifest in manifests:
            kubernetes_validate.validate(manifest, args.validate, strict=True)
    print(yaml.safe_dump_all(manifests, sort_keys=False), end="")
    return 0
