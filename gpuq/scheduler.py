"""Scheduling decisions as plain functions over a snapshot of the spool.

Nothing here touches files or processes: the worker builds a Snapshot, asks `plan()` which jobs
to start in which free slots, and carries the decision out. Tests call these directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from gpuq.spool import FINISHED

# States a dependency can sit in that only a person can change (recover, resume, retry).
NEEDS_USER = ("preempted", "interrupted")


class Wait(NamedTuple):
    reason: str
    forever: bool  # True: cannot start unless a person acts (the dependency failed, vanished...)


@dataclass
class Snapshot:
    states: dict[int, str]  # id -> state of every job in the tree
    pending: list[dict[str, Any]] = field(default_factory=list)
    running: list[dict[str, Any]] = field(default_factory=list)


def _dependency_wait(job_id: int, dep: int, state: Optional[str], any_result: bool) -> Optional[Wait]:
    if state == "done" or (any_result and state in FINISHED):
        return None
    if state is None:
        return Wait(f"after #{dep}: no such job", True)
    if state in ("failed", "cancelled"):
        return Wait(f"after #{dep} ({state}): will not start; `gpuq retry {dep}` or `gpuq cancel {job_id}`", True)
    if state in NEEDS_USER:
        return Wait(f"after #{dep} ({state})", True)
    return Wait(f"after #{dep}" + (" (running)" if state == "running" else ""), False)


def waiting_reason(job: dict[str, Any], states: dict[int, str]) -> Optional[Wait]:
    """Why a pending job cannot start yet, or None if its dependencies allow it to."""
    waits = [_dependency_wait(job["id"], d, states.get(d), False) for d in job.get("after", [])]
    waits += [_dependency_wait(job["id"], d, states.get(d), True) for d in job.get("after_any", [])]
    waits = [w for w in waits if w is not None]
    if not waits:
        return None
    blocking = [w for w in waits if w.forever]
    return blocking[0] if blocking else waits[0]


def queue_order(pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Higher priority first, then by id (the order of `ls pending/`)."""
    return sorted(pending, key=lambda j: (-int(j.get("priority") or 0), j["id"]))


def occupied_slots(running: list[dict[str, Any]], slots: list[Optional[str]]) -> set[Optional[str]]:
    """Slots taken by running jobs. A job with slot None (whole machine, or adopted) takes all."""
    taken: set[Optional[str]] = set()
    for job in running:
        slot = job.get("slot")
        if slot is None or slots == [None]:
            return set(slots)
        taken.add(slot)
    return taken & set(slots)


def plan(snapshot: Snapshot, free_slots: list[Optional[str]]) -> list[tuple[dict[str, Any], Optional[str]]]:
    """Which pending jobs to start now, one per free slot, in queue order."""
    ready = [j for j in queue_order(snapshot.pending) if waiting_reason(j, snapshot.states) is None]
    return list(zip(ready, free_slots))


def has_startable_future(snapshot: Snapshot) -> bool:
    """True while some pending job can still start without a person acting."""
    return any(not (w := waiting_reason(j, snapshot.states)) or not w.forever for j in snapshot.pending)
