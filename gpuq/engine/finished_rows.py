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

from gpuq.core import schema
from gpuq.engine.snapshot import SETTLED_SECONDS
from gpuq.spool import JobRef, Spool

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    Summary = Any  # whatever `summarize` returns; it must be marshal-able (tuples of str, int, None)

CACHE_NAME = "finished-rows"
CACHE_FORMAT = 2


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
    missing = [ref for ref in refs if ref.name in stats and not _still_valid(old.get(ref.name), stats[ref.name])]
    made = _summarize_all(spool, missing, state, summarize)
    kept_names, summaries, sigs = [], [], []
    for ref in refs:
        file_sig = stats.get(ref.name)
        if file_sig is None:
            continue
        hit = old.get(ref.name)
        summary = hit[1] if _still_valid(hit, file_sig) else made.get(ref.name)
        if summary is None:
            continue  # gone, or not a valid job
        kept_names.append(ref.name)
        summaries.append(summary)
        sigs.append(file_sig)
    settled = sig is not None and time.time() - sig[2] > SETTLED_SECONDS
    entry = ((dir_sig if settled else None), tuple(kept_names), tuple(summaries), marshal.dumps(tuple(sigs)))
    return entry, True


def _still_valid(hit: Any, file_sig: tuple) -> bool:
    return hit is not None and tuple(hit[0]) == file_sig


PARALLEL_FROM = 2000  # files to parse before the work is shared between CPUs (a fork costs ~1 ms)


def _summarize_all(
    spool: Spool, refs: list[JobRef], state: str, summarize: Callable[..., Summary]
) -> dict[str, Summary]:
    """name -> summary of each ref that is a valid job. Tens of thousands of files (the first
    `status -a` after they appeared) are parsed by one forked child per extra CPU as well: the
    parse is pure CPU work, read-only, and a child that fails only costs its share being redone."""
    cpus = min(os.cpu_count() or 1, 8)
    if len(refs) < PARALLEL_FROM or cpus < 2 or not hasattr(os, "fork"):
        return _summarize_some(spool, refs, state, summarize)
    shares = [refs[i::cpus] for i in range(cpus)]
    children = [_fork_share(spool, share, state, summarize) for share in shares[1:]]
    out = _summarize_some(spool, shares[0], state, summarize)
    for share, child in zip(shares[1:], children):
        out.update(_collect_share(child) if child is not None else _summarize_some(spool, share, state, summarize))
    return out


def _summarize_some(
    spool: Spool, refs: list[JobRef], state: str, summarize: Callable[..., Summary]
) -> dict[str, Summary]:
    out: dict[str, Summary] = {}
    for ref in refs:
        try:
            out[ref.name] = tuple(map(_intern, summarize(spool.jobs.load(ref), state)))
        except (FileNotFoundError, schema.InvalidJob):
            continue
    return out


def _fork_share(
    spool: Spool, refs: list[JobRef], state: str, summarize: Callable[..., Summary]
) -> Optional[tuple[int, int]]:
    """(pid, read end of its pipe) of a child that summarizes `refs` and sends them marshalled."""
    try:
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:  # the child: never returns into the caller's code
        code = 1
        try:
            os.close(read_fd)
            data = marshal.dumps(_summarize_some(spool, refs, state, summarize))
            with os.fdopen(write_fd, "wb") as out:
                out.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _collect_share(child: tuple[int, int]) -> dict[str, Summary]:
    pid, read_fd = child
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    _pid, status = os.waitpid(pid, 0)
    if status != 0:
        raise OSError(f"a child summarizing finished jobs failed (status {status})")
    loaded = marshal.loads(data)
    return {name: tuple(map(_intern, summary)) for name, summary in loaded.items()}


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
