"""On a CUDA device only: marked ``gpu`` (CI deselects the marker; ``bench/gpu_check.py`` runs them on a GPU
machine), and skipped where torch sees no CUDA device.  The worker's device and backend are the ones a GPU
cluster runs: CUDA and NCCL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch

from kale_dagster.stream.broker import free_loopback_port
from kale_dagster.stream.producer import ReplaySettings, replay
from kale_dagster.stream.samples import GroundTruth
from kale_dagster.trainer.api import TrainerContext
from kale_dagster.trainer.checkpoint import CheckpointStore, load_latest
from kale_dagster.trainer.ctr import make_trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.mark.integration
def test_a_worker_trains_on_cuda_with_nccl_at_one_rank(kafka_broker, tmp_path):
    servers = kafka_broker.bootstrap_servers
    history = pd.DataFrame({"timestamp": pd.date_range("2026-01-01", periods=2, freq="1min", tz="UTC"), "rate": 500.0})
    replay(servers, history, ReplaySettings(topic="gpu", partitions=2), max_wall_s=2)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1",
        f"--master-port={free_loopback_port()}", "-m", "kale_dagster.trainer.worker",
        "--bootstrap-servers", servers, "--topic", "gpu", "--group-id", "gpu",
        "--checkpoint-dir", str(tmp_path), "--checkpoint-every-s", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and load_latest(tmp_path) is None:
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert '"device": "cuda:0"' in out and '"backend": "nccl"' in out, err[-2000:]
    state = load_latest(tmp_path)
    assert state is not None and state["world"] == 1 and sum(state["offsets"].values()) > 0


def _trained_step(device: torch.device):
    """The demo trainer after one step on ``device``, on samples of the synthetic stream."""
    ctx = TrainerContext(rank=0, world_size=1, device=device, pipeline="gpu", options={})
    trainer = make_trainer(ctx)
    trainer.model.to(device)
    samples = GroundTruth().sample(512, np.random.default_rng(0))
    assert trainer.collate is not None
    loss, _ = trainer.loss(trainer.model, trainer.collate(list(samples)))
    loss.backward()
    trainer.optimizer.step()
    return trainer


def test_a_checkpoint_saved_on_the_gpu_restores_on_the_cpu_and_back(tmp_path):
    trained = _trained_step(torch.device("cuda", 0))
    store = CheckpointStore(str(tmp_path))
    store.save(1, {"model": trained.model.state_dict(), "optimizer": trained.optimizer.state_dict()})
    state = store.load_latest()
    assert state is not None and all(t.device.type == "cpu" for t in state["model"].values())
    on_cpu = make_trainer(TrainerContext(rank=0, world_size=1, device=torch.device("cpu"), pipeline="gpu", options={}))
    on_cpu.model.load_state_dict(state["model"])
    on_cpu.optimizer.load_state_dict(state["optimizer"])
    for name, tensor in trained.model.state_dict().items():
        assert torch.equal(on_cpu.model.state_dict()[name], tensor.cpu()), name
    back = on_cpu.model.to(torch.device("cuda", 0))
    for name, tensor in trained.model.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


@pytest.mark.integration
@pytest.mark.slow
def test_a_rescale_on_the_gpu_loses_and_repeats_nothing(kafka_broker, tmp_path):
    """As on the CPU (tests/test_trainer.py), with every worker on a GPU of its own and NCCL between them: one
    GPU allows a stop to zero and a restart from the checkpoint; more allow a group of 2 or 3 and back to 1."""
    from test_trainer import _rescale_after_training, _train_through

    gpus = torch.cuda.device_count()
    sizes = (0, 1) if gpus == 1 else (min(gpus, 3), 1)
    trained, produced, records = _train_through(
        kafka_broker,
        tmp_path,
        lambda launcher, done: _rescale_after_training(launcher, done, *sizes),
        produce_s=14,
        start=1,
    )
    assert [r.to_workers for r in records] == [1, *sizes]
    assert len(trained) == produced  # every sample exactly once
