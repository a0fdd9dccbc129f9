"""A consumer group as Kafka's group APIs describe it: how many workers run, and whether it is rebalancing.

This is what advisory mode sees of a trainer Kale did not start.  Membership is not always a worker count,
and ``worker_count`` says how far it can be trusted:

* consumers that ``assign()`` their partitions never join a group (Kale's own workers are such consumers),
  so their group has no members;
* a group on Kafka 4's consumer protocol (KIP-848) is not visible to the classic DescribeGroups API;
* static members (``group.instance.id``) come back within the session timeout without a rebalance, which
  hides their restarts.

Where membership cannot tell, the count comes from a declared value, and the reason says so; an unknown
count is never read as 0 workers.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass

#: Group states in which the group is changing its membership: a restart (or a scale) is in progress.
REBALANCING = ("PreparingRebalance", "CompletingRebalance")


@dataclass(frozen=True)
class GroupView:
    """One DescribeGroups answer for a group, reduced to what sizing needs."""

    state: str  # Stable, PreparingRebalance, CompletingRebalance, Empty, Dead; "" when the group is unknown
    protocol_type: str  # "consumer" for a classic consumer group
    members: int
    consuming: int | None  # members whose assignment holds one of the topics; None when assignments are unreadable
    static: int  # members with a group.instance.id


def view_of(description: dict, topics: Sequence[str]) -> GroupView:
    """A kafka-python ``describe_groups`` entry as a ``GroupView``."""
    members = description.get("members") or []
    assignments = [m.get("member_assignment") for m in members]
    readable = [a for a in assignments if a]
    consuming = None
    if readable and len(readable) == len(members):
        consuming = sum(1 for a in readable if any(t in _assigned_topics(a) for t in topics))
    return GroupView(
        state=str(description.get("group_state") or ""),
        protocol_type=str(description.get("protocol_type") or ""),
        members=len(members),
        consuming=consuming,
        static=sum(1 for m in members if m.get("group_instance_id")),
    )


def _assigned_topics(assignment) -> set[str]:
    """The topics of a decoded ConsumerProtocolAssignment (kafka-python returns an object or a dict)."""
    partitions = getattr(assignment, "assigned_partitions", None)
    if partitions is None and isinstance(assignment, dict):
        partitions = assignment.get("assigned_partitions")
    out = set()
    for entry in partitions or ():
        topic = entry[0] if isinstance(entry, (tuple, list)) else getattr(entry, "topic", None)
        if topic is not None:
            out.add(topic)
    return out


def worker_count(view: GroupView | None, declared: int | None) -> tuple[int | None, str]:
    """(workers, how they were observed), or (None, why the count is unknown).  Pure: table-tested."""
    fallback = f"; the declared {declared} workers are used" if declared else ""
    if view is None or not view.state or view.state == "Dead":
        why = "the group is not known to the classic group API (a KIP-848 group, or none by this id)"
        return (declared, f"{why}{fallback}") if declared else (None, f"{why}: declare the launcher's workers")
    if view.members == 0:
        why = "the group has no members (consumers that assign() partitions never join one)"
        return (declared, f"{why}{fallback}") if declared else (None, f"{why}: declare the launcher's workers")
    counted = view.consuming if view.consuming is not None else view.members
    how = (
        f"{counted} of the group's {view.members} members are assigned the topics"
        if view.consuming is not None
        else f"the group's {view.members} members (their assignments are not readable: each is taken as a worker)"
    )
    if view.static:
        how += f"; {view.static} static members (group.instance.id): restarts within the session timeout are hidden"
    if counted == 0:
        return (declared, f"{how}{fallback}") if declared else (None, f"{how}: declare the launcher's workers")
    return counted, how


def describe_group(client_config: dict, group_id: str, topics: Sequence[str]) -> GroupView | None:
    """The group's view from the brokers (its coordinator), or None when it is not a classic group."""
    admin = _admin_class()(**client_config)
    try:
        described = admin.describe_groups([group_id]).get(group_id)  # pyright: ignore[reportAttributeAccessIssue]
    finally:
        with contextlib.suppress(Exception):
            admin.close()
    if not described or described.get("error"):
        return None
    return view_of(described, topics)


@functools.cache
def _admin_class():
    from kafka import KafkaAdminClient

    class Admin(KafkaAdminClient):
        """kafka-python's admin client, coping where the embedded broker differs: it answers DescribeGroups
        with authorized-operation bits that are not Kafka's, which kafka-python cannot decode.  The bits are
        not needed here, so they are dropped instead of failing the whole answer."""

        def _process_acl_operations(self, obj):
            try:
                return super()._process_acl_operations(obj)  # pyright: ignore[reportAttributeAccessIssue]
            except ValueError:
                obj.pop("authorized_operations", None)
                return obj

    return Admin
