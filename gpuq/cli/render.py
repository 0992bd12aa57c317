"""Formatting for people: the status table, progress bars, ETA lines, the worker line. No spool access here."""

from __future__ import annotations

import time
import unicodedata

from gpuq.core import schema
from gpuq.core.times import duration, parse_iso

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional

SYMBOLS = {
    "pending": "⏳",
    "running": "🔄",
    "done": "✅",
    "failed": "❌",
    "preempted": "💤",
    "interrupted": "⚡",
    "cancelled": "🚫",
    "held": "⏸️",
    "slurm": "🚀",
}


def width(text: str) -> int:
    """Columns a string takes in a terminal (emoji and CJK take two)."""
    if text.isascii():  # nearly every cell: per-character lookups made `status -a` slow
        return len(text)
    known = _WIDTHS.get(text)  # the state symbols, on every row
    if known is None:
        known = sum(
            2 if unicodedata.east_asian_width(c) in ("W", "F") else 0 if unicodedata.combining(c) else 1 for c in text
        )
        if len(_WIDTHS) < 4096:
            _WIDTHS[text] = known
    return known


_WIDTHS: dict[str, int] = {}


def elapsed(job: dict[str, Any], now: float) -> Optional[float]:
    start = parse_iso(job.get("started_at"))
    if start is None:
        return None
    end = parse_iso(job.get("finished_at")) or now
    return end - start


def info(job: dict[str, Any], state: str, wait: Any = None) -> str:
    parts = []
    if state == "running":
        parts.append(f"pid={job.get('pid')}" if job.get("pid") else "starting")
        if job.get("gpus") == []:
            parts.append("cpu job")
        elif job.get("slot") is not None:
            parts.append(f"gpu={job['slot']}")
        if job.get("retries"):
            parts.append(f"attempt {job.get('attempts')}/{job['retries'] + 1}")
        if job.get("resumed_from"):
            lost = f", lost {job['lost_steps']} steps" if job.get("lost_steps") is not None else ""
            parts.append(f"from {job['resumed_from'].rstrip('/').rsplit('/', 1)[-1]}{lost}")
    elif state == "pending":
        if wait is not None:
            parts.append(("blocked: " if wait.forever else "") + wait.reason)
        elif job.get("after"):
            parts.append("after " + ", ".join(f"#{d}" for d in job["after"]) + " (met)")
        if job.get("attempts") or job.get("history"):
            parts.append(job.get("note") or "retry")
    elif state == "slurm":
        parts.append(slurm_text(job.get("slurm") or {}))
    elif job.get("exit_code") is not None:
        parts.append(f"exit={job['exit_code']}" + (f" ({job['signal']})" if job.get("signal") else ""))
    if state != "slurm" and (job.get("slurm") or {}).get("job_id"):
        parts.append(f"on slurm {job['slurm']['job_id']}")
    if state == "failed" and job.get("reason"):
        parts.append(job["reason"])
    if job.get("code_changed"):
        parts.append(job["code_changed"])
    note = job.get("note")
    if note and job.get("reason") and "time limit" in note and "time limit" in job["reason"]:
        note = None  # said once, by the reason
    if state in ("interrupted", "cancelled", "preempted", "failed", "held") and note:
        parts.append(note)
    if job.get("priority"):
        parts.append(f"prio={job['priority']}")
    return "  ".join(parts)


def slurm_text(mark: dict[str, Any]) -> str:
    """`slurm 123 PENDING (Dependency)`: the Slurm job, its state and why it waits."""
    reason = f" ({mark['reason']})" if mark.get("reason") else ""
    return f"slurm {mark.get('job_id') or '?'} {mark.get('state') or '?'}{reason}"


