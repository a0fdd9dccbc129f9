"""One trainer worker: consume assigned partitions, balance, train with DDP, checkpoint.

Run under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the
environment) or as a warm standby for the local launcher (``--standby``:
torch is imported and the model built, then the process waits for a JSON
line on stdin with rank, world size and rendezvous address; after the group
stops it is a standby again).  Events go to stdout as JSON lines for the
launcher (``trainer.protocol.WorkerEvent``): ready, started, step, metrics,
checkpoint, stopped.

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

import argparse
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from kale_dagster.stream.record_time import usable_ms
from kale_dagster.stream.samples import RECORD, decode
from kale_dagster.stream.source import WORKER_ENV, Secret
from kale_dagster.trainer.balance import AcceptState, assign_by_rate, forwarding_plan, round_robin
from kale_dagster.trainer.checkpoint import CheckpointWriteError, load_latest, save_atomic
from kale_dagster.trainer.committer import OffsetCommitter
from kale_dagster.trainer.model import CTRModel, RollingAUC, batch_tensors
from kale_dagster.trainer.ordering import ArrivalOrder
from kale_dagster.trainer.protocol import COLLECTIVE_TIMEOUT_S, GroupAssignment, StepStatus, WorkerEvent, event_line

QITEM = np.dtype([("rec", RECORD), ("partition", "<i4"), ("offset", "<i8")])
# A partition that may deliver and does not for this long stops holding this rank's others back (ordering).
ORDER_STALL_S = 2.0


def kafka_config(servers: str) -> dict:
    """kafka-python settings: servers from the command line, security from the environment.

    On Kubernetes the environment comes from the pipeline's Secret (envFrom),
    so credentials never appear in a manifest or on a command line.
    """
    config: dict[str, object] = {"bootstrap_servers": servers.split(",")}
    for env, key in WORKER_ENV.items():
        if os.environ.get(env):
            config[key] = os.environ[env]
    if "sasl_plain_password" in config:  # kafka-python logs its configuration at DEBUG
        config["sasl_plain_password"] = Secret(os.environ["KAFKA_SASL_PASSWORD"])
    return config


def _unblock_resumed_partitions(consumer) -> None:
    """Work around kafka-python 3.0.12: records parked while their partition was paused come back on resume only
    when no partition's records are in line, and it tests that with ``is None`` while a drained partition's
    records stay in line (empty, not None).  Until then the resumed partition is neither handed out nor fetched
    again, and the rank stops training it.  An emptied line is cleared so the next poll restores the parked data."""
    fetcher = getattr(consumer, "_fetcher", None)
    in_line = getattr(fetcher, "_next_partition_records", None)
    if (
        fetcher is not None
        and in_line is not None
        and not in_line
        and getattr(fetcher, "_paused_partition_records", None)
    ):
        fetcher._next_partition_records = None


def emit(event: WorkerEvent, **fields) -> None:
    try:
        print(event_line(event, **fields), flush=True)
    except BrokenPipeError:
        # The launcher that read these is gone: events go nowhere from now on, and the worker stops
        # gracefully (``_leave_when_orphaned``) instead of dying mid-step on a write.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class LocalQueue:
    """Own samples (fetched here, FIFO) and forwarded ones (never forwarded again)."""

    def __init__(self):
        self.own = np.empty(0, dtype=QITEM)
        self.forwarded = np.empty(0, dtype=QITEM)

    def __len__(self) -> int:
        return len(self.own) + len(self.forwarded)

    def add_own(self, items: np.ndarray) -> None:
        self.own = np.concatenate([self.own, items])

    def add_forwarded(self, items: np.ndarray) -> None:
        self.forwarded = np.concatenate([self.forwarded, items])

    def give_own(self, n: int) -> np.ndarray:
        """The oldest ``n`` own samples, for a receiver (they are the most overdue)."""
        out, self.own = self.own[:n], self.own[n:]
        return out

    def take(self, n: int) -> np.ndarray:
        """Up to ``n`` samples to train: forwarded first, then own, oldest first."""
        f = min(n, len(self.forwarded))
        taken = [self.forwarded[:f], self.own[: n - f]]
        self.forwarded, self.own = self.forwarded[f:], self.own[n - f :]
        return np.concatenate(taken)

    def take_through(self, newest: dict[int, int]) -> np.ndarray:
        """Remove and return the queued samples at or below ``newest[partition]`` (the holes a checkpoint must not
        skip)."""

        def due(arr):
            limit = np.array([newest.get(int(p), -1) for p in arr["partition"]], dtype=np.int64)
            return arr["offset"] <= limit

        out = []
        for name in ("forwarded", "own"):
            arr = getattr(self, name)
            mask = due(arr) if len(arr) else np.zeros(0, dtype=bool)
            out.append(arr[mask])
            setattr(self, name, arr[~mask])
        return np.concatenate(out)

    def min_offsets(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for arr in (self.own, self.forwarded):
            for p in np.unique(arr["partition"]):
                out[int(p)] = min(out.get(int(p), 1 << 62), int(arr["offset"][arr["partition"] == p].min()))
        return out


class MetricsWindow:
    """What one rank did since the window opened: the basis of its metrics event."""

    def __init__(self):
        self.start, self.samples, self.steps, self.idle_steps, self.busy_s = time.monotonic(), 0, 0, 0, 0.0
        self.waited = False

    def add(self, samples: int, busy_s: float, full: bool) -> None:
        self.samples += samples
        self.steps += 1
        self.idle_steps += samples == 0
        self.busy_s += busy_s
        self.waited |= not full

    def wait(self) -> None:
        """The group found nothing to train."""
        self.waited = True

    def fields(self) -> dict:
        elapsed = time.monotonic() - self.start
        # busy_share is what GPU utilization reports (HPA's metric); idle_share
        # counts steps this rank sat out while others trained (imbalance).
        # saturated: no step of the window waited for data, so samples_per_s is
        # the group's capacity, F(w), not the arrival rate (the paper's profiling).
        return {
            "samples_per_s": self.samples / elapsed,
            "idle_share": self.idle_steps / max(self.steps, 1),
            "busy_share": min(self.busy_s / elapsed, 1.0),
            "saturated": self.steps > 0 and not self.waited,
        }


class Worker:
    def __init__(self, args):
        self.args = args
        self.stop_requested = False
        self.serving = False
        self.device = (
            torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        self._build_model()
        self.started_at = time.monotonic()
        self.trained_log = None
        self.committer = None  # rank 0's OffsetCommitter for the current group, once it has checkpointed
        self.samples_per_record = 1  # as last seen: turns the queue's room into a record count
        self.poison_records = 0  # records skipped since the process started (not whole, valid samples)
        self.checkpoint_error = ""  # why the last checkpoint could not be written (rank 0), empty once one is

    # --- lifecycle -------------------------------------------------------------

    def _build_model(self) -> None:
        torch.manual_seed(0)
        self.model = CTRModel().to(self.device)
        self.optimizer = torch.optim.Adagrad(self.model.parameters(), lr=0.05)
        self.auc = RollingAUC()

    def serve(self, group: GroupAssignment) -> int:
        """Join a group, train until stopped, leave it.  A standby can serve again."""
        self.stop_requested, self.serving = False, True
        self.started_at = time.monotonic()  # rates in the checkpoint count from the join
        self.join(group)
        try:
            return self.run()
        finally:
            self.serving = False
            dist.destroy_process_group()
            # DDP's hooks belong to one process group: the next group gets a
            # fresh model, loaded from the checkpoint this one just wrote.
            self._build_model()

    def join(self, group: GroupAssignment) -> None:
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://{group.addr}:{group.port}",
            rank=group.rank,
            world_size=group.world,
            timeout=timedelta(seconds=self.args.collective_timeout_s),
        )
        self.rank, self.world = group.rank, group.world
        self.ddp = DistributedDataParallel(
            self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
        )

    def restore(self) -> dict:
        state = load_latest(self.args.checkpoint_dir) or {}
        if state:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        return state

    # --- data ----------------------------------------------------------------------

    def open_consumer(self, state: dict):
        from kafka import KafkaConsumer
        from kafka.structs import TopicPartition

        consumer = KafkaConsumer(
            **kafka_config(self.args.bootstrap_servers),
            enable_auto_commit=False,
            group_id=None,
            max_partition_fetch_bytes=1 << 20,
            fetch_max_wait_ms=50,
        )
        partitions = sorted(consumer.partitions_for_topic(self.args.topic) or [])
        if not partitions:
            raise RuntimeError(f"topic {self.args.topic!r} has no partitions")
        rates = state.get("partition_rates") or {p: 1.0 for p in partitions}
        rates = {p: float(rates.get(p, 1.0)) for p in partitions}
        plan = (
            assign_by_rate(rates, self.world) if self.args.balance == "rates" else round_robin(partitions, self.world)
        )
        mine = [TopicPartition(self.args.topic, p) for p in plan[self.rank]]
        if mine:  # more workers than partitions: this one trains forwarded samples only
            consumer.assign(mine)
        offsets = state.get("offsets", {})
        committed = self._committed(mine) if not offsets else {}
        for tp in mine:
            pos = offsets.get(tp.partition, committed.get(tp.partition))
            if pos is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, pos)
        self.next_pos = {tp.partition: consumer.position(tp) for tp in mine}
        self.start_pos = dict(self.next_pos)
        self.assigned = {tp.partition: tp for tp in mine}
        self.order = ArrivalOrder(lead_ms=int(self.args.order_lead_s * 1000), stall_s=ORDER_STALL_S)
        return consumer, [tp.partition for tp in mine]

    def _committed(self, tps) -> dict[int, int]:
        from kafka import KafkaConsumer

        c = KafkaConsumer(
            **kafka_config(self.args.bootstrap_servers), group_id=self.args.group_id, enable_auto_commit=False
        )
        try:
            return {tp.partition: off for tp in tps if (off := c.committed(tp)) is not None}
        finally:
            c.close()

    def fill(self, consumer, queue: LocalQueue) -> None:
        room = self.args.max_queue - len(queue.own)
        if room <= 0 or not self.next_pos:
            return
        # kafka-python drives its network I/O inside poll(): with a batch queued
        # a zero timeout just collects what has arrived; a starving worker waits
        # 5 ms, enough for a fetch to complete without stalling the collective.
        wait_ms = 0 if len(queue) >= self.args.batch_size else 5
        while room > 0:
            # A batch's worth at a time: the partitions that run ahead are paused before the rest of the room fills.
            want = max(min(room, self.args.batch_size) // self.samples_per_record, 1)
            _unblock_resumed_partitions(consumer)
            polled = consumer.poll(timeout_ms=wait_ms, max_records=want)
            wait_ms, got, newest = 0, 0, {}
            for tp, records in polled.items():
                if not records:
                    continue
                got += len(records)
                newest[tp.partition] = usable_ms(records[-1].timestamp, time.time())
                self._queue_records(tp.partition, records, queue)
            self._keep_arrival_order(consumer, newest)
            if got < want:
                return  # nothing more fetched for the partitions that may deliver
            room = self.args.max_queue - len(queue.own)

    def _queue_records(self, partition: int, records: list, queue: LocalQueue) -> None:
        samples, counts = decode([r.value for r in records])
        poison = counts == 0
        if poison.any():  # skipped, never retried: its offset is passed like any other
            self.poison_records += int(poison.sum())
            first = records[int(np.flatnonzero(poison)[0])]
            print(
                f"skipped {int(poison.sum())} record(s) that are not kale samples in partition {partition}, "
                f"first at offset {first.offset} ({len(first.value or b'')} bytes)",
                file=sys.stderr,
                flush=True,
            )
        items = np.empty(len(samples), dtype=QITEM)
        items["rec"] = samples
        items["partition"] = partition
        # Every sample of a packed record carries the record's offset: a
        # checkpoint taken mid-record resumes at that record (at least once).
        items["offset"] = np.repeat([r.offset for r in records], counts)
        queue.add_own(items)
        self.samples_per_record = int(counts.max()) or self.samples_per_record
        self.next_pos[partition] = records[-1].offset + 1

    def _keep_arrival_order(self, consumer, newest: dict[int, int | None]) -> None:
        """Pause the partitions that run ahead of this rank's oldest backlog, resume the others (``ordering``)."""
        backlogged = [
            p for p, tp in self.assigned.items() if (hw := consumer.highwater(tp)) is None or self.next_pos[p] < hw
        ]
        paused = self.order.held
        held = self.order.polled(newest, backlogged, time.monotonic())
        if held != paused:
            consumer.resume(*(self.assigned[p] for p in paused - held))
            consumer.pause(*(self.assigned[p] for p in held - paused))

    def caught_up(self, consumer) -> bool:
        """Every partition of this rank has reported its high watermark and been read up to it."""
        return all(
            (hw := consumer.highwater(tp)) is not None and self.next_pos[tp.partition] >= hw
            for tp in consumer.assignment()
        )

    def exchange(self, queue: LocalQueue, plan: list[tuple[int, int, int]]) -> None:
        """Carry out this rank's part of the forwarding plan with point-to-point transfers."""
        ops, received = [], []
        for src, dst, n in plan:
            if src == self.rank:
                payload = torch.from_numpy(queue.give_own(n).view(np.uint8).copy())
                ops.append(dist.P2POp(dist.isend, payload, dst))
            elif dst == self.rank:
                buf = torch.empty(n * QITEM.itemsize, dtype=torch.uint8)
                ops.append(dist.P2POp(dist.irecv, buf, src))
                received.append(buf)
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        for buf in received:
            queue.add_forwarded(buf.numpy().view(QITEM))

    # --- training ------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        state = self.restore()
        if args.emulate_restore_s:
            # EMULATION: loading a large model's checkpoint and re-forming its job
            # (the paper's restart is about 10 minutes for 1B parameters).
            time.sleep(args.emulate_restore_s)
        step = int(state.get("step", 0))
        trained_total = int(state.get("trained_total", 0))
        consumer, mine = self.open_consumer(state)
        queue = LocalQueue()
        accept = AcceptState(high=args.high_watermark, low=args.low_watermark)
        emit(WorkerEvent.STARTED, rank=self.rank, world=self.world, step=step, partitions=mine, resumed=bool(state))
        self.newest_trained: dict[int, int] = {}  # per partition, the newest offset this rank trained in this group
        trained_log = self.trained_log = (
            open(Path(args.trained_log) / f"rank{self.rank}-{os.getpid()}.bin", "ab") if args.trained_log else None
        )
        last_ckpt = time.monotonic()
        window = MetricsWindow()
        first_step_done = False
        try:
            while True:
                self.fill(consumer, queue)
                due = time.monotonic() - last_ckpt >= args.checkpoint_every_s
                mine_now = StepStatus(len(queue.own), len(queue), accept.update(len(queue)), self.stop_requested, due)
                table = self.gather_status(mine_now)
                if any(r.stop for r in table):
                    break
                plan = (
                    []
                    if args.balance == "round-robin"
                    else forwarding_plan(
                        [r.own_queue for r in table],
                        [r.total_queue for r in table],
                        [r.accepting for r in table],
                        args.high_watermark,
                        seed=step,
                    )
                )
                self.exchange(queue, plan)
                counts = [
                    min(
                        args.batch_size,
                        r.total_queue + sum(n for s, d, n in plan if d == i) - sum(n for s, d, n in plan if s == i),
                    )
                    for i, r in enumerate(table)
                ]
                global_n = sum(counts)
                # Checkpoints are collective: all ranks take one at the same step.
                checkpoint_now = any(r.checkpoint_due for r in table)
                if global_n == 0:
                    if not first_step_done and self.caught_up(consumer):
                        # Nothing to train: the rank is ready, and an idle stream must not stall a rescale.
                        first_step_done = True
                        emit(WorkerEvent.STEP, rank=self.rank, step=step, first=True, caught_up=True)
                        window = MetricsWindow()
                    if first_step_done:
                        window.wait()
                        window = self.report(window, step)  # an idle group reports too: 0 samples/s, 0% busy
                    if checkpoint_now:
                        step, trained_total = self.checkpoint(step, trained_total, queue)
                        last_ckpt = time.monotonic()
                    time.sleep(0.01)
                    continue
                batch = queue.take(args.batch_size)
                busy_s = self.train_batch(batch, global_n)
                step += 1
                trained_total += len(batch)
                window.add(len(batch), busy_s, full=global_n == args.batch_size * self.world)
                if not first_step_done:
                    first_step_done = True
                    emit(WorkerEvent.STEP, rank=self.rank, step=step, first=True)
                    # Metrics count from the first step: start-up is not idle time (HPA
                    # likewise ignores pods that are still initializing).
                    window = MetricsWindow()
                window = self.report(window, step)
                if checkpoint_now:
                    step, trained_total = self.checkpoint(step, trained_total, queue)
                    last_ckpt = time.monotonic()
            step, trained_total = self.checkpoint(step, trained_total, queue)
            if self.committer is not None:
                # The group's last offsets reach Kafka before the next group commits newer ones.
                self.committer.close(timeout_s=self.args.collective_timeout_s)
                self.committer = None
            emit(WorkerEvent.STOPPED, rank=self.rank, step=step)
            return 0
        finally:
            if trained_log is not None:
                trained_log.close()
            consumer.close()

    def report(self, window: MetricsWindow, step: int) -> MetricsWindow:
        """Emit the window's metrics once it spans ``metrics_every_s``; the window to count in next."""
        if time.monotonic() - window.start < self.args.metrics_every_s:
            return window
        emit(
            WorkerEvent.METRICS,
            rank=self.rank,
            world=self.world,
            **window.fields(),
            auc=self.auc.value(),
            step=step,
            emulated=bool(self.args.emulate_gpu_rate),
            poison_records=self.poison_records,
            checkpoint_error=self.checkpoint_error,
        )
        return MetricsWindow()

    def gather_status(self, mine: StepStatus) -> list[StepStatus]:
        """Every rank's status at this step boundary, in rank order."""
        status = torch.tensor(mine.to_row(), dtype=torch.int64)
        gathered = [torch.zeros_like(status) for _ in range(self.world)]
        dist.all_gather(gathered, status)
        return [StepStatus.from_row(row) for row in torch.stack(gathered).tolist()]

    def train_batch(self, batch: np.ndarray, global_n: int) -> float:
        """One collective step on this rank's ``batch`` (possibly empty); the seconds the GPU was busy."""
        started = time.monotonic()
        self.train_step(batch["rec"], global_n)
        if len(batch):
            for p in np.unique(batch["partition"]):
                newest = int(batch["offset"][batch["partition"] == p].max())
                self.newest_trained[int(p)] = max(self.newest_trained.get(int(p), -1), newest)
            if self.trained_log is not None:
                self.trained_log.write(
                    np.stack(
                        [batch["partition"].astype(np.int64), batch["offset"], batch["rec"]["seq"].astype(np.int64)],
                        axis=1,
                    ).tobytes()
                )
        if not self.args.emulate_gpu_rate:
            return time.monotonic() - started  # the GPU is busy for the whole step
        # EMULATION: one GPU's throughput, so scaling shows on a small CPU.
        pause = len(batch) / self.args.emulate_gpu_rate - (time.monotonic() - started)
        if pause > 0:
            time.sleep(pause)
        # The emulated GPU computes for the batch's share of its rate; the host's
        # own delays (a busy CPU, collectives among processes) are not GPU time.
        return len(batch) / self.args.emulate_gpu_rate

    def settle(self, queue: LocalQueue, step: int, trained_total: int) -> tuple[int, int]:
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
            total = torch.tensor([n], dtype=torch.int64)
            dist.all_reduce(total)
            if int(total) == 0:
                return step, trained_total
            batch, holes = holes[:n], holes[n:]
            self.train_batch(batch, int(total))
            step, trained_total = step + 1, trained_total + n

    def train_step(self, records: np.ndarray, global_n: int) -> None:
        users, items, dense, labels = batch_tensors(records, self.device)
        logits = self.ddp(users, items, dense)
        # DDP averages gradients over ranks: scale so the update is the global mean over samples.
        loss = (
            torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
            * self.world
            / global_n
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        if len(records):
            self.auc.add(torch.sigmoid(logits.detach()).cpu().numpy(), records["label"])

    def checkpoint(self, step: int, trained_total: int, queue: LocalQueue) -> tuple[int, int]:
        step, trained_total = self.settle(queue, step, trained_total)
        if self.trained_log is not None:
            # What a checkpoint covers must be on disk in the accounting log too.
            self.trained_log.flush()
            os.fsync(self.trained_log.fileno())
        mine = {
            "next": self.next_pos,
            "start": self.start_pos,
            "min_queued": queue.min_offsets(),
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
                "offsets": offsets,
                "partition_rates": rates,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "world": self.world,
            }
            try:
                path = save_atomic(self.args.checkpoint_dir, step, state, keep=self.args.keep)
            except CheckpointWriteError as exc:
                # Training goes on; Kafka keeps the offsets of the last checkpoint written, so a restart
                # repeats what was trained since (nothing is lost) and the growing lag shows it.
                self.checkpoint_error = str(exc)
                print(f"{exc}; training continues, offsets not committed past it", file=sys.stderr, flush=True)
            else:
                self.checkpoint_error = ""
                if self.committer is None:
                    self.committer = OffsetCommitter(
                        kafka_config(self.args.bootstrap_servers), self.args.group_id, self.args.topic
                    )
                self.committer.submit(offsets)  # after the save, never ahead of it; off the step, never stalling it
                emit(WorkerEvent.CHECKPOINT, step=step, path=str(path), offsets={str(k): v for k, v in offsets.items()})
        dist.barrier()
        return step, trained_total


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="kale trainer worker")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group-id", required=True)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--max-queue", type=int, default=2048)
    parser.add_argument("--high-watermark", type=int, default=768)
    parser.add_argument("--low-watermark", type=int, default=256)
    parser.add_argument(
        "--balance",
        choices=["rates", "round-robin"],
        default="rates",
        help="rates: assign partitions by measured rate and forward overflow; round-robin: neither (baseline)",
    )
    parser.add_argument(
        "--emulate-gpu-rate", type=float, default=0.0, help="EMULATION: cap samples/s per worker (0 = off)"
    )
    parser.add_argument(
        "--emulate-restore-s",
        type=float,
        default=0.0,
        help="EMULATION: extra seconds to restore a checkpoint (0 = off)",
    )
    parser.add_argument("--checkpoint-every-s", type=float, default=5.0)
    parser.add_argument(
        "--order-lead-s",
        type=float,
        default=0.5,
        help="how far (record time) one of a rank's partitions may run ahead of its oldest backlog before it is paused",
    )
    parser.add_argument("--metrics-every-s", type=float, default=2.0)
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--collective-timeout-s", type=float, default=COLLECTIVE_TIMEOUT_S)
    parser.add_argument(
        "--trained-log",
        default=None,
        help="directory for per-rank logs of trained (partition, offset, sample seq) as int64 triples",
    )
    parser.add_argument("--standby", action="store_true", help="wait for rank/world on stdin (warm standby)")
    return parser.parse_args(argv)


