"""The finished jobs of the tree: their ids and file names by state, cached while unchanged.

`gpuq status` needs of the finished jobs only their ids (what `after` waits for), how many there
are and the newest few; listing 100,000 files in done/ and making an object of each took most of
its time (issue 15). A directory's listing is cached with the directory's inode and mtime, which
move with every file added, removed or renamed in it, and trusted only once that mtime is
SETTLED_SECONDS old (engine/schedule/queue_read.py). The cache holds each state's ids as one run of 8-byte
integers and its names as one string, so reading it creates a handful of objects, not 100,000;
the ids are read through a memoryview rather than an `array` (whose import brings
collections.abc: about 2 ms of every `gpuq status`, bench/PROFILE.md section 1).
"""

from __future__ import annotations

import marshal
import sys
import time

from gpuq.core.states import FINISHED, STATES
from gpuq.engine.schedule.queue_read import SETTLED_SECONDS
from gpuq.spool import JobRef

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional, Sequence

    from gpuq.spool import Spool
    from gpuq.spool.cache.finished import FinishedRows

INDEX_NAME = "finished-index"
_ID_FORMAT, _ID_BYTES = "q", 8  # a C long long
_HEADER = (1, marshal.version, sys.byteorder, _ID_BYTES)


class Finished:
    """The finished states' listings: per state, ids ascending and the names in the same order."""

    __slots__ = ("ids", "_names", "signatures", "seen", "unchanged")

    def __init__(self) -> None:
        self.ids: dict[str, Sequence[int]] = {}  # a list, or a memoryview of the cached bytes
        self._names: dict[str, Any] = {}  # a list, or the names joined by "\n" as cached
        self.signatures: dict[str, Optional[tuple[int, int]]] = {}  # (inode, mtime_ns) when settled
        self.seen: dict[str, Optional[tuple[int, int]]] = {}  # (inode, mtime_ns) when listed, settled or not
        self.unchanged: set[str] = set()  # states whose listing came from the cache

    def names(self, state: str) -> list[str]:
        names = self._names.get(state, [])
        if isinstance(names, str):
            names = self._names[state] = names.split("\n") if names else []
        return names

    def count(self) -> int:
        return sum(len(ids) for ids in self.ids.values())

    def states(self) -> dict[int, str]:
        """id -> state of every finished job (the later state if a crash left two copies)."""
        out: dict[int, str] = {}
        for state in FINISHED:  # FINISHED is in the order of STATES: a later one wins
            out.update(dict.fromkeys(self.ids.get(state, ()), state))
        return out

    def refs(self, state: str) -> list[JobRef]:
        return [JobRef(i, state, n) for i, n in zip(self.ids.get(state, ()), self.names(state))]

    def newest(self, limit: int) -> list[JobRef]:
        """The `limit` finished jobs with the highest ids, in id order."""
        found = []
        for state, ids in self.ids.items():
            names = self._names[state]
            tail = names.rsplit("\n", limit)[-limit:] if isinstance(names, str) else names[-limit:]
            found += [JobRef(i, state, n) for i, n in zip(ids[len(ids) - len(tail) :], tail)]
        found.sort(key=lambda r: r.id)
        return found[-limit:]


def finished(spool: Spool) -> Finished:
    """The finished states as they are now: a state's directory is listed unless its signature
    is the settled one cached with its listing."""
    out, cached = Finished(), _read(spool)
    now, fresh = time.time(), False
    for state in FINISHED:
        sig = spool.jobs.dir_signature(state)
        key = (sig[0], sig[1]) if sig and now - sig[2] > SETTLED_SECONDS else None
        hit = cached.get(state)
        if key is not None and hit is not None and (hit[0], hit[1]) == key:
            out.ids[state], out._names[state] = memoryview(hit[2]).cast(_ID_FORMAT), hit[3]
            out.unchanged.add(state)
        else:
            names, id_list = spool.jobs.listed(state)
            out.ids[state], out._names[state] = id_list, names
            fresh = fresh or key is not None
        out.signatures[state] = key
        out.seen[state] = (sig[0], sig[1]) if sig else None
    if fresh:
        _write(spool, out)
    return out


