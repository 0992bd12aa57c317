"""A job's recorded GPU utilisation as spans (start, end, percent) of time, for `history --plot`:
a point of an attempt's GPU record (gpuuse.py) stands for the time since the point before it.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from gpuq.spool import Spool

Span = tuple[float, float, float]

START_SLACK = 1.0  # seconds: a record's attempt and a run are the same when their starts are this close
SPANS_ACROSS = 1000  # at most this many spans across the whole timeline: finer than a figure's pixels


def spans(attempt: dict[str, Any], position: int, end: float, resolution: float = 0.0) -> list[Span]:
    """The utilisation of the attempt's `position`th GPU (in the order of its `gpus`) until `end`.
    Neighbouring spans are merged (their time-weighted mean) while they have the same utilisation
    or the merged span is shorter than `resolution` seconds."""
    out: list[list[float]] = []
    before = _number(attempt.get("started"))
    for point in attempt.get("points") or ():
        at, util = _reading(point, position)
        if at is None:
            continue
        start, stop, before = before, min(at, end), at
        if util is None or start is None or stop <= start:
            continue
        last = out[-1] if out else None
        if last and last[1] == start and (last[2] == util or last[1] - last[0] < resolution):
            width = last[1] - last[0]
            last[2] = (last[2] * width + util * (stop - start)) / (width + stop - start)
            last[1] = stop
        else:
            out.append([start, stop, float(util)])
    return [(a, b, u) for a, b, u in out]


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _reading(point: Any, position: int) -> tuple[Optional[float], Optional[float]]:
    if not isinstance(point, list) or len(point) < 2 or not isinstance(point[1], list):
        return None, None
    utils = point[1]
    return _number(point[0]), _number(utils[position]) if position < len(utils) else None


def of_run(record: dict[str, Any], start: float, end: float, resolution: float = 0.0) -> dict[str, list[Span]]:
    """Per GPU (its index as a string, as a run's lanes name it): the spans of the run from `start`
    to `end`; {} when the record has no attempt of that run. The attempt is found by its start
    rather than its number: a recovered job's attempts can repeat a number."""
    attempts = record.get("attempts")
    for attempt in attempts.values() if isinstance(attempts, dict) else ():
        started = _number(attempt.get("started")) if isinstance(attempt, dict) else None
        if started is not None and abs(started - start) <= START_SLACK:
            gpus = attempt.get("gpus")
            if not isinstance(gpus, list):
                return {}
            found = {str(gpu): spans(attempt, n, end, resolution) for n, gpu in enumerate(gpus)}
            return {gpu: series for gpu, series in found.items() if series}
    return {}


def of_runs(spool: Spool, runs: Iterable[Any]) -> dict[tuple[int, float], dict[str, list[Span]]]:
    """For each run (a PastRun: `job_id`, `start`, `end`) whose job has a GPU record with that
    attempt: (job id, start) -> its spans per GPU. Spans are merged up to 1/SPANS_ACROSS of the
    whole timeline, so thousands of long runs stay quick to draw."""
    runs = list(runs)
    if not runs:
        return {}
    recorded = spool.reports.gpu_use_ids()
    resolution = (max(r.end for r in runs) - min(r.start for r in runs)) / SPANS_ACROSS
    records: dict[int, dict[str, Any]] = {}
    out = {}
    for run in runs:
        if run.job_id not in recorded:
            continue
        if run.job_id not in records:
            records[run.job_id] = spool.reports.read_gpu_use(run.job_id)
        found = of_run(records[run.job_id], run.start, run.end, resolution)
        if found:
            out[(run.job_id, run.start)] = found
    return out
