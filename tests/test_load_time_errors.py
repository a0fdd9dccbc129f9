"""Mistakes a declaration can hold are caught when the code loads, each as one line naming the field: a table,
one row per mistake, the declaration that holds it and what the error says."""

from __future__ import annotations

import pytest

from kale_dagster import KafkaSource, KaleConfigError, OnlineTrainingPipeline
from kale_dagster.launchers import CommandHookLauncherConfig, ScaleTargetLauncherConfig

SOURCE = KafkaSource("127.0.0.1:9092", ("clicks",), "ctr")
TWO_TOPICS = KafkaSource("127.0.0.1:9092", ("clicks", "views"), "ctr")

ROWS = [
    (
        "a shell pipe in rescale_command",
        lambda: CommandHookLauncherConfig(rescale_command="scale.sh {workers} | tee -a log", status_command="count.sh"),
        "rescale_command: '|' is a shell operator, but no shell runs the command (it would be an argument): put "
        "the pipeline in a script and name the script",
    ),
    (
        "a command substitution in status_command",
        lambda: CommandHookLauncherConfig(rescale_command="scale.sh {workers}", status_command="echo $(kubectl get x)"),
        "status_command: '$(' is a shell operator",
    ),
    (
        "a redirection",
        lambda: CommandHookLauncherConfig(rescale_command="scale.sh {workers} > out.log", status_command="count.sh"),
        "rescale_command: '>' is a shell operator",
    ),
    (
        "a misspelled workload kind",
        lambda: ScaleTargetLauncherConfig(workload_kind="Deploymnet", name="ranker"),
        "workload_kind: 'Deploymnet' is no kind of apps/v1: Deployment, StatefulSet, ReplicaSet (a custom resource "
        "needs its api_version and plural too)",
    ),
    (
        "a topic named twice",
        lambda: OnlineTrainingPipeline(name="ctr", source=KafkaSource("127.0.0.1:9092", ("clicks", "clicks"), "g")),
        "topics: clicks named more than once",
    ),
]


@pytest.mark.parametrize("case, declare, says", ROWS, ids=[r[0] for r in ROWS])
def test_a_mistake_is_one_line_naming_the_field(case, declare, says):
    with pytest.raises(KaleConfigError) as err:
        declare()
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "declare",
    [
        lambda: CommandHookLauncherConfig(
            rescale_command="scale.sh --to={workers} --note 'a | b'", status_command="count.sh"
        ),
        # A shell asked for by name gets its script whole: nothing in it is Kale's to refuse.
        lambda: CommandHookLauncherConfig(
            rescale_command="sh -c 'scale.sh {workers} | tee log'", status_command="sh -c 'echo $(n)'"
        ),
        lambda: ScaleTargetLauncherConfig(workload_kind="StatefulSet", name="ranker"),
        lambda: ScaleTargetLauncherConfig(
            workload_kind="PyTorchJob", name="ranker", api_version="kubeflow.org/v1", plural="pytorchjobs"
        ),
        lambda: OnlineTrainingPipeline(
            name="ctr", source=TWO_TOPICS, launcher=ScaleTargetLauncherConfig(workload_kind="Deployment", name="ranker")
        ),
        lambda: OnlineTrainingPipeline(name="ctr", source=TWO_TOPICS),  # Kale's trainer balances both topics
    ],
)
def test_what_is_right_passes(declare):
    declare()
