"""The runs `gpuq clear` kept of the jobs it removed (spool/kept.py), as the ETA reads them beside
the finished jobs that are left: per command, the newest successful run times (the queue's ETA)
and the newest tails (a running job's, eta.py). The records come from the finished index, which
holds them while `kept-runs` is unchanged.
"""

from __future__ import annotations

from typing import Any

from gpuq.core.states import DONE
from gpuq.spool import Spool

Runs = dict[str, list[tuple[int, float]]]  # command key -> (job id, run seconds), newest id first
Tails = dict[str, list[tuple[float, float, int]]]  # command key -> (end, tail seconds, job id), newest end first

NEWEST = 5  # per command: as many as the ETA takes a median of (run_times.RUNS, eta.TAIL_RUNS)


def summary(spool: Spool, write: bool = True) -> tuple[Runs, Tails]:
    """(run times, tails) of the kept records, per command key; ({}, {}) when nothing was cleared.
    `write=False`: the index is not rewritten (a look that writes nothing, `gpuq add --dry-run`)."""
    if spool.kept.signature() is None:
        return {}, {}
    return summarise(spool.finished.read(write).kept)


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
