"""`gpuq status`: the queue as engine/views/status.py reads it, printed (`gpuq eta`: cmd_eta.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Optional, Union

from gpuq.cli import render
from gpuq.cli.common import spool
from gpuq.core.job import Job
from gpuq.core.times import iso_of
from gpuq.engine.views.status import CachedRow, Row, status
from gpuq.spool import Spool
from gpuq.system import security

# the fields of a job `status --json` gives, besides those of its row
JSON_FIELDS = """id name pid exit_code after after_any cmd cwd created_at started_at finished_at attempts retries
priority slot log note urgent preemptible checkpoint resumed_from resumed_from_step lost_steps no_resume preemptions
gpu_request gpu_mem_mib gpus mem_mib cpus reason time_limit begin_at code code_changed snapshot sweep slurm""".split()
# and those of its row: a damaged job file's row has them all, null
ROW_FIELDS = """state waiting progress eta_seconds starts_in_seconds eta_method progress_source adopted gpu_idle
retry_oom oom_retry keep_checkpoints min_free_bytes ckpt_bytes disk_wait stopping damaged""".split()


def cmd_status(args: argparse.Namespace) -> int:
    if not args.watch:
        return _status_once(args)
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n"
    while True:  # redrawn in place until Ctrl-C: exit 130 (gpuq.cli.main), as `wait` and `log -f`
        sys.stdout.write(clear)
        _status_once(args)
        print(f"(every {args.interval:g}s; Ctrl-C to stop)", flush=True)
        time.sleep(args.interval)


def _status_once(args: argparse.Namespace) -> int:
    sp = spool()
    if args.json:
        print(json.dumps(json_rows(sp, args.all), indent=2))
        return 0
    st = status(sp, show_all=args.all, damaged=render.damaged_cells, finished_view=True)
    print(render.worker_line(st.workers, st.outlook()))
    if st.gpus is not None:
        print("\n".join(render.gpu_lines(st.gpus, home=sp.home)))
    if st.rows or st.finished:
        rows = st.rows if args.all else render.group_sweeps(st.rows, st.hidden_sweeps)
        print("\n".join(render.status_table(rows, finished=st.finished)))
    else:
        print("no jobs")
    if st.hidden_finished:
        hidden, of_them = st.hidden_finished, f", {st.hidden_failed} of them failed" if st.hidden_failed else ""
        print(f"({hidden} older finished {'job' if hidden == 1 else 'jobs'} hidden{of_them}: `gpuq status -a`)")
    for name in st.dropped:
        print(f"pending/{security.display(name)}: dropped file, not taken in yet (a worker takes it in)")
    if (rejected := st.rejected) is not None:
        reason = f": {security.display(rejected.reason)}" if rejected.reason else ""  # may quote the file's content
        newest = f"{'' if rejected.count == 1 else 'newest: '}{security.display(rejected.newest)}{reason}"
        files = "dropped file" if rejected.count == 1 else "dropped files"
        print(f"{rejected.count} {files} rejected ({newest}): `gpuq rejected`")
    for warning in st.warnings:
        print(f"warning: {warning}")
    return 0


def json_rows(sp: Spool, show_all: bool) -> list[dict[str, Any]]:
    """`status --json` (also the MCP server's queue tool): a row per job, and per damaged job file."""
    return [json_row(row) for row in status(sp, show_all=show_all, damaged=lambda name, why: (name, why)).rows]


def json_row(row: Union[Row, CachedRow]) -> dict[str, Any]:
    """One job of `status --json`; a damaged job file's row has its fields null, says so in
    `damaged`, and names its `file` and, in `reason`, why it is no job."""
    job, est = row.job, row.estimate
    if isinstance(row, CachedRow):  # nothing of its file can be trusted but its name (and the id in it)
        name, why = row.cells
        damaged = {"id": job.id, "state": row.state, "damaged": True, "file": name, "reason": why}
        return dict.fromkeys(JSON_FIELDS + ROW_FIELDS) | damaged
    out = {key: job[key] for key in JSON_FIELDS}  # a field an older file lacks: its default, as Job reads it
    out["state"] = row.state
    out["waiting"] = row.wait.reason if row.wait else None
    out["progress"] = round(est.fraction, 4) if est and est.fraction is not None else None
    out["eta_seconds"] = round(est.eta_seconds, 1) if est and est.eta_seconds is not None else None
    out["starts_in_seconds"] = round(est.starts_in, 1) if est and est.starts_in is not None else None
    out["eta_method"] = est.method if est else None
    out["progress_source"] = est.reading.source if est and est.reading else None
    out["adopted"] = bool(job.adopted)
    out["gpu_idle"] = [{"gpu": gpu, "idle_seconds": round(seconds, 1)} for gpu, seconds in row.gpu_idle]
    out["retry_oom"] = job.retry_oom
    out["oom_retry"] = oom_retry(job)
    out["keep_checkpoints"] = job.keep_checkpoints
    out["min_free_bytes"] = job.min_free_bytes
    out["ckpt_bytes"] = job.ckpt_bytes
    out["disk_wait"] = row.disk_wait.reason if row.disk_wait else None
    asked, at = row.stopping or (None, None)  # a running job being killed or preempted: since when
    out["stopping"] = {"action": asked, "since": at and iso_of(at)} if asked else None
    out["damaged"] = False
    return out


def oom_retry(job: Job) -> Optional[dict[str, Any]]:
    """Where its out-of-memory retries stand, or None before the first: `retry` (GPUQ_OOM_RETRY of
    its current or next attempt), the share it runs with now, and why it changed (the newest
    attempt that ran out of memory: its reason and what the next got)."""
    if not job.oom_retries:
        return None
    last: dict[str, Any] = next((entry for entry in reversed(job.history) if entry.get("change")), {})
    return {
        "retry": job.oom_retries,
        "gpu_mem_mib": job.gpu_mem_mib,
        "gpu_largest": job.gpu_largest,
        "mem_mib": job.mem_mib,
        "attempt": last.get("attempt"),
        "reason": last.get("reason"),
        "change": last.get("change"),
    }
