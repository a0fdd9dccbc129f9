"""Checkpoints in object storage, against a real S3-protocol server started on loopback (moto's server mode): a
checkpoint is restored only when whole, whatever happened to the upload."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import torch

from kale_dagster.trainer.checkpoint import CheckpointStore, CheckpointWriteError
from support import S3_BUCKET as BUCKET
from support import wait_for

pytest.importorskip("s3fs")
pytestmark = pytest.mark.integration


def _store(endpoint: str, timeout_s: float = 60.0) -> CheckpointStore:
    # What a deployment leaves to the environment (keys, endpoint); short timeouts so a stopped server fails fast.
    options = {
        "endpoint_url": endpoint,
        "key": "test",
        "secret": "test",
        "client_kwargs": {"region_name": "us-east-1"},
        "config_kwargs": {"read_timeout": 2, "connect_timeout": 2, "retries": {"max_attempts": 1}},
        "skip_instance_cache": True,
    }
    return CheckpointStore(f"s3://{BUCKET}/pipeline", options, timeout_s=timeout_s)


def test_checkpoints_round_trip_and_are_pruned_in_the_bucket(s3_server):
    _, endpoint, client = s3_server
    store = _store(endpoint)
    assert store.load_latest() is None
    for step in (1, 2, 3):
        store.save(step, {"step": step, "w": torch.full((100,), float(step))}, keep=2)
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"])
    assert keys == [f"pipeline/ckpt-00000000000{s}.{ext}" for s in (2, 3) for ext in ("json", "pt")]
    restored = _store(endpoint).load_latest()  # another process: what the next group restores
    assert restored is not None and restored["step"] == 3 and torch.equal(restored["w"], torch.full((100,), 3.0))


def test_data_without_its_manifest_or_not_matching_it_is_never_restored(s3_server):
    _, endpoint, client = s3_server
    store = _store(endpoint)
    store.save(1, {"step": 1})
    # An upload whose manifest never came, and a newer checkpoint whose data was replaced after its manifest.
    client.put_object(Bucket=BUCKET, Key="pipeline/ckpt-000000000005.pt", Body=b"\x80\x02whole, but no manifest")
    store.save(3, {"step": 3})
    client.put_object(Bucket=BUCKET, Key="pipeline/ckpt-000000000003.pt", Body=b"not what the manifest says")
    assert [c.step for c in store.checkpoints()] == [1, 3]
    assert store.load_latest() == {"step": 1}


def test_the_local_launcher_keeps_its_logs_here_never_in_a_folder_named_after_the_url(tmp_path, monkeypatch):
    from kale_dagster.launchers.local import LocalLauncher
    from kale_dagster.stream.source import KafkaSource
    from kale_dagster.trainer.settings import TrainerSettings

    monkeypatch.chdir(tmp_path)
    source = KafkaSource(bootstrap_servers="127.0.0.1:9092", topics=("samples",), group_id="g")
    launcher = LocalLauncher(TrainerSettings(source, "s3://checkpoints/pipeline"), pool_size=0)
    try:
        assert sorted(p.name for p in tmp_path.iterdir()) == [".kale"]
        assert (tmp_path / ".kale" / "worker-logs").is_dir()
    finally:
        launcher.stop()


def test_a_server_stopped_mid_upload_fails_the_write_in_time_and_the_last_checkpoint_stays(s3_server):
    server, endpoint, client = s3_server
    store = _store(endpoint, timeout_s=5.0)
    store.save(1, {"step": 1, "w": torch.ones(10)})
    big = {"step": 2, "w": torch.zeros(110 * 2**20 // 4)}  # 110 MB: a multipart upload of three parts

    def stop_once_uploading():  # the server stops once the upload has begun: its parts are on their way
        wait_for(lambda: client.list_multipart_uploads(Bucket=BUCKET).get("Uploads"), 60, "the upload", poll_s=0.02)
        server.send_signal(signal.SIGSTOP)

    stopper = threading.Thread(target=stop_once_uploading)
    stopper.start()
    started = time.monotonic()
    with pytest.raises(CheckpointWriteError) as err:
        store.save(2, big)
    failed_after = time.monotonic() - started
    stopper.join()
    assert str(err.value) == (
        "could not write checkpoint ckpt-000000000002.pt to s3://checkpoints/pipeline: TimeoutError: no answer from "
        "the store within 5 s; ckpt-000000000001.pt stays the latest"
    )
    assert failed_after < 30  # the deadline, not the client's retries, ends the wait

    server.send_signal(signal.SIGCONT)  # the server is back, with the upload it never completed
    restored = _store(endpoint).load_latest()
    assert restored is not None and restored["step"] == 1 and torch.equal(restored["w"], torch.ones(10))
    assert [c.step for c in store.checkpoints()] == [1]
    store.save(3, {"step": 3})  # checkpointing goes on where it stopped
    assert _store(endpoint).load_latest() == {"step": 3}
