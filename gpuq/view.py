"""Reading the queue as a whole: snapshots for the scheduler and rows for `gpuq status`."""

from __future__ import annotations

from typing import Any, Optional

from gpuq import jobs
from gpuq.scheduler import Snapshot
from gpuq.spool import FINISHED, STATES, JobRef, Spool


class PendingCache:
    """Parsed pending/running files keyed by name and stat, so an idle worker with a thousand
    blocked jobs does not re-parse them on every step."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], tuple[tuple[int, int, int], Any]] = {}

    def load(self, spool: Spool, ref: JobRef) -> Any:
        import os

        try:
            st = os.stat(spool.state_dir(ref.state) / ref.name, follow_symlinks=False)
        except FileNotFoundError:
            return None
        key, sig = (ref.state, ref.name), (st.st_ino, st.st_mtime_ns, st.st_size)
        hit = self._cache.get(key)
        if hit and hit[0] == sig:
            return hit[1]
        try:
            value: Any = spool.load(ref)
        except FileNotFoundError:
            return None
        except jobs.InvalidJob as exc:
            value = exc
        self._cache[key] = (sig, value)
        return value

    def forget_missing(self, present: set[tuple[str, str]]) -> None:
        for key in list(self._cache):
            if key not in present:
                del self._cache[key]


def snapshot(spool: Spool, cache: Optional[PendingCache] = None) -> tuple[Snapshot, list[tuple[JobRef, str]]]:
    """The scheduler's view, plus canonical-looking pending files that are not valid jobs."""
    cache = cache or PendingCache()
    states: dict[int, str] = {}
    snap = Snapshot(states=states)
    invalid: list[tuple[JobRef, str]] = []
    present = set()
    for ref in spool.refs(STATES):
        states[ref.id] = ref.state if ref.id not in states else _later(states[ref.id], ref.state)
        if ref.state not in ("pending", "running"):
            continue
        present.add((ref.state, ref.name))
        value = cache.load(spool, ref)
        if isinstance(value, jobs.InvalidJob):
            invalid.append((ref, str(value)))
        elif value is not None:
            (snap.pending if ref.state == "pending" else snap.running).append(value)
    cache.forget_missing(present)
    return snap, invalid


def _later(a: str, b: str) -> str:
    """Two copies seen (a crash mid-move not yet repaired): the further-along state is shown."""
    return a if STATES.index(a) > STATES.index(b) else b


def recent_finished(spool: Spool, limit: int) -> list[JobRef]:
    refs = [r for r in spool.refs(FINISHED)]
    refs.sort(key=lambda r: r.id)
    return refs[-limit:] if limit else refs
