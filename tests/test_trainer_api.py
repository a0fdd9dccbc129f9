"""The trainer plug-in API without processes: import paths, what a factory must return, the sample queue, the
metrics and the Lightning adapter.  Table tests say success or failure per row."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from kale_dagster import KafkaSource, KaleConfigError, OnlineTrainingPipeline
from kale_dagster.trainer import OnlineTrainer, Record, RollingAUC, RollingMAE, TrainerContext, TrainerSpec
from kale_dagster.trainer.api import TrainerFailure, check_trainer, load_factory, trainer_path_problem
from kale_dagster.trainer.ctr import make_trainer
from kale_dagster.trainer.lightning import from_lightning
from kale_dagster.trainer.sample_queue import ORIGIN, SampleQueue, Samples

sys.path.insert(0, str(Path(__file__).parent))
SOURCE = KafkaSource("127.0.0.1:9092", ("samples",), "ctr")
CTX = TrainerContext(rank=0, world_size=1, device=torch.device("cpu"), pipeline="ctr")


@pytest.mark.parametrize(
    "path, says",
    [
        ("kale_dagster.trainer.ctr:make_trainer", None),
        ("user_trainers:raising", None),  # resolves: it fails when called, in the worker
        ("no_such_package.train:make", "no module 'no_such_package'"),
        ("kale_dagster.trainer.ctr:no_such_factory", "has no 'no_such_factory'"),
        ("user_trainers:NOT_A_FACTORY", "is a int, not a function"),
        ("user_trainers", "must be an import path"),
        ("user trainers:make", "must be an import path"),
        (":make", "must be an import path"),
    ],
)
def test_import_paths(path, says):
    problem = trainer_path_problem(path)
    if says is None:
        assert problem is None
        assert callable(load_factory(path))
        return
    assert problem is not None and problem.field == "trainer" and says in problem.problem, problem


def test_a_pipeline_refuses_a_trainer_that_does_not_resolve_when_definitions_load():
    with pytest.raises(KaleConfigError, match="trainer: .*no module 'mypkg'"):
        OnlineTrainingPipeline(name="ctr", source=SOURCE, trainer="mypkg.train:make_trainer")
    with pytest.raises(KaleConfigError, match="trainer_options: must be JSON"):
        OnlineTrainingPipeline(name="ctr", source=SOURCE, trainer_options={"lr": float("nan")})
    p = OnlineTrainingPipeline(name="ctr", source=SOURCE, trainer="user_trainers:with_state", trainer_options={"a": 1})
    assert p.trainer_spec == TrainerSpec("user_trainers:with_state", {"a": 1})
    assert p.trainer_spec.argv("ctr")[:4] == ["--trainer", "user_trainers:with_state", "--trainer-options", '{"a": 1}']


def test_what_a_factory_returns_is_checked_naming_the_factory():
    with pytest.raises(TrainerFailure, match="user_trainers:wrong_type returned a dict, not a kale_dagster.Online"):
        check_trainer(load_factory("user_trainers:wrong_type")(CTX), "user_trainers:wrong_type")
    broken = make_trainer(CTX)
    broken.optimizer, broken.metric = "adam", object()
    with pytest.raises(TrainerFailure, match="optimizer is a str, expected a torch.optim.Optimizer; metric is a"):
        check_trainer(broken, "mine:make")
    assert check_trainer(make_trainer(CTX), "ctr") is not None


def _samples(partition: int, offsets: list[int]) -> Samples:
    origin = np.array([(partition, o, 0) for o in offsets], dtype=ORIGIN)
    return Samples([f"p{partition}o{o}" for o in offsets], origin)


def test_the_sample_queue_keeps_origins_beside_the_users_objects():
    queue = SampleQueue()
    queue.add_own(_samples(0, [5, 6, 7, 8]))
    queue.add_forwarded(Samples.from_bytes(_samples(1, [3, 4]).to_bytes()))  # as a transfer from another rank
    assert len(queue) == 6 and queue.min_offsets() == {0: 5, 1: 3}
    given = queue.give_own(1)
    assert given.items == ["p0o5"] and given.origin["offset"].tolist() == [5]
    holes = queue.take_through({0: 7, 1: 3})
    assert holes.items == ["p1o3", "p0o6", "p0o7"]
    taken = queue.take(10)
    assert taken.items == ["p1o4", "p0o8"] and len(queue) == 0 and queue.min_offsets() == {}


def test_progressive_metrics():
    auc = RollingAUC(targets=lambda b: b, window=100)
    auc.update(torch.tensor([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1]))
    assert auc.value() == pytest.approx(0.75)
    mae = RollingMAE(targets=lambda b: b["y"], window=2)
    assert math.isnan(mae.value())
    mae.update(torch.tensor([1.0, 2.0, 4.0]), {"y": [1.0, 1.0, 1.0]})  # the window keeps the last two
    assert mae.value() == pytest.approx(2.0)


class LitRegressor(nn.Module):
    """Shaped as a LightningModule: training_step and configure_optimizers (Lightning is not installed)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        predicted = self.layer(batch["x"]).squeeze(1)
        return {"loss": nn.functional.mse_loss(predicted, batch["y"]), "predictions": predicted.detach()}

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 10)}}


