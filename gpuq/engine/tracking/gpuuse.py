"""What the GPUs did for each job: its supervisor samples them and keeps, per attempt, exact totals
and a series halved when long (spool_layout.md, section 9). A sample stands for the time since the
one before it."""

from __future__ import annotations

import os
from typing import Any, Optional

from gpuq.core.timespec import format_duration
from gpuq.core.words import mib_text
from gpuq.spool import Spool

SAMPLE_ENV, IDLE_ENV = "GPUQ_GPU_SAMPLE_SECONDS", "GPUQ_GPU_IDLE_MINUTES"
DEFAULT_SAMPLE_SECONDS, DEFAULT_IDLE_MINUTES = 10.0, 15.0
IDLE_PERCENT = 10  # below this a GPU counts as idle
MAX_POINTS = 720  # a series longer than this is halved (neighbours merged): 2 h at 10 s, then coarser


def _positive(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        return default
    return value if value > 0 else default


def sample_seconds() -> float:
    return _positive(SAMPLE_ENV, DEFAULT_SAMPLE_SECONDS)


def idle_limit_seconds() -> float:
    return _positive(IDLE_ENV, DEFAULT_IDLE_MINUTES) * 60


def new_attempt(gpus: list[int], started: float) -> dict[str, Any]:
    n = len(gpus)
    return {
        "gpus": list(gpus),
        "started": started,
        "at": started,  # the newest sample's time
        "seconds": [0.0] * n,  # per GPU: time with a known utilisation
        "util_seconds": [0.0] * n,  # per GPU: utilisation (percent) times seconds, for the mean
        "idle_seconds": [0.0] * n,
        "idle_since": [None] * n,
        "peak_mem_mib": [0] * n,
        "points": [],  # [time, [utilisation per GPU], [memory MiB per GPU]]
    }


def add_sample(attempt: dict[str, Any], at: float, utils: list[Optional[int]], mems: list[Optional[int]]) -> None:
    """One look at the attempt's GPUs (in the order of `gpus`; None: not known) at time `at`."""
    span = max(0.0, at - attempt["at"])
    for n, util in enumerate(utils):
        if mems[n] is not None:
            attempt["peak_mem_mib"][n] = max(attempt["peak_mem_mib"][n], mems[n])
        if util is None:
            continue
        attempt["seconds"][n] += span
        attempt["util_seconds"][n] += util * span
        if util < IDLE_PERCENT:
            attempt["idle_seconds"][n] += span
            if attempt["idle_since"][n] is None:
                attempt["idle_since"][n] = attempt["at"]  # idle through the span this sample stands for
        else:
            attempt["idle_since"][n] = None
    attempt["at"] = at
    attempt["points"].append([round(at, 1), list(utils), list(mems)])
    if len(attempt["points"]) > MAX_POINTS:
        attempt["points"] = _halved(attempt["points"])


def _halved(points: list) -> list:
    """Neighbours merged: the later time, the mean utilisation, the larger memory."""
    out = []
    for first, second in zip(points[0::2], points[1::2]):
        utils = [_mean2(a, b) for a, b in zip(first[1], second[1])]
        mems = [max((m for m in (a, b) if m is not None), default=None) for a, b in zip(first[2], second[2])]
        out.append([second[0], utils, mems])
    if len(points) % 2:
        out.append(points[-1])
    return out


def _mean2(a: Optional[int], b: Optional[int]) -> Optional[int]:
    known = [v for v in (a, b) if v is not None]
    return round(sum(known) / len(known)) if known else None


def _attempts(record: dict[str, Any]) -> list[dict[str, Any]]:
    attempts = record.get("attempts")
    return [a for a in attempts.values() if isinstance(a, dict)] if isinstance(attempts, dict) else []


def summary(attempts: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """`mean_util` (percent, time-weighted; None: never known), `peak_mem_mib`, `gpu_hours_idle`
    over `attempts`; None when there are none."""
    if not attempts:
        return None
    seconds = sum(sum(a.get("seconds") or ()) for a in attempts)
    busy = sum(sum(a.get("util_seconds") or ()) for a in attempts)
    idle = sum(sum(a.get("idle_seconds") or ()) for a in attempts)
    peak = max((max(a.get("peak_mem_mib") or (0,)) for a in attempts), default=0)
    return {
        "mean_util": round(busy / seconds, 1) if seconds else None,
        "peak_mem_mib": peak,
        "gpu_hours_idle": round(idle / 3600, 4),
    }


def of_jobs(spool: Spool, job_ids: list[int], recorded: Optional[set[int]] = None) -> Optional[dict[str, Any]]:
    """The summary over these jobs' records (a `history` group); `recorded`: gpu_use_ids(), if had."""
    recorded = spool.reports.gpu_use_ids() if recorded is None else recorded
    jobs = [job_id for job_id in job_ids if job_id in recorded]
    return summary([a for job_id in jobs for a in _attempts(spool.reports.read_gpu_use(job_id))])


def of_job(spool: Spool, job_id: int) -> Optional[dict[str, Any]]:
    return summary(_attempts(spool.reports.read_gpu_use(job_id)))


def summary_text(figures: dict[str, Any]) -> str:
    """'mean 51% utilisation, peak 3.9 GiB, 0.12 GPU-hours idle (7m 12s)'"""
    mean = figures["mean_util"]
    idle = figures["gpu_hours_idle"]
    return (
        f"mean {'?' if mean is None else f'{mean:g}'}% utilisation, peak {mib_text(figures['peak_mem_mib'])}, "
        f"{idle:.2f} GPU-hours idle ({format_duration(idle * 3600)})"
    )


def idle_now(record: dict[str, Any], attempt: Any, limit: float) -> list[tuple[int, float]]:
    """(GPU index, seconds idle) of each GPU of `attempt` idle longer than `limit` at its newest sample."""
    current = (record.get("attempts") or {}).get(str(attempt))
    if not isinstance(current, dict):
        return []
    at = current.get("at") or 0
    pairs = zip(current.get("gpus") or (), current.get("idle_since") or ())
    return [(gpu, at - since) for gpu, since in pairs if since is not None and at - since > limit]


def idle_text(idle: list[tuple[int, float]]) -> str:
    """'GPU 0 idle 22 min: stuck in data loading or a debugger?'"""
    parts = ", ".join(f"GPU {gpu} idle {int(seconds // 60)} min" for gpu, seconds in idle)
    return f"{parts}: stuck in data loading or a debugger?"
