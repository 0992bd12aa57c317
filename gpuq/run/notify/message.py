"""What a notification says: plain fields, a `title` and a `body` made from them, and the Apprise
message type. FINISHED, GPU_IDLE and STUCK also reach `--on-finish` as GPUQ_EVENT.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from gpuq.core.job import Job
from gpuq.core.states import DONE, FAILED, INTERRUPTED, why_ended
from gpuq.core.times import duration, parse_iso

FINISHED, GPU_IDLE, STUCK, QUEUE_EMPTY = "finished", "gpu_idle", "stuck", "queue_empty"
_SAID = {GPU_IDLE: "GPU idle", STUCK: "stuck"}


def host() -> str:
    return os.uname().nodename


def of_job(job: Job, state: str, event: str = FINISHED, reason: Optional[str] = None) -> dict[str, Any]:
    """The message of `event` for `job`; `reason` defaults to why it ended as status says it, or its exit code."""
    start = parse_iso(job.started_at)
    # how long its last attempt ran (so far, for a running job)
    end = (parse_iso(job.finished_at) if event == FINISHED and job.finished_at else None) or time.time()
    seconds = None if start is None else max(0.0, end - start)
    if reason is None and event == FINISHED:
        reason = why_ended(state, job.reason, job.note) or (
            f"exit {job.exit_code}" if job.exit_code not in (None, 0) else None
        )
    fields = {
        "event": event,
        "id": job.id,
        "name": job.name,
        "state": state,
        "reason": reason,
        "run_time": duration(seconds) or None,
        "run_seconds": None if seconds is None else round(seconds, 1),
        "host": host(),
    }
    what = state if event == FINISHED else _SAID.get(event, event)
    title = f"gpuq: job #{job.id} {what} on {fields['host']}"
    lines = [f"{job.name} (#{job.id}): {state}"]
    lines += [
        f"{label}: {fields[key]}" for label, key in (("reason", "reason"), ("run time", "run_time")) if fields[key]
    ]
    lines.append(f"host: {fields['host']}")
    kind = "success" if state == DONE else "failure" if state in (FAILED, INTERRUPTED) else "warning"
    kind = kind if event == FINISHED else "warning"
    return {"fields": fields, "title": title, "body": "\n".join(lines), "type": kind}


def queue_empty() -> dict[str, Any]:
    fields = {"event": QUEUE_EMPTY, "host": host()}
    body = f"nothing runs and nothing waits that could start (`gpuq status` on {fields['host']})"
    return {"fields": fields, "title": f"gpuq: queue empty on {fields['host']}", "body": body, "type": "info"}
