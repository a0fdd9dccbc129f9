"""A workload sized through the team's own commands: real processes (a small scaler script), its exit codes,
a command that hangs, and the rescale job keeping the command's output on the run.  Table tests say success or
failure per row."""

from __future__ import annotations

import sys
import time

import pytest

from kale_dagster import KaleConfigError
from kale_dagster.launchers import CommandHookLauncherConfig

SCALER = """
import pathlib, sys, time
state = pathlib.Path(sys.argv[1])
if sys.argv[2] == "--count":
    print("asking the scheduler")
    print(state.read_text() if state.exists() else "2")
elif sys.argv[2] == "--replicas":
    n = int(sys.argv[3])
    if n == 13:
        print("quota exceeded for 13 replicas", file=sys.stderr)
        sys.exit(3)
    if n == 9:
        time.sleep(60)
    state.write_text(str(n))
    print(f"scaled to {n}")
elif sys.argv[2] == "--bad-count":
    print("two")
"""


@pytest.fixture
def hook(tmp_path):
    script = tmp_path / "scaler.py"
    script.write_text(SCALER)
    state = tmp_path / "replicas"
    base = f"{sys.executable} {script} {state}"
    return CommandHookLauncherConfig(
        rescale_command=f"{base} --replicas {{workers}}", status_command=f"{base} --count", timeout_s=2.0
    ).build("ctr", None, None)  # type: ignore[arg-type]  # the hook needs neither the source nor the trainer


def test_a_rescale_runs_the_command_and_reads_the_size_back(hook):
    assert hook.status().workers == 2
    record = hook.rescale(5, reason="forecast")
    assert record is not None and (record.from_workers, record.to_workers) == (2, 5)
    assert record.output == "scaled to 5" and record.downtime_s > 0
    assert hook.status().workers == 5 and hook.rescale(5) is None  # already there: nothing runs


def test_a_failing_command_fails_the_rescale_with_its_output(hook):
    with pytest.raises(RuntimeError, match=r"--replicas 13` exited 3: quota exceeded for 13 replicas"):
        hook.rescale(13)
    assert hook.status().workers == 2


def test_a_command_that_hangs_is_killed_at_its_timeout(hook):
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"ran past 2 s and was killed"):
        hook.rescale(9)
    assert time.monotonic() - started < 15


def test_a_status_command_that_prints_no_count_is_one_line(hook, tmp_path):
    bad = CommandHookLauncherConfig(
        rescale_command=hook.config.rescale_command,
        status_command=hook.config.status_command.replace("--count", "--bad-count"),
    ).build("ctr", None, None)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=r"must print the number of workers as its last line, printed 'two'"):
        bad.status()


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"rescale_command": "scale --to {workers}", "status_command": "scale --count"}, None),
        ({"rescale_command": "scale --to 3", "status_command": "scale --count"}, "rescale_command: must contain"),
        ({"rescale_command": "scale 'unclosed {workers}", "status_command": "s"}, "rescale_command: cannot be split"),
        ({"rescale_command": "scale {workers}", "status_command": "  "}, "status_command: is empty"),
        ({"rescale_command": "s {workers}", "status_command": "s", "timeout_s": 0}, "timeout_s: must be > 0"),
        ({"rescale_command": None, "status_command": "s"}, "rescale_command: is required"),
    ],
)
def test_declarations(kwargs, says):
    if says is None:
        assert CommandHookLauncherConfig(**kwargs).rescale_timeout_s == 660.0
        return
    with pytest.raises(KaleConfigError, match=says):
        CommandHookLauncherConfig(**kwargs)


def test_the_target_is_one_argument_never_a_shell(tmp_path):
    """{workers} is replaced after the split: the target cannot add arguments or commands."""
    record_args = tmp_path / "args"
    script = tmp_path / "record.py"
    script.write_text(
        "import sys, pathlib\n"
        f"p = pathlib.Path({str(record_args)!r})\n"
        "if sys.argv[1] == 'count':\n    print(p.read_text().count(chr(10)) if p.exists() else 1)\n"
        "else:\n    p.write_text(chr(10).join(sys.argv[1:]) + chr(10))\n"
    )
    hook = CommandHookLauncherConfig(
        rescale_command=f"{sys.executable} {script} set --n={{workers}};echo",
        status_command=f"{sys.executable} {script} count",
    ).build("ctr", None, None)  # type: ignore[arg-type]
    hook.rescale(4)
    assert record_args.read_text().splitlines() == ["set", "--n=4;echo"]


@pytest.mark.integration
def test_the_rescale_job_keeps_the_commands_output_on_the_run(hook):
    from dagster import AssetKey, AssetMaterialization, instance_for_test

    from kale_dagster import KafkaSource, OnlineTrainingPipeline, build_definitions

    p = OnlineTrainingPipeline(
        name="theirs", source=KafkaSource("127.0.0.1:9092", ("samples",), "g"), launcher=hook.config, advisory=False
    )
    defs = build_definitions(p)
    key = AssetKey(["theirs", "gpu_allocation"])
    with instance_for_test() as instance:
        instance.report_runless_asset_event(AssetMaterialization(key, metadata={"workers": 4, "reason": "r"}))
        assert defs.resolve_job_def("theirs_rescale").execute_in_process(instance=instance).success
        obs = instance.fetch_observations(key, limit=1).records[0].asset_observation
        assert obs.metadata["output"].value == "scaled to 4" and obs.metadata["from_workers"].value == 2
        instance.report_runless_asset_event(AssetMaterialization(key, metadata={"workers": 13, "reason": "r"}))
        result = defs.resolve_job_def("theirs_rescale").execute_in_process(instance=instance, raise_on_error=False)
        assert not result.success
