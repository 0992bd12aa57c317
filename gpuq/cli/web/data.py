"""What `gpuq web` shows and does, as JSON-ready data, from what the CLI's commands call (`status`,
`show`, `triage`, `log`, the engine's typed requests). Nothing here knows of HTTP or HTML."""

from __future__ import annotations

import time
from typing import Any, Optional

from gpuq.cli import render
from gpuq.cli.cmd_status import json_row
from gpuq.cli.cmd_view import show_json
from gpuq.cli.top.model import GpuLine, Ring, gpu_lines, gpu_utils, mean_util, states_of
from gpuq.core import schema
from gpuq.core.errors import GpuqError, Refused
from gpuq.core.states import CANCELLED, FINISHED, HELD, PREEMPTED, RUNNING
from gpuq.core.times import duration
from gpuq.core.words import shown
from gpuq.engine.lifecycle import actions, requests
from gpuq.engine.schedule import gpuview
from gpuq.engine.tracking import gpuseries
from gpuq.engine.views.card import card, not_started
from gpuq.engine.views.status import status
from gpuq.engine.views.triage import triage
from gpuq.spool import Spool

PER_PAGE = 50  # finished jobs on a page, newest first
LOG_TAIL_BYTES = 64 * 1024  # what a job's page first shows of its log, read from the end
LOG_BEHIND_BYTES = 1 << 20  # a follower further behind than this jumps to the tail (a 1 GiB log is never read whole)
TRIAGE_LINES = 30
# The actions a job's page offers, each the request its CLI command makes, on the states the
# command table gives; CONFIRMED: those the page asks about first (work is lost or ended).
ON_IDS: dict[str, Any] = {
    "cancel": requests.Cancel,
    "kill": requests.Kill,
    "hold": requests.Hold,
    "release": requests.Release,
    "retry": requests.Retry,
    "resume": requests.Resume,
}
ACTIONS = (*ON_IDS, "preempt")
CONFIRMED = ("cancel", "kill", "preempt")
PREEMPT_TIMEOUT = 60.0  # as `gpuq preempt`'s default


