"""Summaries of finished jobs, cached in the spool, so that `gpuq status -a` need not parse them all.

Parsing 100,000 finished job files takes seconds, yet what `gpuq status -a` shows of a finished
job never changes: its file is never edited in place (a change writes a new file, with a new
inode and mtime, or moves it to another state). So a summary stays valid while its file keeps
its name, inode, mtime and size, and all of a directory's summaries stay valid while the
directory itself keeps its inode and mtime, which move with every file added, removed or
replaced in it (trusted once SETTLED_SECONDS old: see engine/snapshot.py).
"""

from __future__ import annotations

import marshal
import os
import sys
import time
from typing import Any, Callable

from gpuq.core import schema
from gpuq.engine.snapshot import SETTLED_SECONDS
from gpuq.spool import JobRef, Spool

CACHE_NAME = "finished-rows"
CACHE_FORMAT = 2
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
            spool.cache.write(CACHE_NAME, marshal.dumps((header, new)))
        except OSError:
            pass  # a read-only or full spool still shows its status, only slower
    return out


def _summaries_of(
    spool: Spool, state: str, refs: list[JobRef], cached: Any, summarize: Callable[..., Summary]
) -> tuple[tuple, bool]:
    """One directory's cache entry (dir signature, names, summaries, file signatures) and
    whether it differs from the cached one. Names are in listing order, as `refs`."""
    sig = spool.jobs.dir_signature(state)
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
    stats = spool.jobs.file_signatures(state, list(names))
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
                summary = tuple(map(_intern, summarize(spool.jobs.load(ref), state)))
            except (FileNotFoundError, schema.InvalidJob):
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
    data = spool.cache.read(CACHE_NAME)
    if not data:
        return {}
    try:
        stored_header, states = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        return {}  # damaged or from another Python: rebuilt
    return states if stored_header == header and isinstance(states, dict) else {}
