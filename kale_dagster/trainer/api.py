"""The trainer plug-in API: what a user writes so that Kale scales their own online-training job.

The user writes a *factory*, named by import path (``mypkg.train:make_trainer``).  Each worker process calls
it with a :class:`TrainerContext` every time it joins a group, and gets back an :class:`OnlineTrainer`: the
model, its optimizer, how a Kafka record becomes samples, and the loss of a batch.  The harness
(``kale_dagster.trainer.worker``) keeps everything else: consumption, partition balancing and forwarding,
arrival order, the backward pass and the gradient average over the group, atomic checkpoints of model,
optimizer, user state and offsets together, offset commits, warm standbys and the rescale protocol.  The
user's code never touches an offset, a checkpoint or a process group.

Why a dataclass the factory fills in, not a base class to subclass: a training loop the user already has
splits into these parts without being rewritten, and a part that is not given has a default
(``collate``: torch's ``default_collate``; no scheduler, metric or extra state).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

from kale_dagster.errors import KaleConfigError
from kale_dagster.rules import check, need, setting

#: The built-in CTR demo trainer: the default of every pipeline that names none.
DEFAULT_TRAINER = "kale_dagster.trainer.ctr:make_trainer"
#: What an import path looks like: dotted module, a colon, a dotted attribute.
TRAINER_PATTERN = r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*"


def trainer_field() -> Any:
    """The declared ``trainer`` field of a pipeline and of the trainer's settings: one rule for both."""
    return setting(
        DEFAULT_TRAINER,
        pattern=TRAINER_PATTERN,
        hint="must be an import path like mypkg.train:make_trainer",
        description="the trainer factory, module:attribute (default: the built-in CTR demo trainer)",
    )


def trainer_options_field() -> Any:
    return setting(default_factory=dict, description="JSON-able options passed to the trainer factory")


_SECRET_KEY = re.compile(r"password|secret|token|credential|api_?key", re.IGNORECASE)


def options_problem(options: Mapping) -> KaleConfigError | None:
    """Options reach every worker as JSON on its command line (and in a Job's manifest): they must survive
    that, and hold nothing secret."""
    try:
        text = json.dumps(dict(options), allow_nan=False)
    except (TypeError, ValueError) as exc:
        return KaleConfigError("trainer_options", f"must be JSON (strings, numbers, lists, mappings): {exc}")
    secret = sorted(str(k) for k in options if _SECRET_KEY.search(str(k)))
    if secret:
        return KaleConfigError(
            "trainer_options",
            f"{', '.join(secret)} look like credentials, which would be visible on command lines and in manifests: "
            "read them from the environment in your factory (a Kubernetes Secret, kafka_secret's envFrom)",
        )
    return need(len(text) <= 16_384, "trainer_options", "must be at most 16 KB as JSON")


@dataclass(frozen=True)
class TrainerSpec:
    """Which trainer the workers run: the factory's import path and its options, as declared on a pipeline."""

    trainer: str = trainer_field()
    trainer_options: Mapping = trainer_options_field()

    def __post_init__(self):
        check(self, lambda: options_problem(self.trainer_options))

    def argv(self, pipeline: str) -> list[str]:
        """The worker's flags that name its trainer."""
        return [
            "--trainer",
            self.trainer,
            "--trainer-options",
            json.dumps(dict(self.trainer_options), sort_keys=True),
            "--pipeline",
            pipeline,
        ]


@dataclass(frozen=True)
class Record:
    """One Kafka record, as ``decode`` sees it.  ``timestamp_ms`` is None when the record carries no usable time
    (``kale_dagster.stream.record_time``); ``partition`` and ``offset`` are for error messages, not bookkeeping;
    ``topic`` tells a source's topics apart, when their records differ."""

    value: bytes | None
    key: bytes | None
    timestamp_ms: int | None
    partition: int
    offset: int
    topic: str = ""


@dataclass(frozen=True)
class TrainerContext:
    """What the factory is told: where it runs, and the pipeline's ``trainer_options``."""

    rank: int
    world_size: int
    device: Any  # torch.device: typed loosely so that this module imports without torch
    pipeline: str
    options: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class ProgressiveMetric(Protocol):
    """A quality metric scored on each batch *before* it is trained on (progressive validation): in online
    training every sample is a test sample first.  ``update`` sees the predictions ``loss`` returned with the
    loss, and the batch; ``value`` is reported in every metrics event (NaN while undefined)."""

    name: str

    def update(self, predictions: Any, batch: Any) -> None: ...

    def value(self) -> float: ...


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...


