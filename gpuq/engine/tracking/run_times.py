"""Run times of earlier runs, for the queue's ETA (queue_eta.py): a pending job runs for the
median of the newest RUNS successful runs of the same command in the same directory, read from the
finished rows (which hold each job's command key and run time) and from what `gpuq clear` kept of
the jobs it removed (kept_runs.py).
"""

from __future__ import annotations

import marshal
from itertools import compress, count

from gpuq.core.states import DONE
from gpuq.engine.tracking import eta, kept_runs
from gpuq.engine.views import finished_index, kept_jobs
from gpuq.spool import Spool
from gpuq.spool.cache import runs as past_runs

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Iterable, Iterator, Optional


RUNS = 5  # a pending job's run time: the median of the newest RUNS successful runs of its command
NEW_FILES = 200  # finished files newer than the cached rows read while done/ is changing; more: refreshed


RUNS_CACHE = "queue-runs"  # cache/queue-runs: each command's newest run times, for one done/ listing
_RUNS_FORMAT = 2  # 2: with what `gpuq clear` kept


def past_durations(spool: Spool, keys: set[str], listing: Optional[Any] = None) -> dict[str, list[float]]:
    """Run times of the newest RUNS successful jobs of each command and cwd of `keys`, oldest
    first, from the finished rows, which hold each job's command key and run time (adopted jobs
    and unknown times left out), and from what `gpuq clear` kept of the jobs it removed. While
    done/ is settled and unchanged, from cache/queue-runs (the rows' newest run times of every
    command, a few KB), not from the rows of every finished job.
    While done/ keeps changing (jobs finishing: its listing is not settled), checking every row
    against its file on each call would cost more than the files it spares (an lstat each): the
    rows as last cached serve then, with the few files finished since read. `listing`: the
    finished listing (engine/views/finished_index.py), if the caller has it."""
    listing = finished_index.finished(spool) if listing is None else listing
    settled = listing.signatures.get(DONE)
    if settled is not None:
        every = _settled_runs(spool, listing, settled)
        return {key: every[key][::-1] for key in keys if key in every}
    found: dict[str, list[tuple[int, float]]] = {}  # key -> (id, run time), newest first
    from gpuq.spool.cache.finished import cached_rows

    view = cached_rows(spool)
    newer = _newer_refs(listing, view)
    if view is not None and len(newer) <= NEW_FILES:
        _newest_runs(keys, _loaded_runs(spool, newer, keys), found)
    else:
        view = finished_index.rows(spool, listing)
    _newest_runs(keys, _row_runs(view, keys), found)
    merged = _with_kept(found, kept_runs.summary(spool)[0], keys)
    return {key: newest[::-1] for key, newest in merged.items()}


def durations_read_only(spool: Spool, keys: set[str]) -> dict[str, list[float]]:
    """past_durations for a look that writes nothing (`gpuq add --dry-run`): the finished rows as
    last cached, unchecked, and the done/ files newer than them (the newest NEW_FILES at most);
    no cache is made or brought up to date, and no journal taken."""
    from gpuq.spool.cache.finished import cached_rows

    view = cached_rows(spool)
    newest = view.ids[-1] if view is not None and len(view) else 0
    newer = [ref for ref in spool.jobs.refs((DONE,)) if ref.id > newest][-NEW_FILES:]
    found: dict[str, list[tuple[int, float]]] = {}
    _newest_runs(keys, _loaded_runs(spool, newer, keys), found)
    if view is not None:
        _newest_runs(keys, _row_runs(view, keys), found)
    merged = _with_kept(found, kept_runs.summary(spool, write=False)[0], keys)
    return {key: runs[::-1] for key, runs in merged.items()}


