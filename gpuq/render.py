"""Formatting for people: the status table, durations, log tails. No spool access here."""

from __future__ import annotations

import os
import time
import unicodedata
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from gpuq import jobs

SYMBOLS = {
    "pending": "⏳",
    "running": "🔄",
    "done": "✅",
    "failed": "❌",
    "preempted": "💤",
    "interrupted": "⚡",
    "cancelled": "🚫",
}


def width(text: str) -> int:
    """Columns a string takes in a terminal (emoji and CJK take two)."""
    return sum(
        2 if unicodedata.east_asian_width(c) in ("W", "F") else 0 if unicodedata.combining(c) else 1 for c in text
    )


def pad(text: str, cols: int, right: bool = False) -> str:
    gap = " " * max(0, cols - width(text))
    return gap + text if right else text + gap


def duration(seconds: Optional[float]) -> str:
    if seconds is None or seconds < 0:
        return ""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def elapsed(job: dict[str, Any], now: float) -> Optional[float]:
    start = jobs.parse_iso(job.get("started_at"))
    if start is None:
        return None
    end = jobs.parse_iso(job.get("finished_at")) or now
    return end - start


def info(job: dict[str, Any], state: str, wait: Any = None) -> str:
    parts = []
    if state == "running":
        parts.append(f"pid={job.get('pid')}" if job.get("pid") else "starting")
        if job.get("slot") is not None:
            parts.append(f"gpu={job['slot']}")
        if job.get("retries"):
            parts.append(f"attempt {job.get('attempts')}/{job['retries'] + 1}")
    elif state == "pending":
        if wait is not None:
            parts.append(("blocked: " if wait.forever else "") + wait.reason)
        elif job.get("after"):
            parts.append("after " + ", ".join(f"#{d}" for d in job["after"]) + " (met)")
        if job.get("attempts") or job.get("history"):
            parts.append(job.get("note") or "retry")
    elif job.get("exit_code") is not None:
        parts.append(f"exit={job['exit_code']}" + (f" ({job['signal']})" if job.get("signal") else ""))
    if state in ("interrupted", "cancelled", "preempted") and job.get("note"):
        parts.append(job["note"])
    if job.get("priority"):
        parts.append(f"prio={job['priority']}")
    return "  ".join(parts)


def status_table(rows: list[Any], now: Optional[float] = None) -> list[str]:
    now = time.time() if now is None else now
    header = ["ID", "St", "Name", "Script", "Time", "Info"]
    table = [header]
    for row in rows:
        job = row.job
        table.append(
            [
                str(job["id"]),
                SYMBOLS.get(row.state, "?"),
                job["name"],
                jobs.display_script(job["cmd"]),
                duration(elapsed(job, now)),
                info(job, row.state, row.wait),
            ]
        )
    cols = [max(width(r[i]) for r in table) for i in range(len(header) - 1)]
    lines = []
    for n, r in enumerate(table):
        cells = [pad(r[0], cols[0], right=True)] + [pad(r[i], cols[i], right=(i == 4)) for i in range(1, 5)]
        lines.append("  ".join(cells + [r[5]]).rstrip())
        if n == 0:
            lines.append("─" * (sum(cols) + 2 * len(cols) + 4))
    return lines


def worker_line(workers: list[dict[str, Any]], pending: int) -> str:
    if not workers:
        tail = f" — {pending} pending job(s) will not start until `gpuq run` or `gpuq run --daemon`" if pending else ""
        return "worker: none running" + tail
    parts = []
    for w in workers:
        since = datetime.fromtimestamp(w.get("started", time.time())).strftime("%Y-%m-%d %H:%M:%S")
        gpus = ",".join(w["gpus"]) if w.get("gpus") else "all"
        parts.append(f"pid {w.get('pid')} since {since} (gpus: {gpus}{', watching' if w.get('watch') else ''})")
    return "worker: running, " + "; ".join(parts)


def tail_lines(path: Path, count: int, block: int = 65536) -> list[str]:
    """The last `count` lines of a file, reading backwards from its end (a 1 GB log costs the
    same as a 1 KB one). tqdm's carriage returns count as line breaks."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        size = os.fstat(fd).st_size
        data, offset = b"", size
        while offset > 0 and data.count(b"\n") + data.count(b"\r") <= count:
            step = min(block, offset)
            offset -= step
            data = os.pread(fd, step, offset) + data
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines[-count:] if count else []
