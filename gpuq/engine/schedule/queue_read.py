"""Reading the queue as a whole: the scheduler's snapshot of pending and running jobs."""

from __future__ import annotations

import os
import time
from typing import Optional, Union

from gpuq.core import schema
from gpuq.core.job import Job
from gpuq.core.states import PENDING, RUNNING, STATES, WAITING
from gpuq.engine.schedule.scheduler import QueueState, dependency_loops
from gpuq.spool import JobRef, Spool

Loaded = Union[Job, schema.InvalidJob, None]  # a job, why its file is not one, or None: gone


class PendingCache:
    """Parsed pending/running files kept under their inode, mtime and size: a job file is never
    edited in place, so a file that keeps its signature holds what it held."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], tuple[tuple[int, int, int], Loaded]] = {}

    def load(self, spool: Spool, ref: JobRef) -> Loaded:
        try:
            st = os.stat(spool.layout.job_path(ref.state, ref.name), follow_symlinks=False)
        except FileNotFoundError:
            return None
        key, sig = (ref.state, ref.name), (st.st_ino, st.st_mtime_ns, st.st_size)
        hit = self._cache.get(key)
        if hit is not None and hit[0] == sig and not isinstance(hit[1], schema.InvalidJob):
            return hit[1]  # a broken file is read again: it may still be being written
        value = load(spool, ref)
        self._cache[key] = (sig, value)
        return value

    def forget(self, state: str, name: str) -> None:
        self._cache.pop((state, name), None)

    def forget_missing(self, present: set[tuple[str, str]]) -> None:
        self._cache = {key: hit for key, hit in self._cache.items() if key in present}


def load(spool: Spool, ref: JobRef) -> Loaded:
    try:
        return spool.jobs.load(ref)
    except FileNotFoundError:
        return None
    except schema.InvalidJob as exc:
        return exc


def read_queue(
    spool: Spool,
    cache: Optional[PendingCache] = None,
    refs: Optional[list[JobRef]] = None,
    finished: Optional[dict[int, str]] = None,
    vanished: Optional[list[JobRef]] = None,
) -> tuple[QueueState, list[tuple[JobRef, str]]]:
    """The scheduler's view now, plus pending files that are not valid jobs. `refs`: a listing
    just taken (of every state; or of the others, with `finished`: id -> state, which becomes the
    snapshot's `states`). `vanished` collects listed files gone when read."""
    states: dict[int, str] = finished if finished is not None else {}
    snap = QueueState(states=states, now=time.time())
    invalid: list[tuple[JobRef, str]] = []
    present = set()
    active = []
    for ref in spool.jobs.refs(STATES) if refs is None else refs:
        states[ref.id] = ref.state if ref.id not in states else later(states[ref.id], ref.state)
        if ref.state in (PENDING, RUNNING):
            active.append(ref)
    for ref in active:
        present.add((ref.state, ref.name))
        if ref.state == PENDING and states[ref.id] != PENDING:
            continue  # a stale copy left by a crash mid-move: never a candidate to start
        value = cache.load(spool, ref) if cache is not None else load(spool, ref)
        if isinstance(value, schema.InvalidJob):
            invalid.append((ref, str(value)))
        elif value is not None:
            (snap.pending if ref.state == PENDING else snap.running).append(value)
        elif vanished is not None:
            vanished.append(ref)
    if cache is not None:
        cache.forget_missing(present)
    return snap, invalid


def later(a: str, b: str) -> str:
    """Two copies seen (a crash mid-move not yet repaired): the further-along state is shown."""
    return a if STATES.index(a) > STATES.index(b) else b


def waits_for_itself(spool: Spool, job_id: int, deps: list[int]) -> list[int]:
    """The chain of waiting (pending or held) jobs through which `job_id`, waiting for `deps`,
    would wait for itself (ending in `job_id`), or [] (a job that has started or ended is waited
    for no longer)."""
    waits = {job_id: deps}  # first: the search starts at it, so its loop is always found
    for state in WAITING:
        for _ref, job in spool.jobs.load_many(state):
            waits.setdefault(job.id, job.after + job.after_any)
    return dependency_loops(waits).get(job_id, [])[1:]