@dataclass
class OnlineTrainer:
    """The parts of a training loop that are the user's.

    * ``model``: a ``torch.nn.Module``; the harness moves it to the worker's device.
    * ``optimizer``: over the model's parameters (build it after the model, on any device: the harness moves
      the model before the first step, and restores both from the checkpoint).
    * ``decode(record)``: zero or more samples from one :class:`Record`.  Raise ``ValueError`` for a record
      that is not a sample (a poison record): it is skipped and counted, never retried.
    * ``loss(model, batch)``: the forward pass only, returning the mean loss over the batch, or
      ``(loss, predictions)`` for the ``metric``.  The harness runs the backward pass, averages gradients
      over the group (each sample weighs the same, whatever each worker's share) and steps the optimizer.
      A loss that is not finite stops the group before the step: nothing is checkpointed or committed past it.
    * ``collate(samples)``: a batch on ``device`` from a list of samples (default: ``default_collate``, then
      moved to the device).
    * ``scheduler``: stepped after every optimizer step.
    * ``state``: anything else to checkpoint with the model (``state_dict`` / ``load_state_dict``).
    * ``metric``: a :class:`ProgressiveMetric`.
    """

    model: Any  # torch.nn.Module
    optimizer: Any  # torch.optim.Optimizer
    decode: Callable[[Record], Iterable[Any]]
    loss: Callable[[Any, Any], Any]
    collate: Callable[[list], Any] | None = None
    scheduler: Any = None
    state: Stateful | None = None
    metric: ProgressiveMetric | None = None


TrainerFactory = Callable[[TrainerContext], OnlineTrainer]


def _parts(path: str) -> tuple[str, str]:
    if not isinstance(path, str) or not re.fullmatch(TRAINER_PATTERN, path):
        raise KaleConfigError("trainer", f"must be an import path like mypkg.train:make_trainer, got {path!r}")
    module, _, attr = path.partition(":")
    return module, attr


class _MissingDependency(KaleConfigError):
    """The factory's module is there but imports a package this environment lacks."""


def load_factory(path: str) -> TrainerFactory:
    """The factory at ``path`` (``module:attribute``), imported; a clear error naming what does not resolve."""
    module_name, attr = _parts(path)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if missing == module_name or module_name.startswith(f"{missing}."):
            raise KaleConfigError(
                "trainer", f"{path}: no module {missing!r} on this Python's path; install the package that has it"
            ) from None
        raise _MissingDependency(
            "trainer", f"{path}: {module_name} needs {missing!r}, which is not installed here"
        ) from None
    except Exception as exc:
        raise KaleConfigError(
            "trainer", f"{path}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    for name in attr.split("."):
        if not hasattr(obj, name):
            raise KaleConfigError("trainer", f"{path}: {module_name} has no {attr!r}")
        obj = getattr(obj, name)
    if not callable(obj):
        raise KaleConfigError("trainer", f"{path} is a {type(obj).__name__}, not a function of a TrainerContext")
    return cast(TrainerFactory, obj)


def trainer_path_problem(path: str) -> KaleConfigError | None:
    """Why ``path`` cannot be the trainer, judged where a pipeline is declared (the code server): a malformed
    path, a module that is not installed or fails to import, or an attribute that is not there.  A module that
    needs a package this environment lacks (torch, in a code server installed without the trainer extra)
    cannot be judged here, and is not refused: the workers, which have it, report it then."""
    try:
        load_factory(path)
    except _MissingDependency:
        return None
    except KaleConfigError as exc:
        return exc
    return None


class TrainerFailure(RuntimeError):
    """The user's trainer failed in a way a restart would repeat (its factory raised, its loss is not finite,
    it returned the wrong thing): the group stops, and the launcher does not restart it."""


def check_trainer(trainer: Any, path: str) -> OnlineTrainer:
    """``trainer`` if it is an :class:`OnlineTrainer` with the parts the harness needs, else why not."""
    if not isinstance(trainer, OnlineTrainer):
        raise TrainerFailure(f"{path} returned a {type(trainer).__name__}, not a kale_dagster.OnlineTrainer")
    import torch

    wrong = [
        f"{name} is a {type(getattr(trainer, name)).__name__}, expected {kind}"
        for name, ok, kind in (
            ("model", isinstance(trainer.model, torch.nn.Module), "a torch.nn.Module"),
            ("optimizer", isinstance(trainer.optimizer, torch.optim.Optimizer), "a torch.optim.Optimizer"),
            ("decode", callable(trainer.decode), "a function of a Record"),
            ("loss", callable(trainer.loss), "a function of (model, batch)"),
            ("collate", trainer.collate is None or callable(trainer.collate), "a function of a list of samples"),
            ("state", trainer.state is None or isinstance(trainer.state, Stateful), "state_dict/load_state_dict"),
            ("metric", trainer.metric is None or isinstance(trainer.metric, ProgressiveMetric), "a ProgressiveMetric"),
        )
        if not ok
    ]
    if wrong:
        raise TrainerFailure(f"{path} returned an OnlineTrainer whose {'; '.join(wrong)}")
    return trainer
