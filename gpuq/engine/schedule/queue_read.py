"""Reading the queue as a whole: the scheduler's snapshot of pending and running jobs."""

from __future__ import annotations

import os
import time

from gpuq.core import schema
from gpuq.core.states import PENDING, RUNNING, STATES
from gpuq.engine.schedule.scheduler import QueueState
from gpuq.spool import JobRef, Spool

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional

# A directory's mtime is trusted to cover its files only once it is this old: timestamps are
# coarse, so a change in the same tick as the one recorded could leave it unchanged (Python's
# mailbox.Maildir guards its refresh the same way).
SETTLED_SECONDS = 2.0


class PendingCache:
    """Parsed pending/running files keyed by name and stat, so an idle worker with a thousand
    blocked jobs does not re-parse them on every step. While a directory keeps the signature it
    had (already settled) at an earlier step, its files are not even stat()ed: a job file is
    never edited in place, so any change to one moves its directory's mtime."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], tuple[tuple[int, int, int], Any]] = {}
        self._dirs: dict[str, str] = {}  # state -> directory as a string: pathlib per file is slow
        self._settled: dict[str, Optional[tuple[int, int]]] = {}
        self._trusted: set[str] = set()

    def begin(self, spool: Spool) -> None:
        """Called before each listing: which directories are unchanged since the last one."""
        now, self._trusted = time.time(), set()
        for state in (PENDING, RUNNING):
            sig = spool.jobs.dir_signature(state)
            key = (sig[0], sig[1]) if sig and now - sig[2] > SETTLED_SECONDS else None
            if key is not None and self._settled.get(state) == key:
                self._trusted.add(state)
            self._settled[state] = key

    def load(self, spool: Spool, ref: JobRef) -> Any:
        if ref.state in self._trusted:
            hit = self._cache.get((ref.state, ref.name))
            if hit and not isinstance(hit[1], schema.InvalidJob):  # a broken file may still be written
                return hit[1]
        directory = self._dirs.get(ref.state)
        if directory is None:
            directory = self._dirs[ref.state] = os.fspath(spool.layout.state_dir(ref.state))
        try:
            st = os.stat(os.path.join(directory, ref.name), follow_symlinks=False)
        except FileNotFoundError:
            return None
        key, sig = (ref.state, ref.name), (st.st_ino, st.st_mtime_ns, st.st_size)
        hit = self._cache.get(key)
        if hit and hit[0] == sig:
            return hit[1]
        try:
            value: Any = spool.jobs.load(ref)
        except FileNotFoundError:
            return None
        except schema.InvalidJob as exc:
            value = exc
        self._cache[key] = (sig, value)
        return value

    def forget(self, state: str, name: str) -> None:
        """Drop what is cached for a file, so that the next load reads it whatever its stat says."""
        self._cache.pop((state, name), None)

    def forget_missing(self, present: set[tuple[str, str]]) -> None:
        for key in list(self._cache):
            if key not in present:
                del self._cache[key]


def read_queue(
    spool: Spool,
    cache: Optional[PendingCache] = None,
    refs: Optional[list[JobRef]] = None,
    now: Optional[float] = None,
    finished: Optional[dict[int, str]] = None,
    vanished: Optional[list[JobRef]] = None,
) -> tuple[QueueState, list[tuple[JobRef, str]]]:
    """The scheduler's view at `now` (default: the clock), plus canonical-looking pending files
    that are not valid jobs. `refs`: a listing of every state just taken, to spare listing a big
    done/ again; or of the other states, with `finished` (id -> state of the finished jobs; it
    becomes the snapshot's `states`, so the caller hands it over). `vanished` collects the listed
    pending/running files that were gone when read (moved on in between)."""
    cache = cache or PendingCache()
    cache.begin(spool)
    states: dict[int, str] = finished if finished is not None else {}
    snap = QueueState(states=states, now=time.time() if now is None else now)
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
        value = cache.load(spool, ref)
        if isinstance(value, schema.InvalidJob):
            invalid.append((ref, str(value)))
        elif value is not None:
            (snap.pending if ref.state == PENDING else snap.running).append(value)
        elif vanished is not None:
            vanished.append(ref)
    cache.forget_missing(present)
    return snap, invalid


def later(a: str, b: str) -> str:
    """Two copies seen (a crash mid-move not yet repaired): the further-along state is shown."""
    return a if STATES.index(a) > STATES.index(b) else b