def _leave_when_orphaned(parent: int, every_s: float = 1.0) -> None:
    """Stop as on SIGTERM once the launcher that started this worker is gone (killed, crashed): nothing would
    read its events, restart or stop it, and a new launcher would start a second group on the same partitions.
    Polling the parent works from any thread, where PR_SET_PDEATHSIG follows the thread that forked."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv=None) -> int:
    args = parse_args(argv)
    worker = Worker(args)

    def on_stop(*_):
        if not worker.serving:
            sys.exit(0)  # a standby has nothing to save
        worker.stop_requested = True

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    threading.Thread(target=_leave_when_orphaned, args=(os.getppid(),), daemon=True).start()
    try:
        if not args.standby:
            env = os.environ
            return worker.serve(
                GroupAssignment(int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], int(env["MASTER_PORT"]))
            )
        # Standby: serve one group after another.  A worker stopped by a rescale
        # comes back here warm (torch imported, broker connection open), so the
        # next group starts without a new process; an empty line ends it.
        while True:
            emit(WorkerEvent.READY, pid=os.getpid())
            line = sys.stdin.readline()
            if not line.strip():
                return 0
            code = worker.serve(GroupAssignment.from_line(line))
            if code:
                return code
    finally:
        if worker.committer is not None:
            worker.committer.close()  # the last checkpoint's offsets reach Kafka before the process exits


if __name__ == "__main__":
    code = main()
    # Everything durable is done (checkpoint fsynced, offsets committed, logs
    # closed).  Interpreter teardown of torch and gloo takes seconds on a busy
    # machine, and a rescale waits for the old group to exit: skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
