"""The first run on a GPU machine: the ``gpu`` tests, then a calibration of F(1) for both example trainers.

1. ``pytest -m gpu``: a worker on CUDA with NCCL at one rank, a checkpoint saved on the GPU restored on the CPU and
   back, a rescale that loses and repeats nothing (tests/test_gpu.py).
2. F(1), compute-bound: samples/s of one worker's step (decode, collate, forward, backward, optimizer step) on the
   GPU, for the demo CTR trainer and the demand forecaster example (examples/demand_forecaster), on the same
   records, against the CPU in the same run.  The median of ``--repeats`` timed windows of ``--seconds`` each.
   Kafka's data path is not in it (bench/trainer.py measures that overhead); seed a pipeline's
   ``throughput_prior`` from it, and F(w) is fitted on what runs from then on.

Without a CUDA device it says so and runs nothing (exit status 2).  Everything fits in well under 8 minutes.

    python bench/gpu_check.py [--seconds 10] [--repeats 3] [--batch 1024]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import default_collate

from kale_dagster.stream.samples import GroundTruth, encode
from kale_dagster.trainer.api import Record, TrainerContext, load_factory
from kale_dagster.trainer.collective import to_device

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "demand_forecaster" / "src"))


def ctr_records(n: int) -> list[bytes]:
    return encode(GroundTruth().sample(n, np.random.default_rng(0)))


def demand_records(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [
        json.dumps(
            {"store": int(rng.integers(0, 50)), "hour": float(h % 24), "temp_c": float(rng.normal(15, 8)),
             "demand": float(rng.gamma(4, 5))}
        ).encode()
        for h in range(n)
    ]  # fmt: skip


TRAINERS = {
    "ctr (kale_dagster.trainer.ctr)": ("kale_dagster.trainer.ctr:make_trainer", ctr_records),
    "demand forecaster (examples/)": ("demand_forecaster.train:make_trainer", demand_records),
}


def samples_per_s(factory: str, values: list[bytes], device: torch.device, batch: int, seconds: float) -> float:
    """One rank's training rate on ``device``: the harness's step without the collective (world of one)."""
    trainer = load_factory(factory)(TrainerContext(rank=0, world_size=1, device=device, pipeline="gpu", options={}))
    trainer.model.to(device)
    samples = [s for i, v in enumerate(values) for s in trainer.decode(Record(v, None, None, 0, i))]
    collate = trainer.collate or (lambda items: to_device(default_collate(items), device))
    done, start, k = 0, time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        chunk = samples[k : k + batch] if k + batch <= len(samples) else samples[:batch]
        k = (k + batch) % max(len(samples) - batch, 1)
        trainer.optimizer.zero_grad(set_to_none=True)
        out = trainer.loss(trainer.model, collate(chunk))
        (out[0] if isinstance(out, tuple) else out).backward()
        trainer.optimizer.step()
        done += len(chunk)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return done / (time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="the gpu tests, then F(1) of both example trainers on the GPU")
    parser.add_argument("--seconds", type=float, default=10.0, help="each timed window")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows per trainer and device (median)")
    parser.add_argument("--batch", type=int, default=1024, help="samples per step")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            f"no GPU: torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False, CUDA build "
            f"{torch.version.cuda or 'none'}); nothing was run"
        )
        return 2
    gpu = torch.device("cuda", 0)
    print(f"GPU: {torch.cuda.get_device_name(gpu)} x{torch.cuda.device_count()}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")  # pyright: ignore  # fmt: skip
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:randomly", "tests/test_gpu.py"],
        cwd=ROOT,
        timeout=300,
    )
    print(f"\ngpu tests: {'passed' if tests.returncode == 0 else f'FAILED (exit {tests.returncode})'}\n")
    print(f"| trainer | F(1) on the GPU (samples/s) | on the CPU | GPU / CPU |  (batch {args.batch}, median of "
          f"{args.repeats} x {args.seconds:g} s)")  # fmt: skip
    print("|---|---|---|---|")
    for name, (factory, records) in TRAINERS.items():
        values = records(20_000)
        rates = {
            device.type: statistics.median(
                samples_per_s(factory, values, device, args.batch, args.seconds) for _ in range(args.repeats)
            )
            for device in (gpu, torch.device("cpu"))
        }
        print(f"| {name} | {rates['cuda']:,.0f} | {rates['cpu']:,.0f} | {rates['cuda'] / rates['cpu']:.1f}x |")
    return tests.returncode


if __name__ == "__main__":
    sys.exit(main())
