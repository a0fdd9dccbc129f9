"""The fault table: run the fault-injection tests (pytest marker ``faults``) and print what each measured.

Each test injects one fault into the running system (embedded broker, torch workers, the metrics sensor
against a Dagster instance, the metrics history, the mocked Kubernetes API) and records a row: how many
times the fault was injected, whether every check held, samples produced / trained / lost / duplicated
where training was involved, and the time from the fault's end to recovery.

    python bench/faults.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("fault", "injected", "survived", "produced", "trained", "lost", "duplicated", "recovery_s")


def main() -> int:
    table = ROOT / "artifacts" / "faults.json"
    table.unlink(missing_ok=True)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "faults", "-p", "no:cacheprovider"], cwd=ROOT)
    if not table.exists():
        print("no fault table was written", file=sys.stderr)
        return 1
    rows = json.loads(table.read_text())
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        cells = [
            "-"
            if row[c] is None
            else ("yes" if row[c] == 1 else "NO")
            if c == "survived"
            else f"{row[c]:,}"
            if isinstance(row[c], int)
            else str(row[c])
            for c in COLUMNS
        ]
        print("| " + " | ".join(cells) + " |")
    survived = sum(row["survived"] == 1 for row in rows)
    print(f"\n{survived} of {len(rows)} faults survived; samples lost in all: {sum(row['lost'] or 0 for row in rows)}")
    return run.returncode


if __name__ == "__main__":
    raise SystemExit(main())
