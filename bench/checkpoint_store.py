"""Checkpoint and restore times of a 200 MB model: on local disk, and in an S3-protocol bucket served on loopback.

Each run writes a checkpoint (``torch.save``, SHA-256, the data then its manifest, fsynced on disk) and restores
it in a new ``CheckpointStore`` (as the next group does: list, read the manifest, read and check the data,
``torch.load``).  The bucket is moto's server mode (PyPI ``moto[server]``, in memory) on a loopback port, with
``s3fs``: a real S3 protocol path, but not a cloud's network or throughput.  Medians of ``--runs``; the bucket's
figures as ratios to the disk's, measured in the same run.

    pip install 'kale-dagster[s3]' 'moto[server]'
    python bench/checkpoint_store.py [--megabytes 200] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time

import torch

from kale_dagster.stream.broker import free_loopback_port
from kale_dagster.trainer.checkpoint import CheckpointStore

BUCKET = "bench-checkpoints"


def _model(megabytes: int) -> dict:
    """A state of ``megabytes`` MB of float32 weights, in layers of 8 MB or less, as a model's state_dict is."""
    layers, left = {}, megabytes * 2**20 // 4
    while left:
        n = min(left, 2 * 2**20)
        layers[f"layer{len(layers)}.weight"] = torch.randn(n)
        left -= n
    return {"step": 1, "model": layers}


def _timed(store_of, state: dict, runs: int) -> tuple[float, float]:
    """Median seconds to checkpoint and to restore, each restore from a new store."""
    saves, restores = [], []
    for step in range(1, runs + 1):
        started = time.perf_counter()
        store_of().save(step, state, keep=2)
        saves.append(time.perf_counter() - started)
        started = time.perf_counter()
        restored = store_of().load_latest()
        restores.append(time.perf_counter() - started)
        assert restored is not None and restored["step"] == state["step"]
    return statistics.median(saves), statistics.median(restores)


def _s3_server() -> tuple[subprocess.Popen, str]:
    import boto3

    port = free_loopback_port()
    server = subprocess.Popen(
        ["moto_server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench", region_name="us-east-1"
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            client.create_bucket(Bucket=BUCKET)
            return server, endpoint
        except Exception:
            if time.monotonic() > deadline:
                server.kill()
                raise
            time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    state = _model(args.megabytes)
    server, endpoint = _s3_server()
    options = {
        "endpoint_url": endpoint,
        "key": "bench",
        "secret": "bench",
        "client_kwargs": {"region_name": "us-east-1"},
    }
    try:
        with tempfile.TemporaryDirectory(prefix="kale-ckpt-bench-") as folder:
            disk = _timed(lambda: CheckpointStore(folder), state, args.runs)
        bucket = _timed(lambda: CheckpointStore(f"s3://{BUCKET}/pipeline", options), state, args.runs)
    finally:
        server.kill()
        server.wait()
    print(f"checkpoint of a {args.megabytes} MB model, median of {args.runs} runs")
    print("| where | checkpoint | restore |")
    print("|---|---|---|")
    print(f"| local disk (fsync) | {disk[0]:.2f} s | {disk[1]:.2f} s |")
    print(f"| S3 bucket (moto on loopback) | {bucket[0]:.2f} s | {bucket[1]:.2f} s |")
    print(f"| bucket / disk | {bucket[0] / disk[0]:.1f}x | {bucket[1] / disk[1]:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
