"""Shared fixtures: a real embedded broker per test, and a guard against leaked processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kale_dagster.stream.broker import embedded_broker

FIXTURES = Path(__file__).parent / "fixtures"


def _descendants(pid: int) -> set[int]:
    """PIDs of all live descendants of ``pid``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 is the parent PID; the command name in field 2 may hold spaces.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


@pytest.fixture(scope="session", autouse=True)
def no_leaked_processes():
    """Fail the run if any test left a child process (broker, worker, dagster) behind."""
    before = _descendants(os.getpid())
    yield
    leaked = _descendants(os.getpid()) - before
    details = []
    for pid in sorted(leaked):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            details.append(f"{pid}: {cmdline[:200]}")
        except OSError:
            pass
    assert not details, "processes left behind by the test suite:\n" + "\n".join(details)


@pytest.fixture
def kafka_broker():
    """A fresh, empty Tansu broker on a free loopback port, stopped after the test."""
    with embedded_broker() as broker:
        yield broker
