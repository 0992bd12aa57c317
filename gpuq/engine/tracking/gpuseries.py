"""A job's recorded GPU utilisation as spans (start, end, percent) for `history --plot`: a point of
an attempt's GPU record stands for the time since the one before it."""

from __future__ import annotations

from typing import Any, Iterable, Optional

from gpuq.spool import Spool

Span = tuple[float, float, float]

START_SLACK = 1.0  # seconds: a record's attempt and a run are the same when their starts are this close
SPANS_ACROSS = 1000  # at most this many spans across the whole timeline: finer than a figure's pixels


def spans(attempt: dict[str, Any], position: int, end: float, resolution: float = 0.0) -> list[Span]:
    """The attempt's `position`th GPU's utilisation until `end`; neighbouring spans merged (their
    time-weighted mean) when equal or shorter than `resolution` seconds."""
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
    """Per GPU (its index as a string, as a run's lanes): the spans of the run from `start` to `end`;
    {} without that attempt, found by its start (a recovered job's can repeat a number)."""
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
    """(job id, start) -> each PastRun's spans per GPU, merged up to 1/SPANS_ACROSS of the timeline."""
    runs = list(runs)
    if not runs:
        return {}
    recorded = spool.reports.gpu_use_ids()
    resolution = (max(r.end for r in runs) - min(r.start for r in runs)) / SPANS_ACROSS
    wanted = {run.job_id for run in runs} & recorded
    records = {job_id: spool.reports.read_gpu_use(job_id) for job_id in wanted}
    found = [
        ((run.job_id, run.start), of_run(records[run.job_id], run.start, run.end, resolution))
        for run in runs
        if run.job_id in records
    ]
    return {key: series for key, series in found if series}
