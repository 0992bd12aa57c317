"""Reading the queue as a whole: snapshots for the scheduler and rows for `gpuq status`."""

from __future__ import annotations

import marshal
import os
import sys
import time
from typing import Any, Callable, Optional

from gpuq import jobs
from gpuq.scheduler import Snapshot
from gpuq.spool import FINISHED, STATES, JobRef, Spool


class PendingCache:
    """Parsed pending/running files keyed by name and stat, so an idle worker with a thousand
    blocked jobs does not re-parse them on every step. While a directory keeps the signature it
    had (already settled) at an earlier step, its files are not even stat()ed: see the comment
    above SETTLED_SECONDS for why a directory signature covers the files in it."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], tuple[tuple[int, int, int], Any]] = {}
        self._dirs: dict[str, str] = {}  # state -> directory as a string: pathlib per file is slow
        self._settled: dict[str, Optional[tuple[int, int]]] = {}
        self._trusted: set[str] = set()

    def begin(self, spool: Spool) -> None:
        """Called before each listing: which directories are unchanged since the last one."""
        now, self._trusted = time.time(), set()
        for state in ("pending", "running"):
            sig = spool.dir_signature(state)
            key = (sig[0], sig[1]) if sig and now - sig[2] > SETTLED_SECONDS else None
            if key is not None and self._settled.get(state) == key:
                self._trusted.add(state)
            self._settled[state] = key

    def load(self, spool: Spool, ref: JobRef) -> Any:
        if ref.state in self._trusted:
            hit = self._cache.get((ref.state, ref.name))
            if hit and not isinstance(hit[1], jobs.InvalidJob):  # a broken file may still be written
                return hit[1]
        directory = self._dirs.get(ref.state)
        if directory is None:
            directory = self._dirs[ref.state] = os.fspath(spool.state_dir(ref.state))
        try:
            st = os.stat(os.path.join(directory, ref.name), follow_symlinks=False)
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


def snapshot(
    spool: Spool, cache: Optional[PendingCache] = None, refs: Optional[list[JobRef]] = None
) -> tuple[Snapshot, list[tuple[JobRef, str]]]:
    """The scheduler's view, plus canonical-looking pending files that are not valid jobs.
    `refs`: a listing of every state just taken, to spare listing a big done/ again."""
    cache = cache or PendingCache()
    cache.begin(spool)
    states: dict[int, str] = {}
    snap = Snapshot(states=states)
    invalid: list[tuple[JobRef, str]] = []
    present = set()
    active = []
    for ref in spool.refs(STATES) if refs is None else refs:
        states[ref.id] = ref.state if ref.id not in states else _later(states[ref.id], ref.state)
        if ref.state in ("pending", "running"):
            active.append(ref)
    for ref in active:
        present.add((ref.state, ref.name))
        if ref.state == "pending" and states[ref.id] != "pending":
            continue  # a stale copy left by a crash mid-move: never a candidate to start
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


def recent_finished(spool: Spool, limit: int, refs: Optional[list[JobRef]] = None) -> list[JobRef]:
    found = [r for r in (spool.refs(FINISHED) if refs is None else refs) if r.state in FINISHED]
    found.sort(key=lambda r: r.id)
    return found[-limit:] if limit else found


# ---- summaries of finished jobs, cached in the spool --------------------------------------------
# Parsing 100,000 finished job files takes seconds, yet what `gpuq status -a` shows of a finished
# job never changes: its file is never edited in place (a change writes a new file, with a new
# inode and mtime, or moves it to another state). So a summary stays valid while its file keeps
# its name, inode, mtime and size, and all of a directory's summaries stay valid while the
# directory itself keeps its inode and mtime, which move with every file added, removed or
# replaced in it. A directory mtime is trusted only once it is SETTLED_SECONDS old: timestamps
# are coarse, so a change made in the same tick as the one recorded could leave it unchanged
# (Python's mailbox.Maildir guards its refresh the same way).
CACHE_NAME = "finished-rows"
CACHE_FORMAT = 2
SETTLED_SECONDS = 2.0
Summary = Any  # whatever `summarize` returns; it must be marshal-able (tuples of str, int, None)


def finished_summaries(
    spool: Spool, refs: list[JobRef], summarize: Callable[[dict[str, Any], str], Summary]
) -> list[tuple[JobRef, Summary]]:
    """(ref, summarize(job, state)) for each finished ref that is a valid job, grouped by state.

    The cache holds, per state: (directory signature or None, names, summaries, file signatures).
    The file signatures stay marshalled inside it, only decoded when the directory changed."""
    header = _cache_header(summarize)
    old = _read_cache(spool, header)
    by_state: dict[str, list[JobRef]] = {}
    for ref in refs:
        by_state.setdefault(ref.state, []).append(ref)
    new: dict[str, tuple] = {}
    out: list[tuple[JobRef, Summary]] = []
    changed = False
    for state, state_refs in by_state.items():
        entry, fresh = _summaries_of(spool, state, state_refs, old.get(state), summarize)
        new[state] = entry
        changed = changed or fresh
        found = dict(zip(entry[1], entry[2])) if len(entry[1]) != len(state_refs) else None
        if found is None:  # the usual case: every listed file has its summary, in the same order
            out += zip(state_refs, entry[2])
        else:
            out += [(ref, found[ref.name]) for ref in state_refs if ref.name in found]
    if changed:
        try:
            spool.write_cache(CACHE_NAME, marshal.dumps((header, new)))
        except OSError:
            pass  # a read-only or full spool still shows its status, only slower
    return out


def _summaries_of(
    spool: Spool, state: str, refs: list[JobRef], cached: Any, summarize: Callable[..., Summary]
) -> tuple[tuple, bool]:
    """One directory's cache entry (dir signature, names, summaries, file signatures) and
    whether it differs from the cached one. Names are in listing order, as `refs`."""
    sig = spool.dir_signature(state)
    dir_sig = (sig[0], sig[1]) if sig else None
    names = tuple(r.name for r in refs)
    if _is_entry(cached) and dir_sig is not None and cached[0] == dir_sig and cached[1] == names:
        return cached, False  # the directory has not changed since it was cached
    old: dict[str, tuple] = {}
    if _is_entry(cached):
        try:
            old = dict(zip(cached[1], zip(marshal.loads(cached[3]), cached[2])))
        except (EOFError, ValueError, TypeError):
            old = {}
    stats = spool.file_signatures(state, list(names))
    kept_names, summaries, sigs = [], [], []
    for ref in refs:
        file_sig = stats.get(ref.name)
        if file_sig is None:
            continue
        hit = old.get(ref.name)
        if hit is not None and tuple(hit[0]) == file_sig:
            summary = hit[1]
        else:
            try:
                summary = tuple(map(_intern, summarize(spool.load(ref), state)))
            except (FileNotFoundError, jobs.InvalidJob):
                continue
        kept_names.append(ref.name)
        summaries.append(summary)
        sigs.append(file_sig)
    settled = sig is not None and time.time() - sig[2] > SETTLED_SECONDS
    entry = ((dir_sig if settled else None), tuple(kept_names), tuple(summaries), marshal.dumps(tuple(sigs)))
    return entry, True


def _intern(value: Any) -> Any:
    """Repeated cells ("train.py", "exit=0") become one object, stored once by marshal."""
    return sys.intern(value) if isinstance(value, str) else value


def _is_entry(value: Any) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 4
        and isinstance(value[1], tuple)
        and isinstance(value[2], tuple)
        and len(value[1]) == len(value[2])
        and isinstance(value[3], bytes)
    )


def _cache_header(summarize: Callable[..., Summary]) -> tuple:
    """What the cached summaries depend on: the cache format, the interpreter (marshal's format)
    and the file of the code that made them (a new gpuq rebuilds them)."""
    module = sys.modules.get(summarize.__module__)
    try:
        st = os.stat(module.__file__) if module and module.__file__ else None
    except OSError:
        st = None
    code = (summarize.__qualname__, st.st_mtime_ns if st else 0, st.st_size if st else 0)
    return (CACHE_FORMAT, marshal.version, tuple(sys.version_info[:2]), code)


def _read_cache(spool: Spool, header: tuple) -> dict[str, Any]:
    data = spool.read_cache(CACHE_NAME)
    if not data:
        return {}
    try:
        stored_header, states = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        return {}  # damaged or from another Python: rebuilt
    return states if stored_header == header and isinstance(states, dict) else {}
