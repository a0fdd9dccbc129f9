"""The harness around the user's trainer (``trainer.api``): one rank of a group consumes its assigned partitions
(``trainer.intake``), balances, trains data-parallel (``trainer.collective``) and checkpoints.  At every join the
user's factory builds the trainer for that rank and group.  Events go to the launcher
(``trainer.protocol.WorkerEvent``): started, step, metrics, checkpoint, stopped.

Data parallelism is explicit rather than DDP's: after the user's loss is backpropagated, one all-reduce
sums every rank's gradients, each scaled by the rank's share of the global batch, with the losses
appended.  So a rank with nothing to train still takes part (it never calls the user's code on an empty
batch), any model works (unused parameters, several forward passes), and a non-finite loss is seen by
every rank at the same step, before any optimizer step, checkpoint or commit.

Each step every rank all-gathers a ``StepStatus`` (own and total queue
lengths, accepting, stop and checkpoint-due flags; ``trainer.protocol``).
From the table, identically on every rank: the forwarding plan (``balance.forwarding_plan``), executed with
point-to-point sends; the global sample count, so the loss is the global
mean whatever each rank's share; and the decision to stop.  SIGTERM sets
the stop flag, so all ranks leave at the same step boundary, write one
checkpoint (model, optimizer, offsets) and commit offsets to Kafka.

A rank catching up trains its backlog in arrival order across its partitions: the ones that run
ahead are paused (``trainer.ordering``), since the lag is the oldest unconsumed sample's.

Offsets: a checkpoint stores, per partition, the smallest offset not yet
trained anywhere (the owner's next fetch position when nothing of it is
queued), and Kafka gets the same offsets.  Forwarding trains a partition
out of order (a receiver may still hold older samples when their owner has
trained newer ones), so before each checkpoint the group first trains what
is queued at or below the newest trained offset of its partition: the
checkpoint then covers exactly what was trained, and a planned stop
repeats nothing.  A crash resumes from the last checkpoint and repeats at
most what was trained since.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import default_collate

from kale_dagster.trainer.api import (
    OnlineTrainer,
    TrainerContext,
    TrainerFailure,
    check_trainer,
    load_factory,
)
from kale_dagster.trainer.balance import AcceptState, forwarding_plan
from kale_dagster.trainer.checkpoint import CheckpointStore, CheckpointWriteError
from kale_dagster.trainer.collective import all_reduce_step, exchange, gather_status, to_device
from kale_dagster.trainer.committer import OffsetCommitter
from kale_dagster.trainer.intake import PartitionIntake, kafka_config
from kale_dagster.trainer.protocol import GroupAssignment, MetricsWindow, StepStatus, WorkerEvent, emit
from kale_dagster.trainer.sample_queue import SampleQueue, Samples


class WorkerState(Enum):
    """Where a worker process is (TorchElastic's ``WorkerState``, for one rank)."""

    STANDBY = "standby"  # warm, in no group: a stop ends the process at once
    RESTORING = "restoring"  # in a group, restoring its checkpoint: no step yet
    TRAINING = "training"  # stepped, or read an idle stream to its end: what a rescale waits for
    STOPPING = "stopping"  # the group stops: the last checkpoint and commit


@dataclass
class GroupProgress:
    """One group's training, as one rank keeps it from its restore to its last checkpoint."""

    intake: PartitionIntake
    accept: AcceptState
    step: int
    trained_total: int
    queue: SampleQueue = field(default_factory=SampleQueue)
    last_checkpoint: float = field(default_factory=time.monotonic)
    window: MetricsWindow = field(default_factory=MetricsWindow)


def device_for(rank: int) -> torch.device:
    """A worker's device: under torchrun (a Kubernetes pod of G workers), the GPU of its LOCAL_RANK; a local
    launcher's worker (every rank on one host, no LOCAL_RANK), the GPU of its rank; the CPU without CUDA."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local = os.environ.get("LOCAL_RANK")
    return torch.device("cuda", int(local) if local is not None else rank % torch.cuda.device_count())


class Worker:
    def __init__(self, args):
        self.args = args
        self.stop_requested = False
        self.state = WorkerState.STANDBY
        self.rank, self.world = 0, 1  # this rank's place in its group, set at every join
        self.device = device_for(0)  # a standby's; set again at every join, for the rank it joins as
        # Opened now: a store whose package is missing fails the worker in one line before it joins a group.
        self.checkpoints = CheckpointStore(args.checkpoint_dir, timeout_s=args.checkpoint_timeout_s)
        # Imported now, so that a warm standby has the user's module (and whatever it imports) loaded too.
        self.factory = load_factory(args.trainer)
        self.trainer: OnlineTrainer | None = None  # built at every join, for that rank and group
        self.started_at = time.monotonic()
        self.trained_log: BinaryIO | None = None  # with --trained-log, this rank's log of every trained sample
        self.newest_trained: dict[int, int] = {}  # per partition, the newest offset this rank trained in this group
        self.committer = None  # rank 0's OffsetCommitter for the current group, once it has checkpointed
        self.samples_per_record = 1  # as last seen: turns the queue's room into a record count
        self.poison_records = 0  # records skipped since the process started (not whole, valid samples)
        self.checkpoint_error = ""  # why the last checkpoint could not be written (rank 0), empty once one is

    def _count_poison(self, records: int) -> None:
        self.poison_records += records

    # --- lifecycle -------------------------------------------------------------

    def _build_trainer(self) -> OnlineTrainer:
        """The user's trainer for this rank and group, its model on this worker's device."""
        context = TrainerContext(
            rank=self.rank,
            world_size=self.world,
            device=self.device,
            pipeline=self.args.pipeline,
            options=json.loads(self.args.trainer_options),
        )
        try:
            trainer = self.factory(context)
        except Exception as exc:
            raise TrainerFailure(f"{self.args.trainer} raised {type(exc).__name__}: {exc}") from exc
        trainer = check_trainer(trainer, self.args.trainer)
        trainer.model.to(self.device)  # in place: the optimizer keeps the same parameters
        return trainer

    def serve(self, group: GroupAssignment) -> int:
        """Join a group, train until stopped, leave it.  A standby can serve again."""
        self.stop_requested, self.state = False, WorkerState.RESTORING
        self.started_at = time.monotonic()  # rates in the checkpoint count from the join
        self.join(group)
        try:
            return self.run()
        finally:
            self.state = WorkerState.STANDBY
            dist.destroy_process_group()
            # The next group gets a fresh trainer, loaded from the checkpoint this one just wrote.
            self.trainer = None

    def join(self, group: GroupAssignment) -> None:
        self.device = device_for(group.rank)
        if self.device.type == "cuda":
            # Collectives' tensors live on the device: NCCL wants them on the GPU (all_gather_object too), gloo on
            # the CPU.
            torch.cuda.set_device(self.device)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://{group.addr}:{group.port}",
            rank=group.rank,
            world_size=group.world,
            timeout=timedelta(seconds=self.args.collective_timeout_s),
        )
        self.rank, self.world = group.rank, group.world
        self.trainer = self._build_trainer()

    def restore(self) -> dict:
        """The latest checkpoint's state, loaded into the trainer; then every rank holds rank 0's weights (with
        no checkpoint yet, the factory may have initialised each rank differently)."""
        trainer = self.trainer
        assert trainer is not None, "built at join"
        state = self.checkpoints.load_latest() or {}
        if state:
            try:
                trainer.model.load_state_dict(state["model"])
                trainer.optimizer.load_state_dict(state["optimizer"])
                for name, part in (("scheduler", trainer.scheduler), ("user_state", trainer.state)):
                    if part is not None and name in state:
                        part.load_state_dict(state[name])
            except (RuntimeError, KeyError, ValueError, TypeError) as exc:
                raise TrainerFailure(
                    f"the latest checkpoint in {self.args.checkpoint_dir} does not fit {self.args.trainer}'s "
                    f"model: {str(exc).splitlines()[0]} (a changed model needs a new checkpoint_dir)"
                ) from exc
        for tensor in [*trainer.model.parameters(), *trainer.model.buffers()]:
            dist.broadcast(tensor.data, src=0)
        return state

    # --- data ----------------------------------------------------------------------

    # --- training ------------------------------------------------------------------

    def run(self) -> int:
        """Train this rank's partitions, one collective round per step, until a rank asks to stop; then the last
        checkpoint and commit.  Stages: restore (``_start``), rounds (``_round``), stop (``_finish``)."""
        g = self._start()
        try:
            while self._round(g):
                pass
            self._finish(g)
            return 0
        finally:
            if self.trained_log is not None:
                self.trained_log.close()
                self.trained_log = None
            self.samples_per_record = g.intake.samples_per_record
            g.intake.close()

    def _start(self) -> GroupProgress:
        """Restore the latest checkpoint and open this rank's partitions at the committed offsets."""
        args = self.args
        self.state = WorkerState.RESTORING
        state = self.restore()
        if args.emulate_restore_s:
            # EMULATION: loading a large model's checkpoint and re-forming its job
            # (the paper's restart is about 10 minutes for 1B parameters).
            time.sleep(args.emulate_restore_s)
        assert self.trainer is not None, "built at join"
        intake = PartitionIntake(self.args, self.rank, self.world, self.trainer.decode, self._count_poison, state)
        intake.samples_per_record = self.samples_per_record
        mine = intake.partitions
        g = GroupProgress(
            intake,
            AcceptState(high=args.high_watermark, low=args.low_watermark),
            step=int(state.get("step", 0)),
            trained_total=int(state.get("trained_total", 0)),
        )
        emit(
            WorkerEvent.STARTED,
            rank=self.rank,
            world=self.world,
            step=g.step,
            partitions=mine,
            resumed=bool(state),
            device=str(self.device),
            backend=dist.get_backend(),
        )
        self.newest_trained = {}
        if args.trained_log:
            self.trained_log = open(Path(args.trained_log) / f"rank{self.rank}-{os.getpid()}.bin", "ab")
        return g

    def _round(self, g: GroupProgress) -> bool:
        """One collective round: fetch, agree on who holds what, forward overflow, then a step (or an idle wait)
        and a checkpoint when one is due on any rank.  False once a rank asks the group to stop."""
        args, queue = self.args, g.queue
        g.intake.fill(queue)
        due = time.monotonic() - g.last_checkpoint >= args.checkpoint_every_s
        mine = StepStatus(len(queue.own), len(queue), g.accept.update(len(queue)), self.stop_requested, due)
        table = gather_status(mine, self.world, self.device)
        if any(r.stop for r in table):
            return False
        plan = [] if args.balance == "round-robin" else self._forwarding(table, g.step)
        exchange(queue, plan, self.rank, self.world, self.device)
        counts = [
            min(
                args.batch_size,
                r.total_queue + sum(n for _, d, n in plan if d == i) - sum(n for s, _, n in plan if s == i),
            )
            for i, r in enumerate(table)
        ]
        global_n = sum(counts)
        if global_n:
            self._step(g, global_n)
        else:
            self._idle(g)
        if any(r.checkpoint_due for r in table):  # checkpoints are collective: all ranks take one at the same step
            self.checkpoint(g)
            g.last_checkpoint = time.monotonic()
        if not global_n:
            time.sleep(0.01)
        return True

    def _forwarding(self, table: list[StepStatus], step: int) -> list[tuple[int, int, int]]:
        """Which rank forwards how many queued samples to which, so that every rank has a batch to train."""
        own, total, accepting = (
            [r.own_queue for r in table],
            [r.total_queue for r in table],
            [r.accepting for r in table],
        )
        return forwarding_plan(own, total, accepting, self.args.high_watermark, seed=step)

    def _step(self, g: GroupProgress, global_n: int) -> None:
        """Train this rank's share of a step of ``global_n`` samples; the first one is what a rescale waits for."""
        batch = g.queue.take(self.args.batch_size)
        busy_s = self.train_batch(batch, global_n, g.step)
        g.step += 1
        g.trained_total += len(batch)
        g.window.add(len(batch), busy_s, full=global_n == self.args.batch_size * self.world)
        if self.state is WorkerState.RESTORING:
            self.state = WorkerState.TRAINING
            emit(WorkerEvent.STEP, rank=self.rank, step=g.step, first=True)
            # Metrics count from the first step: start-up is not idle time (HPA likewise ignores pods that are
            # still initializing).
            g.window = MetricsWindow()
        g.window = self.report(g.window, g.step)

    def _idle(self, g: GroupProgress) -> None:
        """Nothing to train anywhere: a rank that has read its partitions to the end is ready (an idle stream must
        not stall a rescale), and an idle group reports too: 0 samples/s, 0% busy."""
        if self.state is WorkerState.RESTORING and g.intake.caught_up():
            self.state = WorkerState.TRAINING
            emit(WorkerEvent.STEP, rank=self.rank, step=g.step, first=True, caught_up=True)
            g.window = MetricsWindow()
        if self.state is WorkerState.TRAINING:
            g.window.wait()
            g.window = self.report(g.window, g.step)

    def _finish(self, g: GroupProgress) -> None:
        """The group stops: one last checkpoint, and its offsets reach Kafka before the next group commits newer
        ones."""
        self.state = WorkerState.STOPPING
        self.checkpoint(g)
        if self.committer is not None:
            self.committer.close(timeout_s=self.args.collective_timeout_s)
            self.committer = None
        emit(WorkerEvent.STOPPED, rank=self.rank, step=g.step)

    def report(self, window: MetricsWindow, step: int) -> MetricsWindow:
        """Emit the window's metrics once it spans ``metrics_every_s``; the window to count in next."""
        if time.monotonic() - window.start < self.args.metrics_every_s:
            return window
        emit(
            WorkerEvent.METRICS,
            rank=self.rank,
            world=self.world,
            **window.fields(),
            **self._quality(),
            step=step,
            emulated=bool(self.args.emulate_gpu_rate),
            poison_records=self.poison_records,
            checkpoint_error=self.checkpoint_error,
        )
        return MetricsWindow()

    def _quality(self) -> dict:
        """The trainer's progressive-validation metric, for the metrics event (none when it declares none)."""
        metric = self.trainer.metric if self.trainer is not None else None
        if metric is None:
            return {}
        value = float(metric.value())
        return {"metric_name": str(metric.name), "metric": value if np.isfinite(value) else None}

    def train_batch(self, batch: Samples, global_n: int, step: int) -> float:
        """One collective step on this rank's ``batch`` (possibly empty); the seconds the GPU was busy."""
        started = time.monotonic()
        self.train_step(batch, global_n, step)
        if len(batch):
            origin = batch.origin
            for p in np.unique(origin["partition"]):
                newest = int(origin["offset"][origin["partition"] == p].max())
                self.newest_trained[int(p)] = max(self.newest_trained.get(int(p), -1), newest)
            if self.trained_log is not None:
                self.trained_log.write(origin.tobytes())  # (partition, offset, index in record) as int64 triples
        if not self.args.emulate_gpu_rate:
            return time.monotonic() - started  # the GPU is busy for the whole step
        # EMULATION: one GPU's throughput, so scaling shows on a small CPU.
        pause = len(batch) / self.args.emulate_gpu_rate - (time.monotonic() - started)
        if pause > 0:
            time.sleep(pause)
        # The emulated GPU computes for the batch's share of its rate; the host's
        # own delays (a busy CPU, collectives among processes) are not GPU time.
        return len(batch) / self.args.emulate_gpu_rate

    def settle(self, queue: SampleQueue, step: int, trained_total: int) -> tuple[int, int]:
        """Train, collectively, what is queued at or below the newest trained offset of its partition on any rank,
        so that the checkpoint's offsets cover exactly the samples trained; returns the updated step and count."""
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, self.newest_trained)
        newest: dict[int, int] = {}
        for trained in everyone:
            for p, offset in trained.items():
                newest[p] = max(newest.get(p, -1), offset)
        holes = queue.take_through(newest)
        while True:
            n = min(len(holes), self.args.batch_size)
            total = torch.tensor([n], dtype=torch.int64, device=self.device)
            dist.all_reduce(total)
            if int(total) == 0:
                return step, trained_total
            batch, holes = holes.split(n)
            self.train_batch(batch, int(total), step)
            step, trained_total = step + 1, trained_total + n

    @contextlib.contextmanager
    def _users(self, part: str):
        """The user's ``part`` runs here: an exception from it is a bug a restart would repeat, so it fails the
        group in one line naming the factory, instead of a traceback and a crash-restart loop."""
        try:
            yield
        except TrainerFailure:
            raise
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise TrainerFailure(f"{self.args.trainer}: {part} raised {type(exc).__name__}: {first}") from exc

    def train_step(self, batch: Samples, global_n: int, step: int) -> None:
        """The user's forward pass on this rank's share, then one all-reduce of the gradients (each rank's scaled
        by its share of the ``global_n`` samples, so the update is the global mean) with the losses appended,
        then the optimizer step, unless the loss is not finite anywhere in the group."""
        trainer = self.trainer
        assert trainer is not None, "built at join"
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        trainer.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros(1, device=self.device)
        if len(batch):
            with self._users("collate"):
                data = (
                    trainer.collate(batch.items)
                    if trainer.collate
                    else to_device(default_collate(batch.items), self.device)
                )
            with self._users("loss"):
                out = trainer.loss(trainer.model, data)
            loss, predictions = out if isinstance(out, tuple) else (out, None)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise TrainerFailure(
                    f"{self.args.trainer}: loss must return a scalar tensor, got {type(loss).__name__}"
                )
            if trainer.metric is not None and predictions is not None:
                with self._users("metric.update"):
                    trainer.metric.update(predictions, data)  # scored before the step: progressive validation
            with self._users("loss (its backward pass)"):
                (loss * (len(batch) / global_n)).backward()
            loss_sum += loss.detach().reshape(1).to(self.device) * len(batch)
        not_finite = all_reduce_step(trainer.model, params, loss_sum, self.world, self.device)
        if not_finite:
            raise TrainerFailure(
                f"{self.args.trainer}: the {not_finite} is not finite at step {step + 1}; the group stops before that "
                "step, and nothing past the last checkpoint is checkpointed or committed"
            )
        trainer.optimizer.step()
        if trainer.scheduler is not None:
            trainer.scheduler.step()

    def checkpoint(self, g: GroupProgress) -> None:
        """One collective checkpoint: what is queued below the newest trained offsets is trained first (``settle``),
        then rank 0 writes the state and commits the offsets it covers."""
        trainer = self.trainer
        assert trainer is not None, "built at join"
        step, trained_total = g.step, g.trained_total = self.settle(g.queue, g.step, g.trained_total)
        if self.trained_log is not None:
            # What a checkpoint covers must be on disk in the accounting log too.
            self.trained_log.flush()
            os.fsync(self.trained_log.fileno())
        mine = {
            "next": g.intake.next_pos,
            "start": g.intake.start_pos,
            "min_queued": g.queue.min_offsets(),
            "elapsed": time.monotonic() - self.started_at,
        }
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, mine)
        if self.rank == 0:
            offsets = {}
            for info in everyone:
                offsets.update(info["next"])
            for info in everyone:
                for p, off in info["min_queued"].items():
                    offsets[p] = min(offsets[p], off)
            rates = {}
            for info in everyone:
                for p, nxt in info["next"].items():
                    rates[p] = max(nxt - info["start"][p], 0) / max(info["elapsed"], 1e-3)
            state = {
                "step": step,
                "trained_total": trained_total,
                "offsets": offsets,  # keyed by StreamPartitions, whose topics come with them
                "topics": list(g.intake.stream.topics),
                "partition_rates": rates,
                "model": trainer.model.state_dict(),
                "optimizer": trainer.optimizer.state_dict(),
                **({"scheduler": trainer.scheduler.state_dict()} if trainer.scheduler is not None else {}),
                **({"user_state": trainer.state.state_dict()} if trainer.state is not None else {}),
                "world": self.world,
            }
            try:
                saved = self.checkpoints.save(step, state, keep=self.args.keep)
            except CheckpointWriteError as exc:
                # Training goes on; Kafka keeps the offsets of the last checkpoint written, so a restart
                # repeats what was trained since (nothing is lost) and the growing lag shows it.
                self.checkpoint_error = str(exc)
                print(f"{exc}; training continues, offsets not committed past it", file=sys.stderr, flush=True)
            else:
                self.checkpoint_error = ""
                if self.committer is None:
                    self.committer = OffsetCommitter(
                        kafka_config(self.args.bootstrap_servers), self.args.group_id, g.intake.stream
                    )
                self.committer.submit(offsets)  # after the save, never ahead of it; off the step, never stalling it
                emit(WorkerEvent.CHECKPOINT, step=step, path=saved, offsets={str(k): v for k, v in offsets.items()})
        dist.barrier()