def _settled_runs(spool: Spool, listing: Any, settled: tuple[int, int]) -> dict[str, list[float]]:
    """Every command's newest RUNS run times, newest first, while done/ has the signature
    `settled` and what clear kept is unchanged: from cache/queue-runs when it was made for them by
    this code, else from the rows and the kept records (and cached). Finished files are never
    edited in place, so while done/ keeps its inode and mtime so do the rows made from its files."""
    kept_at = spool.kept.signature()
    stamp = (_RUNS_FORMAT, marshal.version, tuple(settled), kept_at, kept_jobs.code_stamp(*ROW_CODE))
    data = spool.cache.read(RUNS_CACHE)
    try:
        cached = marshal.loads(data) if data else None
    except (EOFError, ValueError, TypeError):
        cached = None  # damaged: made again
    if type(cached) is tuple and len(cached) == 2 and cached[0] == stamp and _is_runs(cached[1]):
        return cached[1]
    view = finished_index.rows(spool, listing)
    found: dict[str, list[tuple[int, float]]] = {}
    for job_id, key, run in _row_runs(view, None):
        newest = found.setdefault(key, [])
        if len(newest) < RUNS:
            newest.append((job_id, run))
    kept = kept_runs.summary(spool)[0] if kept_at is not None else {}
    every = _with_kept(found, kept, set(found) | set(kept))
    if kept_jobs.room_for_caches(spool):
        try:
            spool.cache.write(RUNS_CACHE, marshal.dumps((stamp, every)))
        except OSError:
            pass  # a read-only or full spool: the rows are read every time
    return every


def _with_kept(
    found: dict[str, list[tuple[int, float]]], kept: dict[str, list[tuple[int, float]]], keys: set[str]
) -> dict[str, list[float]]:
    """key -> the newest RUNS run times of `keys`, newest first, of the rows' (`found`) and the
    kept records' (id, run time) together; a job in both (a clear cut short) counts once."""
    out = {}
    for key in keys:
        by_id = dict(kept.get(key, ()))
        by_id.update(found.get(key, ()))
        if by_id:
            out[key] = [run for _id, run in sorted(by_id.items(), reverse=True)[:RUNS]]
    return out


def _is_runs(value: Any) -> bool:
    return type(value) is dict and all(
        type(k) is str and type(v) is list and all(type(r) in (float, int) for r in v) for k, v in value.items()
    )


# The code the rows' keys and run times are made by, as spool/cache/finished.py's header names it:
# a new gpuq learns them again.
ROW_CODE = ("spool/cache/journal", "spool/cache/runs", "core/shown", "core/schema", "core/times")


def _row_runs(view: Any, keys: Optional[set[str]]) -> Iterator[tuple[int, str, float]]:
    """(id, key, run time) of the successful rows of commands of `keys` (None: of every command),
    newest first; the rows of these commands picked in C (10,000 rows, often most of them of
    these commands)."""
    ids, states, runs, row_keys = view.ids, view.states, view.runs, view.keys
    picked = range(len(row_keys)) if keys is None else compress(count(), map(keys.__contains__, row_keys))
    for at in reversed(list(picked)):
        if states[at] == DONE and runs[at] is not None:
            yield ids[at], row_keys[at], runs[at]


def _newer_refs(listing: Any, view: Any) -> list[Any]:
    """The done/ files with ids above every cached row's (None: no cached rows)."""
    if view is None:
        return []
    newest = view.ids[-1] if len(view) else 0
    return [ref for ref in listing.refs(DONE) if ref.id > newest]


def _loaded_runs(spool: Spool, refs: list[Any], keys: set[str]) -> Iterator[tuple[int, str, float]]:
    for ref in reversed(refs):
        try:
            job = spool.jobs.load(ref)
        except (OSError, ValueError):
            continue
        key, run = eta.command_key(job), past_runs.run_seconds(job)
        if key in keys and run is not None:
            yield ref.id, key, run


def _newest_runs(
    keys: set[str], newest_first: Iterable[tuple[int, str, float]], found: dict[str, list[tuple[int, float]]]
) -> None:
    """`found` (key -> (id, run time), newest first) filled up to RUNS each from `newest_first`;
    once every key of `keys` has its RUNS, the rest is not looked at."""
    wanted = sum(len(found.get(key, ())) < RUNS for key in keys)
    for job_id, key, run in newest_first if wanted else ():
        newest = found.setdefault(key, [])
        if len(newest) < RUNS:
            newest.append((job_id, run))
            wanted -= len(newest) == RUNS
            if not wanted:
                break
