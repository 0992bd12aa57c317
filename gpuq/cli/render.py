"""Formatting for people: the status table, progress bars, ETA lines, the worker line. No spool access here."""

from __future__ import annotations

import time
import unicodedata
from bisect import bisect_left
from itertools import repeat
from operator import getitem
from typing import Any, Optional

from gpuq.core import schema
from gpuq.core.job import Job
from gpuq.core.states import (
    BY_NAME,
    CANCELLED,
    DONE,
    FAILED,
    HELD,
    HELD_NOTE,
    HERE_ONLY,
    PENDING,
    RAY,
    RUNNING,
    SLURM,
    STATES,
    TABLE,
    why_ended,
)
from gpuq.core.times import duration, parse_iso
from gpuq.core.words import dependencies_text, plural, stopped_text, stopping_text

IN_LINE = (RUNNING, PENDING, HELD)  # rows shown first, by id (engine/views/status.py's order)
SUMMED = (DONE, RUNNING, PENDING, HELD, FAILED)  # counted in every folded sweep's line (PENDING, HELD: waiting)

SYMBOLS = {state.name: state.glyph for state in TABLE}  # a dict: `status -a` maps it over every row


def width(text: str) -> int:
    """Columns in a terminal (emoji and CJK take two)."""
    if text.isascii():  # nearly every cell: per-character lookups made `status -a` slow
        return len(text)
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 0 if unicodedata.combining(c) else 1 for c in text)


def cut(text: str, columns: int) -> str:
    """`text` in at most `columns` columns, ended with `…` where cut: a wide character that does not
    fit whole is left out (half of it would not be drawn) with the combining marks that follow it."""
    if width(text) <= columns:
        return text
    used, at = 1, 0  # the `…` takes one
    while used + width(text[at]) <= columns:  # ends within the text: it is wider than `columns`
        used, at = used + width(text[at]), at + 1
    return text[:at] + "…"


HEADER = ("ID", "St", "Name", "Script", "Time", "Info")


def status_table(rows: list[Any], now: Optional[float] = None, finished: Any = None) -> list[str]:
    """`finished` (the spool's FinishedRows, as columns) merged in by id after the rows in line."""
    now = time.time() if now is None else now
    columns: list[list[str]] = [[title] for title in HEADER]
    for row in rows:
        if finished is None or row.state in IN_LINE:
            _add(columns, row, now)
    if finished is not None:  # the rows after those in line merge with it
        _merge_finished(columns, [row for row in rows if row.state not in IN_LINE], finished, now)
    return _table(columns)


def _table(columns: list[list[str]]) -> list[str]:
    """Column by column, with maps rather than a Python step per row: `status -a` shows 100,000 rows."""
    ascii_columns = ["".join(column).isascii() for column in columns[:5]]
    widths = [
        max(map(len, column) if plain else map(width, set(column))) for column, plain in zip(columns[:5], ascii_columns)
    ]
    padded = [
        _padded(column, w, right, plain)
        for column, w, right, plain in zip(columns, widths, (True, False, False, False, True), ascii_columns)
    ]
    lines = list(map(str.rstrip, map("  ".join, zip(*padded, columns[5]))))
    lines.insert(1, "─" * (sum(widths) + 14))
    return lines


def _padded(column: list[str], columns: int, right: bool, plain: bool) -> list[str]:
    if plain:
        return list(map(str.rjust if right else str.ljust, column, repeat(columns)))
    distinct = set(column)
    if len(distinct) > 256:  # non-ASCII names, say: cell by cell
        return [pad(cell, columns, right) for cell in column]
    filled = {cell: pad(cell, columns, right) for cell in distinct}  # the state symbols
    return list(map(filled.__getitem__, column))


def pad(cell: str, columns: int, right: bool = False) -> str:
    space = " " * (columns - width(cell))
    return space + cell if right else cell + space


