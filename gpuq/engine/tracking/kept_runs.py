"""The runs `gpuq clear` kept of the jobs it removed (spool/kept.py), as the ETA reads them beside
the finished jobs that are left: per command, the newest successful run times (the queue's ETA)
and the newest tails (a running job's, eta.py).

`gpuq status` with jobs waiting asks for them at every call, and the file only grows: so they are
summed up once per version of the file and kept in cache/kept-runs (marshal data under the file's
inode, mtime and size), read again only after a clear changed it.
"""

from __future__ import annotations

import marshal

from gpuq.core.states import DONE
from gpuq.engine.views import kept_jobs
from gpuq.spool import Spool

TYPE_CHECKING = False  # typing only for annotations: `status` with jobs waiting imports this (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any

    Runs = dict[str, list[tuple[int, float]]]  # command key -> (job id, run seconds), newest id first
    Tails = dict[str, list[tuple[float, float, int]]]  # command key -> (end, tail seconds, job id), newest end first

NEWEST = 5  # per command: as many as the ETA takes a median of (run_times.RUNS, eta.TAIL_RUNS)
CACHE = "kept-runs"
_FORMAT = 1


def summary(spool: Spool, write: bool = True) -> tuple[Runs, Tails]:
    """(run times, tails) of the kept records, per command key; ({}, {}) when nothing was cleared.
    `write=False`: no cache made (a look that writes nothing, `gpuq add --dry-run`)."""
    signature = spool.kept.signature()
    if signature is None:
        return {}, {}
    stamp = (_FORMAT, marshal.version, signature)
    data = spool.cache.read(CACHE)
    try:
        cached = marshal.loads(data) if data else None
    except (EOFError, ValueError, TypeError):
        cached = None  # damaged: made again
    if type(cached) is tuple and len(cached) == 3 and cached[0] == stamp and _is_summary(cached[1], cached[2]):
        return cached[1], cached[2]
    runs, tails = summarise(spool.kept.read())
    if write and kept_jobs.room_for_caches(spool):
        try:
            spool.cache.write(CACHE, marshal.dumps((stamp, runs, tails)))
        except OSError:
            pass  # a read-only or full spool: summed up every time
    return runs, tails


def summarise(records: list[tuple[Any, ...]]) -> tuple[Runs, Tails]:
    """The newest NEWEST run times (of done jobs) and tails of each command in `records`
    (spool/kept.py's RECORD); a job kept twice (a clear cut short, then run again) counts once."""
    latest = {record[0]: record for record in records}
    runs: Runs = {}
    tails: Tails = {}
    for job_id in sorted(latest, reverse=True):
        _id, state, _name, key, run, _past, end, tail = latest[job_id]
        newest = runs.setdefault(key, [])
        if state == DONE and run is not None and len(newest) < NEWEST:
            newest.append((job_id, float(run)))
        if tail is not None and end is not None:
            tails.setdefault(key, []).append((float(end), float(tail), job_id))
    for key, found in tails.items():
        tails[key] = sorted(found, reverse=True)[:NEWEST]
    return {key: found for key, found in runs.items() if found}, tails


def _is_summary(runs: Any, tails: Any) -> bool:
    return (
        type(runs) is dict
        and type(tails) is dict
        and all(
            type(k) is str and type(v) is list and all(type(x) is tuple and len(x) == 2 for x in v)
            for k, v in runs.items()
        )
        and all(
            type(k) is str and type(v) is list and all(type(x) is tuple and len(x) == 3 for x in v)
            for k, v in tails.items()
        )
    )
