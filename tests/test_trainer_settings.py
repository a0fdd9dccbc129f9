"""One spec of a worker's settings: the flags a launcher writes are the flags the worker reads back, rule for rule."""

from __future__ import annotations

import dataclasses

import pytest

from kale_dagster.errors import KaleConfigError
from kale_dagster.rules import flag, rule_of
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.api import TrainerSpec
from kale_dagster.trainer.settings import TrainerSettings, worker_parser
from kale_dagster.trainer.worker import parse_args

SOURCE = KafkaSource("127.0.0.1:9092", ("samples",), "ctr")


@pytest.mark.parametrize(
    "settings",
    [
        TrainerSettings(SOURCE, "/ckpt"),
        TrainerSettings(
            SOURCE,
            "/ckpt",
            batch_size=64,
            emulate_gpu_rate=250.0,
            emulate_restore_s=480.0,
            keep=5,
            balance="round-robin",
            max_queue=4096,
            high_watermark=1024,
            low_watermark=8,
            collective_timeout_s=30.0,
            trained_log="/tmp/trained",
            trainer=TrainerSpec("user_trainers:batchnorm", {"lr": 0.5}),
            pipeline="ctr",
        ),
    ],
    ids=["defaults", "every field set"],
)
def test_the_flags_a_launcher_writes_read_back_as_the_same_settings(settings):
    assert TrainerSettings.from_args(worker_parser().parse_args(settings.argv())) == settings


def test_every_ruled_setting_is_a_flag_of_the_worker():
    flags = {a.dest for a in worker_parser()._actions}
    assert {f.name for f in dataclasses.fields(TrainerSettings) if rule_of(f) is not None} <= flags


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--batch-size", "0"], "--batch-size: must be >= 1"),
        (["--balance", "fastest"], "--balance"),
        (["--low-watermark", "900"], "--high-watermark: must be above low_watermark"),
        # Never a local folder named "hdfs:" (the later flag wins in argparse).
        (
            ["--checkpoint-dir", "hdfs://nn/ckpt"],
            "--checkpoint-dir: 'hdfs://nn/ckpt' must be a path (a shared volume) or",
        ),
        (["--checkpoint-dir", "s3://"], "s3://bucket/prefix, gs://bucket/prefix or az://container/prefix"),
    ],
)
def test_a_bad_worker_flag_is_one_error_naming_it(capsys, extra, says):
    with pytest.raises(SystemExit) as exc:
        parse_args([*TrainerSettings(SOURCE, "/ckpt").argv(), *extra])
    assert exc.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize(
    "location, refusal",
    [
        ("/mnt/ckpt", None),
        ("ckpt", None),
        ("s3://bucket/prefix", None),
        ("gs://bucket", None),
        ("az://container/a/b", None),
        ("abfss://container/p", None),
        ("S3://bucket/p", "must be a path"),
        ("file:///tmp/x", "must be a path"),
        ("s3:/bucket", None),  # a relative path: the folder "s3:", as the user typed it
        ("", "must be a path"),
    ],
)
def test_a_checkpoint_location_is_a_path_or_a_known_store(location, refusal):
    if refusal is None:
        assert TrainerSettings(SOURCE, location).checkpoint_dir == location
        return
    with pytest.raises(KaleConfigError, match=refusal):
        TrainerSettings(SOURCE, location)


def test_a_store_whose_package_is_missing_is_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    from kale_dagster.trainer.checkpoint import CheckpointStore
    from kale_dagster.trainer.location import require_store

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gcsfs" else real(name, *a))
    with pytest.raises(KaleConfigError) as err:
        CheckpointStore("gs://bucket/ckpt")
    assert str(err.value) == (
        "checkpoint_dir: gs:// needs gcsfs, which is not installed: pip install 'kale-dagster[gcs]'"
    )
    require_store("/a/path")  # a path needs nothing
    with pytest.raises(KaleConfigError, match=r"unknown scheme hdfs://"):
        require_store("hdfs://nn/ckpt")


def test_flags_are_named_after_their_fields():
    assert flag("collective_timeout_s") == "--collective-timeout-s"