def status_table(rows: list[Any], now: Optional[float] = None) -> list[str]:
    now = time.time() if now is None else now
    header = ["ID", "St", "Name", "Script", "Time", "Info"]
    table = [header]
    for row in rows:
        cells = getattr(row, "cells", None)  # finished rows come pre-rendered from the cache
        if cells is None:
            cells = row_cells(row.job, row.state, row.wait, getattr(row, "estimate", None), now)
        table.append((str(row.job["id"]), SYMBOLS.get(row.state, "?"), *cells))
    # Column by column, so that `status -a` with 100,000 rows stays well under a second.
    widths = [_widths(column) for column in list(zip(*table))[:5]]
    c0, c1, c2, c3, c4 = (max(w) for w in widths)
    lines = [
        f"{' ' * (c0 - w0)}{r[0]}  {r[1]}{' ' * (c1 - w1)}  {r[2]}{' ' * (c2 - w2)}  "
        f"{r[3]}{' ' * (c3 - w3)}  {' ' * (c4 - w4)}{r[4]}  {r[5]}".rstrip()
        for r, w0, w1, w2, w3, w4 in zip(table, *widths)
    ]
    lines.insert(1, "─" * (c0 + c1 + c2 + c3 + c4 + 14))
    return lines


def _widths(column: tuple[str, ...]) -> list[int]:
    return list(map(len, column)) if all(map(str.isascii, column)) else list(map(width, column))


def row_cells(job: dict[str, Any], state: str, wait: Any, estimate: Any, now: float) -> list[str]:
    """Name, script, time and info of one status row."""
    return [
        job["name"],
        schema.display_script(job["cmd"]),
        duration(elapsed(job, now)),
        _join(progress_text(estimate, state), info(job, state, wait)),
    ]


def finished_cells(job: dict[str, Any], state: str) -> tuple[str, ...]:
    """The cells of a finished job's row: they never change, so `gpuq status -a` caches them."""
    return tuple(row_cells(job, state, None, None, time.time()))


BAR_CELLS = 10


def progress_bar(fraction: float, cells: int = BAR_CELLS) -> str:
    """A compact bar: `[████▌     ]`, eighths of a cell where the font has them."""
    eighths = int(round(max(0.0, min(1.0, fraction)) * cells * 8))
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if full < cells else ""
    return "[" + "█" * full + (partial if part else "") + " " * (cells - full - (1 if part else 0)) + "]"


def progress_text(estimate: Any, state: str) -> str:
    """`[███▌      ] 35% ETA 4m10s` for a running job, `starts ~2m05s` for a pending one."""
    if estimate is None:
        return ""
    if state == "pending":
        return f"starts ~{duration(estimate.starts_in) or '0s'}" if estimate.starts_in is not None else ""
    parts = []
    fraction = estimate.fraction
    if fraction is not None:
        parts.append(f"{progress_bar(fraction)} {fraction * 100:.0f}%")
    elif estimate.reading is not None:
        parts.append(estimate.reading.text())
    if estimate.eta_seconds is not None:
        parts.append(f"ETA {duration(estimate.eta_seconds) or '0s'}")
    elif estimate.reading is not None:
        parts.append("ETA ?")
    return " ".join(parts)


def eta_lines(rows: list[Any]) -> list[str]:
    """`gpuq eta`: one line per job with its figures and the method behind each."""
    lines = []
    for row in rows:
        est, job = row.estimate, row.job
        head = f"#{job['id']} {job['name']} ({row.state}{', adopted' if job.get('adopted') else ''})"
        if row.state == "pending":
            end = f"; ends in ~{duration(est.eta_seconds) or '0s'}" if est.eta_seconds is not None else ""
            lines.append(f"{head}: {est.method}{end}")
            continue
        done = est.reading.text() if est.reading else "progress unknown"
        when = f"ETA {duration(est.eta_seconds) or '0s'}" if est.eta_seconds is not None else "ETA unknown"
        lines.append(f"{head}: {done}, {when}")
        lines.append(f"    method: {est.method}")
    return lines


def _join(*parts: str) -> str:
    return "  ".join(p for p in parts if p)


