"""What the current attempt of a job has written: the one rule for telling it from earlier ones.

A job that is retried, resumed or recovered keeps its id, so its progress file and its log may
still hold what an earlier attempt wrote. The supervisor starts every attempt's part of the log
with a header line, and a progress file older than the attempt's start is an earlier attempt's.
"""

from __future__ import annotations

from gpuq.core.times import parse_iso
from gpuq.spool import Spool

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional

ATTEMPT_HEADER = b"=== gpuq: job #"  # the supervisor's first line of every attempt
MTIME_SLACK = 1.0  # seconds: file times are coarser than the ISO start time


def started(job: dict[str, Any]) -> float:
    return parse_iso(job.started_at) or 0.0


def progress_report(spool: Spool, job: dict[str, Any]) -> Optional[tuple[dict[str, Any], float]]:
    """(contents, mtime) of the job's progress file if the current attempt wrote it."""
    report = spool.reports.read_progress(job.id)
    if report is None or report[1] < started(job) - MTIME_SLACK:
        return None
    return report


def log_tail(spool: Spool, job: dict[str, Any], limit: int) -> tuple[bytes, float]:
    """The last `limit` bytes of the job's log that the current attempt wrote, and the log's mtime."""
    tail, mtime = spool.logs.tail(job, limit)
    cut = tail.rfind(ATTEMPT_HEADER)
    return (tail[cut:] if cut >= 0 else tail), mtime