def test_a_lightning_module_plugs_in_as_it_is():
    module = LitRegressor()
    trainer = from_lightning(module, decode=lambda r: [r.value], metric=RollingMAE(targets=lambda b: b["y"]))
    check_trainer(trainer, "lit")
    assert isinstance(trainer, OnlineTrainer) and trainer.scheduler is not None
    batch = {"x": torch.ones(4, 2), "y": torch.zeros(4)}
    value, predictions = trainer.loss(module, batch)
    assert value.shape == () and predictions.shape == (4,)
    assert trainer.decode(Record(b"v", None, None, 0, 0)) == [b"v"]


@pytest.mark.parametrize(
    "options, says",
    [
        ({"lr": 0.01, "layers": [64, 32], "name": "x"}, None),
        ({"lr": float("inf")}, "must be JSON"),
        ({"when": object()}, "must be JSON"),
        ({"db_password": "hunter2"}, "db_password look like credentials"),
        ({"API_KEY": "k", "hf_token": "t"}, "API_KEY, hf_token look like credentials"),
        ({"blob": "x" * 20_000}, "at most 16 KB"),
    ],
)
def test_trainer_options(options, says):
    if says is None:
        assert TrainerSpec(trainer_options=options).trainer_options == options
        return
    with pytest.raises(KaleConfigError, match=says) as err:
        TrainerSpec(trainer_options=options)
    assert "hunter2" not in str(err.value)


def test_kale_trainer_serve_refuses_a_trainer_that_does_not_resolve_in_one_line(tmp_path):
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "kale_dagster.cli", "trainer", "serve", "--topic", "t", "--group-id", "g"]
        + ["--checkpoint-dir", str(tmp_path), "--trainer", "mypkg.train:make_trainer"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--trainer: mypkg.train:make_trainer: no module 'mypkg'" in done.stderr
    assert not (tmp_path / "logs").exists()  # no worker was started


def _rank_inputs(rank: int) -> torch.Tensor:
    x = torch.full((3, 2), float(rank * 10))  # the ranks see very different data
    x[:, 1] += torch.arange(3.0)
    return x


def _step_two_ranks(rank: int, store_path: str, out: str) -> None:
    """One rank of a two-rank gloo group: one train step of the BatchNorm trainer on this rank's own data."""
    import argparse

    import torch.distributed as dist

    from kale_dagster.trainer.harness import Worker

    sys.path.insert(0, str(Path(__file__).parent))
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    worker = Worker(
        argparse.Namespace(
            trainer="user_trainers:batchnorm",
            pipeline="bn",
            trainer_options="{}",
            checkpoint_dir=str(Path(out).parent / "ckpt"),
            checkpoint_timeout_s=60.0,
        )
    )
    worker.rank, worker.world = rank, 2
    worker.trainer = worker._build_trainer()
    x = _rank_inputs(rank)
    batch = Samples([(x[i], torch.tensor(float(rank))) for i in range(3)], np.zeros(3, dtype=ORIGIN))
    worker.train_step(batch, global_n=6, step=0)
    torch.save(worker.trainer.model.state_dict(), f"{out}.{rank}")
    dist.destroy_process_group()


def test_every_rank_keeps_one_model_buffers_included(tmp_path):
    """After a step on different data, both ranks hold the same parameters and the same BatchNorm running
    statistics (the mean of the ranks'), and the same num_batches_tracked."""
    code = "import sys; from test_trainer_api import _step_two_ranks as step; step(int(sys.argv[1]), *sys.argv[2:])"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(rank), str(tmp_path / "store"), str(tmp_path / "state")],
            cwd=Path(__file__).parent,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
            },
        )
        for rank in (0, 1)
    ]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    first, second = (torch.load(tmp_path / f"state.{rank}") for rank in (0, 1))
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
    assert first["1.num_batches_tracked"].item() == 1
    # rank 0's inputs sit near 0 and rank 1's near 10: the shared running statistics are the mean of what each
    # rank's forward pass alone would have kept (a sum, or either rank's own, differs).
    import user_trainers

    alone = []
    for rank in (0, 1):
        model = user_trainers.batchnorm(None).model  # the same initial weights (seed 0) as each rank's
        model.train()
        model(_rank_inputs(rank))
        alone.append({k: v.clone() for k, v in model[1].state_dict().items()})
    assert not torch.allclose(alone[0]["running_mean"], alone[1]["running_mean"])
    for stat in ("running_mean", "running_var"):
        expected = (alone[0][stat] + alone[1][stat]) / 2
        assert torch.allclose(first[f"1.{stat}"], expected, atol=1e-6), (stat, first[f"1.{stat}"], expected)


@pytest.mark.parametrize(
    "cuda, local_rank, rank, device",
    [
        (False, None, 3, "cpu"),
        (True, "2", 0, "cuda:2"),  # under torchrun (a pod of several workers): the GPU of its local rank
        (True, None, 5, "cuda:1"),  # a local launcher's worker on a 4-GPU host: the GPU of its rank
        (True, None, 0, "cuda:0"),
    ],
)
def test_each_worker_takes_a_gpu_of_its_own(monkeypatch, cuda, local_rank, rank, device):
    import torch

    from kale_dagster.trainer.harness import device_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert str(device_for(rank)) == device