def _add(columns: list[list[str]], row: Any, now: float) -> None:
    job, cells = row.job, getattr(row, "cells", None)  # some rows come with their cells
    if cells is None:
        progress = progress_text(getattr(row, "estimate", None), row.state)
        cells = [
            job.name,
            schema.display_script(job.cmd),
            duration(elapsed(job, now)),
            _join(progress, info(job, row.state, row.wait, row.stopping, now)),
        ]
    for column, cell in zip(columns, (str(job.id), SYMBOLS.get(row.state, "?"), *cells)):
        column.append(cell)


def _merge_finished(columns: list[list[str]], tail: list[Any], finished: Any, now: float) -> None:
    """The finished rows' cells, with the few `tail` rows (interrupted, preempted...) put in by id."""
    parts = _finished_cells(finished)
    start = 0
    for row in sorted(tail, key=lambda r: r.job.id):
        at = bisect_left(finished.ids, row.job.id, start)
        for column, part in zip(columns, parts):
            column += part[start:at]
        _add(columns, row, now)
        start = at
    for column, part in zip(columns, parts):
        column += part[start:]


def _finished_cells(finished: Any) -> tuple[Any, ...]:
    """Each distinct time and info (a state and an end) is made once: 100,000 rows hold a few hundred."""
    names, scripts, seconds, ends = finished.columns
    states = finished.states
    times = {s: duration(s) for s in set(seconds)}
    distinct = set(ends)  # rows share the same few ends: a state's info of each
    infos = {state: {end: finished_info(state, *end) for end in distinct} for state in set(states)}
    return (
        list(map(str, finished.ids)),
        list(map(SYMBOLS.get, states, repeat("?"))),
        names,
        scripts,
        list(map(times.__getitem__, seconds)),
        list(map(getitem, map(infos.__getitem__, states), ends)),
    )


def elapsed(job: Job, now: float) -> Optional[float]:
    start = parse_iso(job.started_at)
    return None if start is None else (parse_iso(job.finished_at) or now) - start


def info(
    job: Job,
    state: str,
    wait: Any = None,
    stopping: Optional[tuple[str, Optional[float]]] = None,
    now: Optional[float] = None,
) -> str:
    """`stopping`: a running row's (request, asked at), from engine/views/status.py."""
    parts = []
    exit_code = None  # shown for the states after a run
    if state == RUNNING:
        if stopping:
            parts.append(stopping_text(stopping[0], stopping[1], time.time() if now is None else now))
        if job.exit_code is not None:  # its end is noted, waiting for room on the disk (engine/views/status.py)
            parts.append(f"ended (exit {job.exit_code}), waiting for room on the disk to record it")
        else:
            parts.append(f"pid={job.pid}" if job.pid else "starting")
        if job.gpus == []:
            parts.append("cpu job")
        elif job.slot is not None:
            parts.append(f"gpu={job.slot}")
        if job.retries:
            parts.append(f"attempt {job.attempts}/{job.retries + 1}")
        if job.resumed_from:
            lost = f", lost {plural(job.lost_steps, 'step')}" if job.lost_steps is not None else ""
            parts.append(f"from {job.resumed_from.rstrip('/').rsplit('/', 1)[-1]}{lost}")
    elif state == PENDING:
        if wait is not None:
            parts.append(("blocked: " if wait.forever else "") + wait.reason)
        elif job.after or job.after_any:
            parts.append(dependencies_text(job.after, job.after_any) + " (met)")
        if job.attempts or job.history:
            parts.append(job.note or "retry")
    elif state == HELD:
        parts.append(f"held: `gpuq release {job.id}` puts it back in line")
        if job.after or job.after_any:
            parts.append(dependencies_text(job.after, job.after_any))
    elif state == SLURM:
        parts.append(slurm_text(job.slurm or {}))
    elif state == RAY:
        parts.append(ray_text(job.ray or {}))
        if job.attempts:  # submitted again after a failed attempt: why, as a pending retry says it
            parts.append(job.note or "retry")
    else:
        exit_code = job.exit_code
    slurm_job = (job.slurm or {}).get("job_id") if state != SLURM else None
    note = None if state == HELD and job.note == HELD_NOTE else job.note  # the row says "held" already
    notes = (job.signal, slurm_job, job.reason, job.code_changed, note)
    tail = finished_info(state, exit_code, *notes, job.priority)
    return "  ".join([*parts, tail] if tail else parts)


