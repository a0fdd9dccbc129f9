"""Cold start of a trainer worker process: importing the worker module against importing torch alone.

A standby worker is a fresh Python process that imports ``kale_dagster.trainer.worker``
before it can join a group; everything it imports beyond torch is start-up cost the
package root could load lazily.  Measured in fresh interpreters, interleaved, medians.

    python bench/worker_startup.py [--runs 9]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def wall(statement: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    torch_s, worker_s = [], []
    for _ in range(args.runs):
        torch_s.append(wall("import torch"))
        worker_s.append(wall("import kale_dagster.trainer.worker"))
    t, w = statistics.median(torch_s), statistics.median(worker_s)
    print(
        f"import torch: median {t:.2f} s; import kale_dagster.trainer.worker: median {w:.2f} s "
        f"({w / t:.2f}x torch alone, +{w - t:.2f} s) over {args.runs} interleaved runs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