def queue(sp: Spool, ring: Ring, page: int = 0) -> dict[str, Any]:
    """The queue (sweeps folded), with one page of the finished jobs, newest first."""
    now = time.time()
    st = status(sp, show_all=True, damaged=render.damaged_cells, finished_view=True)
    shown = st.gpus
    if shown is not None and shown.get("worker"):
        gpuview.add_leases(shown, sp.home)  # every user's leases as they are now, as `gpuq gpus` shows them
    ring.add(shown)
    unfinished = [row for row in st.rows if row.state not in FINISHED]
    utils = gpu_utils(shown)
    running: list[dict[str, Any]] = []
    waiting: list[dict[str, Any]] = []
    # a sweep's line counts all its jobs, as `gpuq status` does: its finished ones are on the pages
    done = {key: list(states) for key, states in st.hidden_sweeps.items()}
    for row in st.rows:
        if row.state in FINISHED and isinstance(row.job.sweep, dict):
            done.setdefault(row.job.sweep["id"], []).append(row.state)
    for row in render.group_sweeps(unfinished, done):
        (running if row.state == RUNNING else waiting).append(_row(row, unfinished, utils))
    total = len(st.finished) if st.finished is not None else sum(1 for row in st.rows if row.state in FINISHED)
    pages = max(1, -(-total // PER_PAGE))
    page = min(max(page, 0), pages - 1)  # a page past the end (jobs cleared meanwhile) is the last
    finished = _finished_page(st, page, now)
    return {
        "at": now,
        "worker": render.worker_line(st.workers, st.outlook(now)),
        "gpus": _gpus(shown, st.rows, sp.home, ring, now),
        RUNNING: running,  # the state's name as the page's key
        "waiting": waiting,
        "finished": finished,
        "page": page,
        "pages": pages,
        "finished_total": total,
        "warnings": list(st.warnings),
    }


def _row(row: Any, rows: list[Any], utils: dict[int, Optional[int]]) -> dict[str, Any]:
    if isinstance(row, render.SweepRow):
        name, script, _time, info = row.cells
        members = [r for r in rows if isinstance(r.job.sweep, dict) and r.job.sweep["id"] == row.job.id]
        return {
            "folded": True,
            "sweep": row.job.id,
            "state": row.state,
            "name": name,
            "script": script,
            "info": info,
            "jobs": [_row(member, [], utils) for member in members],
        }
    if getattr(row, "cells", None) is not None:  # a damaged job file: its cells say why
        return {"id": row.job.id, "state": row.state, "name": row.cells[0], "info": row.cells[-1]}
    out = json_row(row)
    out["info"] = render.info(row.job, row.state, row.wait, row.stopping)
    out["progress_text"] = render.progress_text(row.estimate, row.state, bar=False)
    out["script"] = schema.display_script(row.job.cmd)
    if row.state == RUNNING:
        out["util"] = mean_util(row.job, utils)
    return out


def _finished_page(st: Any, page: int, now: float) -> list[dict[str, Any]]:
    """One page of the finished jobs, newest first, from the index's rows when `status -a` would
    read them (many jobs), else from the few rows the view loaded."""
    start = page * PER_PAGE
    view = st.finished
    if view is not None:
        names, scripts, seconds, ends = view.columns
        newest = len(view) - 1 - start
        return [
            {
                "id": view.ids[at],
                "state": view.states[at],
                "name": names[at],
                "script": scripts[at],
                "ran": duration(seconds[at]) if seconds[at] is not None else "",
                "info": render.finished_info(view.states[at], *ends[at]),
                "exit_code": ends[at][0],
                "reason": ends[at][3] or None,
            }
            for at in range(newest, max(newest - PER_PAGE, -1), -1)
        ]
    rows = sorted((r for r in st.rows if r.state in FINISHED), key=lambda r: -r.job.id)
    out = []
    for row in rows[start : start + PER_PAGE]:
        job = row.job
        if getattr(row, "cells", None) is not None:  # a damaged file: its cells say why
            out.append({"id": job.id, "state": row.state, "name": row.cells[0], "info": row.cells[-1]})
            continue
        spent = render.elapsed(job, now)
        out.append(
            {
                "id": job.id,
                "state": row.state,
                "name": job.name,
                "script": schema.display_script(job.cmd),
                "ran": duration(spent) if spent is not None else "",
                "info": render.info(job, row.state),
                "exit_code": job.exit_code,
                "reason": job.reason,
            }
        )
    return out


def _gpus(
    shown: Optional[dict[str, Any]], rows: list[Any], home: str, ring: Ring, now: float
) -> Optional[dict[str, Any]]:
    if shown is None:
        return None
    lines = gpu_lines(shown, rows, home, ring)
    gpus = [{slot: getattr(line, slot) for slot in GpuLine.__slots__} for line in lines]
    return {"title": render.gpu_title(shown, now), "gpus": gpus}


def job(sp: Spool, job_id: int) -> dict[str, Any]:
    """A job's page; of the shell's environment only the names, as the assistant's tool gives them."""
    now = time.time()
    ref, found = actions.get(sp, job_id)
    shown = show_json(sp, ref, found, secrets=False)
    shown["shell_env_names"] = sorted(shown.pop("shell_env", None) or {})
    try:
        triaged: Optional[dict[str, Any]] = triage(sp, job_id, TRIAGE_LINES)
    except GpuqError:  # it moved or went meanwhile: the rest still says what it was
        triaged = None
    return {
        "id": job_id,
        "name": found.name,
        "state": ref.state,
        "card": card(sp, ref, found, now),
        "job": shown,
        "triage": triaged,
        "gpu_series": gpu_series(sp, found, now),
        "actions": [name for name in ACTIONS if ref.state in states_of(name)],
        "confirm": list(CONFIRMED),
        "not_started": not_started(sp, ref, found),
    }


def gpu_series(sp: Spool, found: Any, now: float) -> list[dict[str, Any]]:
    """Per GPU of the newest attempt with a record: [seconds since its start, percent] of each span."""
    record = sp.reports.read_gpu_use(found.id)
    attempts = record.get("attempts") if isinstance(record, dict) else None
    if not isinstance(attempts, dict) or not attempts:
        return []
    newest = max((a for a in attempts.values() if isinstance(a, dict)), key=lambda a: a.get("started") or 0, default={})
    started, gpus = newest.get("started"), newest.get("gpus")
    if not isinstance(started, (int, float)) or not isinstance(gpus, list):
        return []
    out = []
    for position, gpu in enumerate(gpus):
        spans = gpuseries.spans(newest, position, now)
        points = [[round(a - started, 1), round(u)] for a, _b, u in spans]
        if spans:
            points.append([round(spans[-1][1] - started, 1), round(spans[-1][2])])
            out.append({"gpu": gpu, "points": points})
    return out


def log(sp: Spool, job_id: int, offset: Optional[int]) -> dict[str, Any]:
    """The log from `offset` (None: its tail), at most LOG_BEHIND_BYTES, ending at a line's end
    while the job writes on; `offset` in the answer is where the next read starts."""
    ref, found = actions.get(sp, job_id)
    size = sp.logs.size(found)
    shrunk = offset is not None and offset > size  # cut by --max-log-size, or replaced: shown afresh
    if offset is None or offset > size or size - offset > LOG_BEHIND_BYTES:
        chunk, _mtime = sp.logs.tail(found, LOG_TAIL_BYTES)
        start = max(0, size - len(chunk))
        if start > 0 and b"\n" in chunk:  # begin at a whole line
            cut = chunk.index(b"\n") + 1
            chunk, start = chunk[cut:], start + cut
        skipped = start - (offset if offset is not None and not shrunk else 0)  # the page says so
    else:
        chunk, start, skipped = sp.logs.read_from(found, offset), offset, 0
    if ref.state == RUNNING and chunk[-1:] not in (b"", b"\n", b"\r") and len(chunk) < LOG_TAIL_BYTES:
        chunk = chunk[: max(chunk.rfind(b"\n"), chunk.rfind(b"\r")) + 1]  # the rest once its line is written
    return {
        "id": job_id,
        "state": ref.state,
        "text": shown(chunk.decode("utf-8", "replace")),  # escape sequences dropped
        "offset": start + len(chunk),
        "size": size,
        "skipped": skipped,
        "afresh": shrunk,
        "following": ref.state == RUNNING,
        "not_started": not_started(sp, ref, found),
    }


def act(sp: Spool, name: str, job_id: int) -> str:
    """One action on one job, said in a line; a refusal raises GpuqError with the CLI's reason."""
    if name == "preempt":
        stopped = requests.Preempt(id=job_id, timeout=PREEMPT_TIMEOUT).run(sp)
        if stopped.state == PREEMPTED:
            return f"job #{job_id} preempted: {stopped.job.note or 'it can be resumed'}"
        if stopped.left:
            raise Refused(f"job #{job_id} still saving after {PREEMPT_TIMEOUT:g}s: recorded preempted when it exits")
        raise Refused(f"job #{job_id} ended on its own meanwhile: {stopped.state}")
    request = ON_IDS.get(name)
    if request is None:
        raise Refused(f"no such action: {name}")
    done = request(ids=[job_id]).one(sp, job_id, lambda _job_id, _grace: None)  # a refusal raises
    said = {
        "cancel": render.killed_text(done.job, f"{CANCELLED}: it was running, killed") if done.killed else CANCELLED,
        "kill": render.killed_text(done.job),
        "hold": HELD,
        "release": "back in line",
        "retry": f"back in the queue: {done.how}",
        "resume": f"back in the queue: {done.how}",
    }[name]
    return f"job #{job_id} {done.job.name}: {said}"