def finished_info(
    state: str,
    exit_code: Optional[int],
    signal: Optional[str],
    slurm_job: Optional[int],
    reason: Optional[str],
    code_changed: Optional[str],
    note: Optional[str],
    priority: Optional[int],
    unreadable: str = "",
) -> str:
    """The info cell of a finished job's row, and the end of any row's."""
    if unreadable:
        return f"unreadable job file: {unreadable}"
    parts = []
    if exit_code is not None:
        parts.append(f"exit={exit_code}" + (f" ({signal})" if signal else ""))
    if slurm_job:
        parts.append(f"on slurm {slurm_job}")
    why = why_ended(state, reason if state == FAILED else None, note)
    parts += [why] if why else []
    if code_changed:
        parts.append(code_changed)
    if priority:
        parts.append(f"prio={priority}")
    return "  ".join(parts)


def slurm_text(mark: dict[str, Any]) -> str:
    """`slurm 123 PENDING (Dependency)`."""
    reason = f" ({mark['reason']})" if mark.get("reason") else ""
    return f"slurm {mark.get('job_id') or '?'} {mark.get('state') or '?'}{reason}"


def ray_text(mark: dict[str, Any]) -> str:
    """`ray gpuq-ab12cd-3-1 RUNNING`, `ray - WAITING (waits for #2)`."""
    reason = f" ({mark['reason']})" if mark.get("reason") else ""
    return f"ray {mark.get('submission_id') or '-'} {mark.get('state') or '?'}{reason}"


def cancelled_text(job: Job) -> str:
    """`cancelled`, with what its cluster was told (or could not be) when it was on one."""
    if (job.note or "").startswith(HERE_ONLY):
        return job.note or ""
    if job.slurm:
        return f"{CANCELLED} (scancel of Slurm job {job.slurm.get('job_id')})"
    if job.ray and job.ray.get("submission_id"):
        return f"{CANCELLED} (Ray was asked to stop Ray job {job.ray['submission_id']})"
    return CANCELLED


def killed_text(job: Job, said: str = "killed") -> str:
    """What `gpuq kill` (`said`: or a cancel) did: a job on a cluster was stopped there and cancelled,
    no exit code known here; one that reached its end before the kill took effect is done."""
    if job.slurm or job.ray:
        return cancelled_text(job)
    if job.history and job.history[-1].get("outcome") == DONE:
        return f"{DONE}: {job.note}"
    if job.exit_code is not None:
        return f"{said} (exit {job.exit_code})"
    why = "an adopted process has no supervisor" if job.adopted else "its supervisor was gone"
    return f"{said} (exit code unknown: {why})"


def damaged_cells(file_name: str, reason: str) -> tuple[str, ...]:
    return (file_name, "", "", f"unreadable job file: {reason}")


BAR_CELLS = 10


def progress_bar(fraction: float, cells: int = BAR_CELLS, unicode: bool = True) -> str:
    """`[████▌     ]`, eighths of a cell where the font has them; `[####      ]` without."""
    fraction = max(0.0, min(1.0, fraction))
    if not unicode:
        full = int(round(fraction * cells))
        return "[" + "#" * full + " " * (cells - full) + "]"
    full, part = divmod(int(round(fraction * cells * 8)), 8)
    partial = " ▏▎▍▌▋▊▉"[part] if full < cells else ""
    return "[" + "█" * full + (partial if part else "") + " " * (cells - full - (1 if part else 0)) + "]"


def progress_text(estimate: Any, state: str, bar: bool = True) -> str:
    """`[███▌      ] 35% ETA 4m10s` for a running job, `starts ~2m05s` for a pending one."""
    if estimate is None:
        return ""
    if state == PENDING:
        return f"starts ~{duration(estimate.starts_in) or '0s'}" if estimate.starts_in is not None else ""
    parts = []
    fraction = estimate.fraction
    if fraction is not None:
        parts.append(f"{progress_bar(fraction)} {fraction * 100:.0f}%" if bar else f"{fraction * 100:.0f}%")
    elif estimate.reading is not None:
        parts.append(estimate.reading.text())
    if estimate.eta_seconds is not None:
        parts.append(f"ETA {duration(estimate.eta_seconds) or '0s'}")
    elif estimate.reading is not None:
        parts.append("ETA ?")
    return " ".join(parts)