def settled_key(spool: Spool, listing: Finished, state: str) -> Optional[tuple[int, int]]:
    """A state listed while its directory was not settled yet (the first `status -a` right after
    jobs finished): if the directory is settled now, has not changed since it was listed, and a
    new listing of it is the same, its key, so that what was made from the listing can be cached
    under it. Else None."""
    sig = spool.jobs.dir_signature(state)
    if sig is None or (sig[0], sig[1]) != listing.seen.get(state) or time.time() - sig[2] <= SETTLED_SECONDS:
        return None
    names, _ids = spool.jobs.listed(state)
    if names != listing.names(state) or spool.jobs.dir_signature(state) != sig:
        return None
    return sig[0], sig[1]


def _read(spool: Spool) -> dict[str, Any]:
    data = spool.cache.read(INDEX_NAME)
    try:
        header, states = marshal.loads(data) if data else (None, None)
    except (EOFError, ValueError, TypeError):
        return {}  # damaged: listed again, and rewritten
    if header != _HEADER or not isinstance(states, dict):
        return {}
    return {s: v for s, v in states.items() if _is_entry(v)}


def _is_entry(value: Any) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 4
        and isinstance(value[2], bytes)
        and isinstance(value[3], str)
        and len(value[2]) == _ID_BYTES * (value[3].count("\n") + 1 if value[3] else 0)
    )


def _write(spool: Spool, listing: Finished) -> None:
    entries = {}
    for state, key in listing.signatures.items():
        if key is not None:  # only a settled directory's listing can be trusted later
            names = listing._names[state]
            joined = names if isinstance(names, str) else "\n".join(names)
            entries[state] = (*key, id_bytes(listing.ids[state]), joined)
    try:
        spool.cache.write(INDEX_NAME, marshal.dumps((_HEADER, entries)))
    except OSError:
        pass  # a read-only or full spool is only listed every time


def id_bytes(ids: Sequence[int]) -> bytes:
    """The cached form of a state's ids."""
    if isinstance(ids, memoryview):
        return ids.tobytes()
    import struct  # only when a listing is written; not `array`, whose import brings collections

    return struct.pack(f"{len(ids)}{_ID_FORMAT}", *ids)  # native, as memoryview.cast reads it


def rows(spool: Spool, listing: Optional[Finished] = None) -> FinishedRows:
    """Every finished job's row (spool/cache/finished.py), from the cache wherever it still holds:
    what `status -a` shows and the queue's ETA reads (command keys, run times)."""
    from gpuq.spool.cache.finished import finished_rows  # not on every `gpuq status`: see the top

    listing = finished(spool) if listing is None else listing
    return finished_rows(spool, listing, lambda state: settled_key(spool, listing, state))


def whole_rows(spool: Spool) -> list[tuple[str, Any, Any]]:
    """(state, ids, rows) of each finished state, every row whole (`past` included): `gpuq history`."""
    from gpuq.spool.cache.finished import finished_runs

    listing = finished(spool)
    return finished_runs(spool, listing, lambda state: settled_key(spool, listing, state))


def history_records(spool: Spool) -> list[Any]:
    """The history record of every job (engine/views/history.py's JobRecord): finished ones from
    their rows, the others from their files (those that are valid jobs), then those `gpuq clear`
    removed, from what it kept (spool/kept.py; one whose job still has a file, a clear cut short,
    is left out). A job a crash left two copies of counts twice, as it always did."""
    from gpuq.engine.views import history  # dataclasses, statistics: only for `gpuq history`

    finished_rows = {state: (ids, rows) for state, ids, rows in whole_rows(spool)}
    out = []
    for state in STATES:  # in the order the files were always read: summed times come out the same
        if state in finished_rows:
            out += history.row_records(*finished_rows[state])
        else:
            out += [history.record_of(state, job) for _ref, job in spool.jobs.load_many(state)]
    here = set(spool.jobs.index())
    kept = {record[0]: record for record in spool.kept.read() if record[0] not in here}  # the last kept wins
    return out + history.kept_records(list(kept.values()))
