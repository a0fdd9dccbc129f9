"""How fast the ``kale`` command answers: ``--help``, ``--version`` and ``status --help``, each the median of
``--repeats`` fresh processes, beside a bare ``python -c pass`` measured in the same run (the interpreter's own
start, which no lazy import can remove).  Target: ``kale --help`` and ``kale --version`` under 0.5 s.

    python bench/cli_startup.py --repeats 15
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "kale --help": [sys.executable, "-m", "kale_dagster.cli", "--help"],
    "kale --version": [sys.executable, "-m", "kale_dagster.cli", "--version"],
    "kale status --help": [sys.executable, "-m", "kale_dagster.cli", "status", "--help"],
}


def wall_s(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    for cmd in COMMANDS.values():  # one warm-up each: bytecode compiled, files in the page cache
        wall_s(cmd)
    medians = {}
    for _ in range(args.repeats):  # interleaved, so that a busy moment of the host falls on every command alike
        for name, cmd in COMMANDS.items():
            medians.setdefault(name, []).append(wall_s(cmd))
    base = statistics.median(medians["python -c pass"])
    for name, samples in medians.items():
        median = statistics.median(samples)
        print(f"{name:22s} median {median:.3f} s  ({median / base:.1f}x python -c pass)  over {len(samples)} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
