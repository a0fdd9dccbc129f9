"""The collectives of one training step, on ``torch.distributed`` (gloo on the CPU, NCCL on GPUs): every rank's
status at the step boundary, the forwarding of queued samples between ranks, and one all-reduce that averages the
gradients and the floating buffers and carries the losses.

Tensors live on the worker's device: NCCL wants them on the GPU, gloo on the CPU.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from kale_dagster.trainer.protocol import StepStatus
from kale_dagster.trainer.sample_queue import SampleQueue, Samples


def to_device(batch, device: torch.device):
    """``default_collate``'s batch (tensors in any nesting of dicts, lists and tuples) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def _unflatten(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy consecutive slices of ``flat`` back into ``tensors`` (each keeps its own dtype and device)."""
    at = 0
    for t in tensors:
        t.copy_(flat[at : at + t.numel()].view_as(t))
        at += t.numel()


def all_reduce_step(
    model: torch.nn.Module, params: list[torch.nn.Parameter], loss_sum: torch.Tensor, world: int, device: torch.device
) -> str:
    """One all-reduce of the gradients (each rank's already scaled by its share of the step's samples, so the sum is
    the global mean), the model's floating buffers (BatchNorm's running statistics) as a mean over ranks, so that
    every replica keeps one model, and the losses, last; integer buffers (num_batches_tracked) take the group's
    maximum.  What is not finite anywhere in the group ("loss", "gradient or buffer"), with nothing written back;
    "" once the reduced values are in place."""
    for p in params:  # a parameter this rank's batch did not reach still joins the group's average
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params if p.grad is not None]
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    counters = [b for b in model.buffers() if not b.is_floating_point()]
    flat = torch.cat(
        [g.reshape(-1).to(device) for g in grads]
        + [b.detach().reshape(-1).to(device) / world for b in buffers]
        + [loss_sum]
    )
    dist.all_reduce(flat)
    finite = torch.isfinite(flat)
    if not finite.all():
        return "loss" if not finite[-1] else "gradient or buffer"
    _unflatten(flat, grads + buffers)  # the losses, last, stay behind
    if counters:
        stacked = torch.cat([c.reshape(-1).to(device, dtype=torch.int64) for c in counters])
        dist.all_reduce(stacked, op=dist.ReduceOp.MAX)
        _unflatten(stacked, counters)
    return ""


def gather_status(mine: StepStatus, world: int, device: torch.device) -> list[StepStatus]:
    """Every rank's status at this step boundary, in rank order."""
    status = torch.tensor(mine.to_row(), dtype=torch.int64, device=device)
    gathered = [torch.zeros_like(status) for _ in range(world)]
    dist.all_gather(gathered, status)
    return [StepStatus.from_row(row) for row in torch.stack(gathered).tolist()]


def exchange(queue: SampleQueue, plan: list[tuple[int, int, int]], rank: int, world: int, device: torch.device) -> None:
    """Carry out this rank's part of the forwarding plan with point-to-point transfers.

    Samples are the user's objects, pickled: first every rank learns the size of each transfer (one
    all-gather of a row of sizes per rank), then the payloads go point to point."""
    if not plan:
        return
    counts: dict[int, int] = {}
    for src, dst, n in plan:
        if src == rank:
            counts[dst] = counts.get(dst, 0) + n
    payloads = {dst: queue.give_own(n).to_bytes() for dst, n in counts.items()}
    row = torch.zeros(world, dtype=torch.int64, device=device)
    for dst, data in payloads.items():
        row[dst] = len(data)
    table = [torch.zeros_like(row) for _ in range(world)]
    dist.all_gather(table, row)
    sizes = torch.stack(table).tolist()  # sizes[src][dst]
    ops, received = [], []
    for dst, data in payloads.items():
        tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        ops.append(dist.P2POp(dist.isend, tensor, dst))
    for src in range(world):
        if src != rank and sizes[src][rank]:
            buf = torch.empty(sizes[src][rank], dtype=torch.uint8, device=device)
            ops.append(dist.P2POp(dist.irecv, buf, src))
            received.append(buf)
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    for buf in received:
        queue.add_forwarded(Samples.from_bytes(buf.cpu().numpy().tobytes()))
