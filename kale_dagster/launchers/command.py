"""A workload Kale sizes through the team's own commands: one that sets its size, one that reports it.

For everything that has no scale API Kale speaks (a process manager, a scheduler's CLI, an in-house
deployer), as HPA's ``scaleTargetRef`` is for Kubernetes workloads.  ``{workers}`` in the rescale command
is replaced by the target after the command is split into arguments, and nothing runs through a shell, so
a value cannot become another command.  The status command prints the number of workers that run, as its
last line.  A command that exits non-zero, or runs past ``timeout_s`` (it is then killed, with its
children), fails the rescale with its own last lines; the output of a rescale that worked is kept on the
rescale run.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass

from kale_dagster.errors import KaleConfigError
from kale_dagster.launchers.base import Launcher, LauncherConfig, LauncherStatus, RescaleRecord
from kale_dagster.rules import check, need, setting
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.api import TrainerSpec

#: Lines of a command's output kept on the run, and in an error.
KEPT_LINES = 20


def _argv(command: str, name: str) -> list[str]:
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise KaleConfigError(name, f"cannot be split into arguments: {exc}") from None
    if not argv:
        raise KaleConfigError(name, "is empty")
    return argv


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-KEPT_LINES:])


class CommandHook(Launcher):
    """Runs the declared commands; what the rescale job and the controller call.  No retarget: the user's
    command runs to its end."""

    def __init__(self, config: CommandHookLauncherConfig):
        self.config = config

    def _run(self, argv: list[str]) -> str:
        """What the command printed (stdout and stderr); an error when it fails or runs past the timeout."""
        shown = shlex.join(argv)
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            out, _ = proc.communicate(timeout=self.config.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # with whatever it started
            out, _ = proc.communicate()
            raise RuntimeError(
                f"`{shown}` ran past {self.config.timeout_s:g} s and was killed; its output: {_tail(out) or 'none'}"
            ) from None
        if proc.returncode != 0:
            raise RuntimeError(f"`{shown}` exited {proc.returncode}: {_tail(out) or 'no output'}")
        return out

    def status(self) -> LauncherStatus:
        out = self._run(_argv(self.config.status_command, "status_command"))
        last = _tail(out).splitlines()[-1:] or [""]
        try:
            workers = int(last[0].strip())
        except ValueError:
            raise RuntimeError(
                f"`{self.config.status_command}` must print the number of workers as its last line, printed {last[0]!r}"
            ) from None
        if workers < 0:
            raise RuntimeError(f"`{self.config.status_command}` printed {workers} workers")
        return LauncherStatus(workers=workers, observed_from=f"`{self.config.status_command}`")

    def rescale(self, m: int, reason: str = "rescale") -> RescaleRecord | None:
        before = self.status().workers
        if before == m:
            return None
        argv = [arg.replace("{workers}", str(m)) for arg in _argv(self.config.rescale_command, "rescale_command")]
        started = time.monotonic()
        out = self._run(argv)
        took = time.monotonic() - started
        return RescaleRecord(
            time=time.time(),
            from_workers=before,
            to_workers=m,
            downtime_s=took,
            reason=reason,
            phases={"command": round(took, 3)},
            output=_tail(out),
        )


@dataclass(frozen=True)
class CommandHookLauncherConfig(LauncherConfig):
    """Size a workload with your own commands (``my-scaler --replicas {workers}``, ``my-scaler --count``)."""

    rescale_command: str = setting(
        description="sets the workload's size; {workers} is replaced by the target (no shell)"
    )
    status_command: str = setting(description="prints the number of workers that run, as its last line (no shell)")
    timeout_s: float = setting(300.0, gt=0, le=86_400, unit="s", description="each command's limit; then killed")

    def __post_init__(self):
        check(
            self,
            lambda: _split_problem(self.rescale_command, "rescale_command"),
            lambda: _split_problem(self.status_command, "status_command"),
            lambda: need(
                "{workers}" in self.rescale_command,
                "rescale_command",
                "must contain {workers}, where the target size goes",
            ),
        )

    @property
    def rescale_timeout_s(self) -> float:  # the status before, the command, and a margin
        return 2 * self.timeout_s + 60.0

    def build(self, pipeline: str, source: KafkaSource, trainer: TrainerSpec, workers_per_pod: int = 1) -> CommandHook:
        return CommandHook(self)

    def describe(self) -> str:
        return f"the command `{self.rescale_command}`"


#: What a shell would read as an operator: here it would be an argument, since no shell runs the command.
SHELL_OPERATORS = ("|", "||", "&", "&&", ";", ">", ">>", "<", "2>", "2>&1", "$(", "`")


def _split_problem(command: str, name: str) -> KaleConfigError | None:
    try:
        argv = _argv(command, name)
    except KaleConfigError as exc:
        return exc
    for arg in argv:
        operator = next((op for op in SHELL_OPERATORS if arg == op or (op in ("$(", "`") and arg.startswith(op))), None)
        if operator is not None:
            return KaleConfigError(
                name,
                f"{operator!r} is a shell operator, but no shell runs the command (it would be an argument): put "
                "the pipeline in a script and name the script",
            )
    return None