def _join(*parts: str) -> str:
    return "  ".join(p for p in parts if p)


def worker_line(workers: list[dict[str, Any]], outlook: tuple[int, int, int] = (0, 0, 0)) -> str:
    """The first line of `gpuq status`; without a worker, what that means for the pending jobs."""
    if not workers:
        return "worker: none running" + _without_worker(*outlook)
    parts = []
    for w in workers:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(w.get("started", time.time())))
        gpus = ",".join(w["gpus"]) if w.get("gpus") else "all"
        mode = ", draining: starting nothing new" if w.get("draining") else (", watching" if w.get("watch") else "")
        stopped = "; stopped: Ctrl-Z or SIGSTOP" if w.get("stopped") else ""  # alive, yet it starts nothing
        parts.append(f"pid {w.get('pid')} since {since} (gpus: {gpus}{mode}{stopped})")
    asleep = [w["pid"] for w in workers if w.get("stopped")]
    line = ("worker: stopped, " if len(asleep) == len(workers) else "worker: running, ") + "; ".join(parts)
    return line + (f" — {stopped_text(asleep)}" if asleep else "")


def _without_worker(startable: int, later: int, blocked: int) -> str:
    if startable:
        return f" — {plural(startable, 'pending job')} will not start until `gpuq run` or `gpuq run --daemon`"
    if later:
        waits = "waits for its --begin time, then needs" if later == 1 else "wait for their --begin time, then need"
        return f" — {plural(later, 'pending job')} {waits} `gpuq run`"
    if blocked:
        return f" — nothing will start: {plural(blocked, 'pending job')} blocked (see why below)"
    return ""


def gpu_lines(view: dict[str, Any], now: Optional[float] = None, home: Optional[str] = None) -> list[str]:
    """One line per GPU, then one per lease of it but those of this spool's (`home`) jobs named
    already; last, a few lease problems."""
    lines = [gpu_title(view, time.time() if now is None else now)]
    for gpu in view.get("gpus") or []:
        used = f"{_gib(gpu['memory_used_mib'])}/{_gib(gpu['memory_total_mib'])} GiB"
        parts = [f"  GPU {gpu['index']}  {gpu['name']}  {used}"]
        if gpu.get("compute_mode", "default") != "default":  # an admin's `nvidia-smi -c`: never shared
            parts.append(gpu["compute_mode"])
        if gpu.get("jobs"):
            parts.append("jobs " + " ".join(f"#{j}" for j in gpu["jobs"]))
        foreign = gpu.get("foreign") or []
        lines.append("  ".join(parts + [f"other: {process_text(p)}" for p in foreign if not p.get("lease")]))
        for lease in gpu.get("leases") or []:
            ours = home is not None and lease.get("this_queue", lease.get("spool") == home)  # an older worker's: a path
            if not ours or lease.get("job") not in gpu.get("jobs", ()):
                size = "leased whole" if lease.get("whole") else f"{_gib(lease.get('mem_mib'))} GiB leased"
                since = time.strftime("%H:%M", time.localtime(parse_iso(lease.get("since")) or 0))
                using = [process_text(p, who=False) for p in foreign if p.get("lease") == lease.get("file")]
                lines.append(
                    f"    {size} by {lease.get('who')} since {since}" + (f" ({', '.join(using)})" if using else "")
                )
        for ticket in gpu.get("tickets") or []:
            lines.append(f"    {ticket_text(ticket)}")
    problems = view.get("lease_problems") or []  # a hostile directory may hold any number of bad files
    more = [f"and {len(problems) - 3} more lease problems (`gpuq gpus --json`)"] if len(problems) > 3 else []
    return lines + [f"  {problem}" for problem in problems[:3] + more]