def worker_line(workers: list[dict[str, Any]], pending: int) -> str:
    if not workers:
        tail = f" — {pending} pending job(s) will not start until `gpuq run` or `gpuq run --daemon`" if pending else ""
        return "worker: none running" + tail
    parts = []
    for w in workers:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(w.get("started", time.time())))
        gpus = ",".join(w["gpus"]) if w.get("gpus") else "all"
        mode = ", draining: starting nothing new" if w.get("draining") else (", watching" if w.get("watch") else "")
        parts.append(f"pid {w.get('pid')} since {since} (gpus: {gpus}{mode})")
    return "worker: running, " + "; ".join(parts)


def gpu_lines(view: dict[str, Any], now: Optional[float] = None) -> list[str]:
    """One line per GPU: index, name, memory used / total, gpuq's jobs on it, other processes."""
    now = time.time() if now is None else now
    age = duration(now - view["at"]) if view.get("at") else ""
    seen = f"seen {age or '0s'} ago" + (f" by worker {view['worker']}" if view.get("worker") else "")
    lines = [f"GPUs ({view.get('source')}, {seen})" + (f": {view['problem']}" if view.get("problem") else "")]
    for gpu in view.get("gpus") or []:
        used = f"{_gib(gpu['memory_used_mib'])}/{_gib(gpu['memory_total_mib'])} GiB"
        parts = [f"  GPU {gpu['index']}  {gpu['name']}  {used}"]
        if gpu.get("jobs"):
            parts.append("jobs " + " ".join(f"#{j}" for j in gpu["jobs"]))
        for proc in gpu.get("foreign") or []:
            size = f" {_gib(proc['used_memory_mib'])} GiB" if proc.get("used_memory_mib") is not None else ""
            parts.append(f"other: pid {proc['pid']} ({proc.get('who') or '?'}){size}")
        lines.append("  ".join(parts))
    return lines


def _gib(mib: Optional[int]) -> str:
    return f"{(mib or 0) / 1024:.1f}"


class SweepRow:
    """The one line `gpuq status` shows for the jobs of a sweep (`status -a` lists them)."""

    __slots__ = ("job", "state", "cells")
    wait = None
    estimate = None

    def __init__(self, sweep_id: int, state: str, cells: tuple) -> None:
        self.job, self.state, self.cells = {"id": sweep_id}, state, cells


SWEEP_ORDER = ("running", "pending", "held", "failed", "interrupted", "preempted", "cancelled", "done")


def group_sweeps(rows: list[Any]) -> list[Any]:
    """Rows with each sweep's jobs (two or more of them shown) folded into one SweepRow, where
    its first job stood, saying how many of them are done, running, waiting and failed."""
    members: dict[int, list[Any]] = {}
    for row in rows:
        sweep = row.job.get("sweep")
        if isinstance(sweep, dict):
            members.setdefault(sweep["id"], []).append(row)
    out, shown = [], set()
    for row in rows:
        sweep = row.job.get("sweep")
        group = members.get(sweep["id"]) if isinstance(sweep, dict) else None
        if not group or len(group) < 2:
            out.append(row)
        elif sweep["id"] not in shown:
            shown.add(sweep["id"])
            out.append(_sweep_row(sweep["id"], group))
    return out


def _sweep_row(sweep_id: int, group: list[Any]) -> SweepRow:
    states = [row.state for row in group]
    counts = {
        "done": states.count("done"),
        "running": states.count("running"),
        "waiting": sum(s in ("pending", "held") for s in states),
        "failed": states.count("failed"),
    }
    state = min(states, key=lambda s: SWEEP_ORDER.index(s) if s in SWEEP_ORDER else len(SWEEP_ORDER))
    first = group[0].job
    keys = list(first["sweep"]["values"])
    base = first["name"].split(f" {keys[0]}=", 1)[0] if keys else first["name"]
    summary = ", ".join(f"{n} {what}" for what, n in counts.items())
    info = f"sweep of {len(group)} over {', '.join(keys)}: {summary} (`gpuq status -a` lists them)"
    return SweepRow(sweep_id, state, (f"sweep #{sweep_id} {base}", schema.display_script(first["cmd"]), "", info))
