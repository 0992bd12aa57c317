"""Run times of earlier runs, for the queue's ETA (queue_eta.py): a pending job runs for the
median of the newest RUNS successful runs of the same command in the same directory, read from the
index of finished jobs (each row holds its command key and run time) and from what `gpuq clear`
kept of the jobs it removed (kept_runs.py).
"""

from __future__ import annotations

from typing import Optional

from gpuq.core.states import DONE
from gpuq.engine.tracking import kept_runs
from gpuq.spool import Spool
from gpuq.spool.cache.index import Finished

RUNS = 5  # a pending job's run time: the median of the newest RUNS successful runs of its command


def past_durations(spool: Spool, keys: set[str], listing: Optional[Finished] = None) -> dict[str, list[float]]:
    """Run times of the newest RUNS successful jobs of each command and cwd of `keys`, oldest
    first (adopted jobs and unknown times left out). `listing`: the finished index, if the caller
    has it."""
    return _durations(spool.finished.read() if listing is None else listing, keys)


def durations_read_only(spool: Spool, keys: set[str]) -> dict[str, list[float]]:
    """past_durations for a look that writes nothing (`gpuq add --dry-run`)."""
    return _durations(spool.finished.read(write=False), keys)


def _durations(done: Finished, keys: set[str]) -> dict[str, list[float]]:
    entry = done.entries[DONE]
    found: dict[str, dict[int, float]] = {}  # key -> id -> run time
    wanted = len(keys)
    for job_id, key, run in zip(reversed(entry.ids), reversed(entry.keys), reversed(entry.runs)):  # newest first
        if run is not None and key in keys:
            newest = found.setdefault(key, {})
            if len(newest) < RUNS:
                newest[job_id] = run
                wanted -= len(newest) == RUNS
                if not wanted:
                    break
    kept = kept_runs.summarise(done.kept)[0]
    out = {}
    for key in keys:
        by_id = dict(kept.get(key, ()))
        by_id.update(found.get(key, {}))  # a job in both (a clear cut short) counts once
        if by_id:
            out[key] = [run for _id, run in sorted(by_id.items(), reverse=True)[:RUNS]][::-1]
    return out