def ticket_text(ticket: dict[str, Any]) -> str:
    """ "waiting: bob's job #3 (1 GPU) since 14:02": a job that waits for its turn on the GPU."""
    count = ticket.get("gpus") or 1
    size = f"{count} GPU{'s' if count != 1 else ''}"
    if ticket.get("mem_mib"):
        size += f", {_gib(ticket['mem_mib'])} GiB each"
    since = time.strftime("%H:%M", time.localtime(parse_iso(ticket.get("since")) or 0))
    return f"waiting: {ticket.get('who')} ({size}) since {since}"


def gpu_title(view: dict[str, Any], now: float) -> str:
    at = view.get("at")
    seen = f"seen {duration(now - at) or '0s'} ago" if at else "not seen"
    by = f" by worker {view['worker']}" if view.get("worker") else ""
    problem = f": {view['problem']}" if view.get("problem") else ""
    return f"GPUs ({view.get('source')}, {seen}{by}){problem}"


def process_text(proc: dict[str, Any], who: bool = True, unit: str = " GiB") -> str:
    size = f" {_gib(proc['used_memory_mib'])}{unit}" if proc.get("used_memory_mib") is not None else ""
    return f"pid {proc['pid']}" + (f" ({proc.get('who') or '?'})" if who else "") + size


def _gib(mib: Optional[int]) -> str:
    return f"{(mib or 0) / 1024:.1f}"


class SweepRow:
    __slots__ = ("job", "state", "cells")
    wait = None
    estimate = None

    def __init__(self, sweep_id: int, state: str, cells: tuple) -> None:
        self.job, self.state, self.cells = Job(id=sweep_id), state, cells


def group_sweeps(rows: list[Any], hidden: Optional[dict[int, list[str]]] = None) -> list[Any]:
    """Each sweep's jobs (two or more of them shown) folded into one SweepRow, where its first job
    stood; its line counts also the states in `hidden` (its finished jobs the rows leave out)."""
    members: dict[int, list[Any]] = {}
    for row in rows:
        sweep = row.job.sweep
        if isinstance(sweep, dict):
            members.setdefault(sweep["id"], []).append(row)
    out, shown = [], set()
    for row in rows:
        sweep = row.job.sweep
        group = members.get(sweep["id"]) if isinstance(sweep, dict) else None
        if not group or len(group) < 2:
            out.append(row)
        elif sweep["id"] not in shown:
            shown.add(sweep["id"])
            out.append(_sweep_row(sweep["id"], group, (hidden or {}).get(sweep["id"], [])))
    return out


def _sweep_row(sweep_id: int, group: list[Any], hidden: list[str]) -> SweepRow:
    states = [row.state for row in group] + hidden
    counts = {
        DONE: states.count(DONE),
        RUNNING: states.count(RUNNING),
        "waiting": sum(s in (PENDING, HELD) for s in states),
        FAILED: states.count(FAILED),
    }
    # The other states (cancelled, preempted, ...) only where some are, so that the counts add up.
    counts.update((other, states.count(other)) for other in STATES if other not in SUMMED and other in states)
    state = min(states, key=lambda s: BY_NAME[s].rank)  # the state that says most of the sweep
    first = group[0].job
    keys = list(first.sweep["values"])
    base = first.name.split(f" {keys[0]}=", 1)[0] if keys else first.name
    summary = ", ".join(f"{n} {what}" for what, n in counts.items())
    info = f"sweep of {len(states)} over {', '.join(keys)}: {summary} (`gpuq status -a` lists them)"
    running = [row for row in group if row.state == RUNNING and row.estimate is not None]
    if len(running) == 1:  # its bar; `#12 35% ETA 4m10s` each of more
        info = _join(progress_text(running[0].estimate, RUNNING), info)
    else:
        shown = ((row.job.id, progress_text(row.estimate, RUNNING, bar=False)) for row in running)
        info = _join(", ".join(f"#{job_id} {text}" for job_id, text in shown if text), info)
    return SweepRow(sweep_id, state, (f"sweep #{sweep_id} {base}", schema.display_script(first.cmd), "", info))
