"""`gpuq status`, `eta`, `log`, `show`: read the queue and print it."""

from __future__ import annotations

import sys
import time

from gpuq.cli import render
from gpuq.cli.common import spool
from gpuq.core import jsontext
from gpuq.core.states import ACTIVE, CANCELLED, HELD, PENDING, RUNNING
from gpuq.engine.views.status import Row, status
from gpuq.system import security

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional

JSON_FIELDS = (
    "id",
    "name",
    "pid",
    "exit_code",
    "after",
    "after_any",
    "cmd",
    "cwd",
    "created_at",
    "started_at",
    "finished_at",
    "attempts",
    "retries",
    "priority",
    "slot",
    "log",
    "note",
    "urgent",
    "preemptible",
    "checkpoint",
    "resumed_from",
    "resumed_from_step",
    "lost_steps",
    "no_resume",
    "preemptions",
    "gpu_request",
    "gpu_mem_mib",
    "gpus",
    "mem_mib",
    "cpus",
    "reason",
    "time_limit",
    "begin_at",
    "code",
    "code_changed",
    "snapshot",
    "sweep",
    "slurm",
)


def cmd_status(args: argparse.Namespace) -> int:
    if args.watch:
        return _watch(args)
    return _status_once(args)


def _watch(args: argparse.Namespace) -> int:
    """The status, redrawn in place every --interval seconds until Ctrl-C."""
    import sys
    import time

    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n"
    try:
        while True:
            sys.stdout.write(clear)
            _status_once(args)
            print(f"(every {args.interval:g}s; Ctrl-C to stop)", flush=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def _status_once(args: argparse.Namespace) -> int:
    sp = spool()
    st = status(sp, show_all=args.all, damaged=None if args.json else render.damaged_cells)
    if args.json:
        print(jsontext.dumps([json_row(r) for r in st.rows], indent=2))
        return 0
    print(render.worker_line(st.workers, st.outlook()))
    if st.gpus is not None:
        print("\n".join(render.gpu_lines(st.gpus, home=sp.home)))
    if st.rows or st.finished:
        rows = st.rows if args.all else render.group_sweeps(st.rows)
        print("\n".join(render.status_table(rows, finished=st.finished)))
    else:
        print("no jobs")
    if st.hidden_finished:
        print(render.hidden_line(st.hidden_finished, st.hidden_failed))
    for name in st.dropped:
        print(f"pending/{security.display(name)}: dropped file, not taken in yet (a worker takes it in)")
    if st.rejected is not None:
        print(render.rejected_line(st.rejected))
    for warning in st.warnings:
        print(f"warning: {warning}")
    return 0


def json_row(row: Row) -> dict[str, Any]:
    job = row.job
    out = {key: job.get(key) for key in JSON_FIELDS}
    out["state"] = row.state
    out["waiting"] = row.wait.reason if row.wait else None
    est = row.estimate
    out["progress"] = round(est.fraction, 4) if est and est.fraction is not None else None
    out["eta_seconds"] = round(est.eta_seconds, 1) if est and est.eta_seconds is not None else None
    out["starts_in_seconds"] = round(est.starts_in, 1) if est and est.starts_in is not None else None
    out["eta_method"] = est.method if est else None
    out["progress_source"] = est.reading.source if est and est.reading else None
    out["adopted"] = bool(job.adopted)
    out["gpu_idle"] = [{"gpu": gpu, "idle_seconds": round(seconds, 1)} for gpu, seconds in row.gpu_idle]
    return out


def cmd_rejected(args: argparse.Namespace) -> int:
    """The dropped files that were not jobs, each with why; `status` stops mentioning them."""
    from gpuq.core.times import iso_of
    from gpuq.engine.views.status import rejected_files

    listed = rejected_files(spool())
    if args.json:
        shown = [{"file": name, "rejected_at": iso_of(at) if at else None, "reason": why} for name, at, why in listed]
        print(jsontext.dumps(shown, indent=2, ensure_ascii=False))
        return 0
    if not listed:
        print("no rejected files")
    for name, at, why in listed:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at else "?"
        print(f"rejected/{security.display(name)}  {when}  {security.display(why) or '(no reason recorded)'}")
    return 0


def cmd_eta(args: argparse.Namespace) -> int:
    sp = spool()
    if args.id is not None:
        from gpuq.engine.lifecycle import actions  # only here: 35 ms of imports that `gpuq eta` alone needs not

        actions.get(sp, args.id)  # "no such job #N" as a one-line error
    rows = [r for r in status(sp).rows if r.estimate is not None]  # running and pending rows
    if args.id is not None:
        rows = [r for r in rows if r.job["id"] == args.id]
        if not rows:
            state = actions.get(sp, args.id)[0].state
            print(f"#{args.id}: {state}; an ETA is given for running and pending jobs only")
            return 0
    if not rows:
        print("no running or pending jobs")
    for line in render.eta_lines(rows):
        print(line)
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import actions
    from gpuq.engine.views.card import not_started

    sp = spool()
    ref, job = actions.get(sp, args.id)
    why = not_started(sp, ref, job)
    if why is not None:  # said on stderr: the log itself (stdout) is empty
        if ref.state == CANCELLED:
            print(f"#{job.id} never started ({why})", file=sys.stderr)
            return 0
        if not args.follow:
            print(f"#{job.id} has not started yet ({why})", file=sys.stderr)
            return 0
        print(f"waiting for #{job.id} to start ({why})...", file=sys.stderr, flush=True)
        job = _await_start(sp, job)
        if job is not None:
            _follow(sp, job, offset=0)
        return 0
    for line in sp.logs.tail_lines(job, args.lines):
        print(line)
    if args.follow:
        _follow(sp, job)
    return 0


FOLLOW_POLL_SECONDS = 0.2  # a log has no event to wait on that works everywhere


def _await_start(sp: Any, job: dict[str, Any]) -> Any:
    """`gpuq log -f` of a job that has not started: the job once it has (or has written to its
    log); None, said on stderr, if it was cancelled first."""
    from gpuq.engine.lifecycle import actions
    from gpuq.engine.views.card import not_started

    while sp.jobs.find(job.id, (PENDING, HELD)) is not None and not sp.logs.size(job):
        time.sleep(FOLLOW_POLL_SECONDS)
    ref, job = actions.get(sp, job.id)
    why = not_started(sp, ref, job)
    if why is not None:  # cancelled while it waited
        print(f"#{job.id} never started ({why})", file=sys.stderr)
        return None
    return job


def _follow(sp: Any, job: dict[str, Any], offset: Optional[int] = None) -> None:
    """`gpuq log -f`: print the log as it grows (from `offset`, else its end) until its job
    stops running."""
    offset = sp.logs.size(job) if offset is None else offset
    while True:
        running = sp.jobs.find(job.id, ACTIVE) is not None
        chunk = sp.logs.read_from(job, offset)
        if chunk:
            offset += len(chunk)
            sys.stdout.write(chunk.decode("utf-8", "replace"))
            sys.stdout.flush()
        elif not running:
            return
        else:
            time.sleep(FOLLOW_POLL_SECONDS)


def cmd_show(args: argparse.Namespace) -> int:
    """What a person asks about the job, one labelled line each (engine/views/card.py). The
    environment inherited from the shell that queued it (tens of variables, tokens included) is
    only counted: --env lists it; --json is the file as it is, with its state."""
    from gpuq.engine.lifecycle import actions

    sp = spool()
    ref, job = actions.get(sp, args.id)
    if args.env:
        print(jsontext.dumps({"env": job.env, "shell_env": job.shell_env}, indent=2, ensure_ascii=False))
    elif args.json:
        print(jsontext.dumps(show_json(sp, ref, job), indent=2, ensure_ascii=False))
    else:
        from gpuq.engine.views.card import card

        lines = card(sp, ref, job)
        width = max(len(label) for label, _text in lines)
        print(f"#{job.id} {job.name}")
        print("\n".join(f"  {label.ljust(width)}  {text}" for label, text in lines))
    return 0


def show_json(sp: Any, ref: Any, job: dict[str, Any]) -> dict[str, Any]:
    """`gpuq show ID --json` (also the assistant server's `job` tool): the file, with its state."""
    from gpuq.engine.lifecycle import actions
    from gpuq.engine.tracking import gpuuse

    shown = dict(job, state=ref.state, file=ref.name, gpu_use=gpuuse.of_job(sp, job.id))
    if isinstance(job.sweep, dict):
        shown["sweep_jobs"] = actions.sweep_jobs(sp, job.sweep["id"])
    return shown


def gpus_view(sp: Any) -> Optional[dict[str, Any]]:
    """What `gpuq gpus` shows (also the assistant server's `gpus` tool); None without GPUs."""
    from gpuq.engine.lifecycle import actions
    from gpuq.engine.schedule import gpuview

    shown = gpuview.current(sp, actions.jobs_in(sp, (RUNNING,)))  # a look of its own if the workers' is old
    if shown is not None and shown.get("worker"):
        gpuview.add_leases(shown)  # the leases as they are now, not as the worker last saw them
    return shown


def cmd_gpus(args: argparse.Namespace) -> int:
    import time

    from gpuq.engine.schedule import gpuview

    sp = spool()
    shown = gpus_view(sp)
    if args.json:
        print(jsontext.dumps(gpuview.listed(shown, time.time()), indent=2))
    elif shown is None:
        print("no GPUs found (no NVIDIA driver, and GPUQ_FAKE_GPUS is not set): jobs run one slot at a time")
    else:
        print("\n".join(render.gpu_lines(shown, home=sp.home)))
    return 0


def cmd_triage(args: argparse.Namespace) -> int:
    """Why the job waits or failed, its log's end, its checkpoint and the fixes (engine/views/triage.py)."""
    from gpuq.engine.views.triage import triage

    found = triage(spool(), args.id, args.lines)
    if args.json:
        print(jsontext.dumps(found, indent=2, ensure_ascii=False))
        return 0
    print("\n".join(_triage_card(found)))
    return 0


def _triage_card(found: dict[str, Any]) -> list[str]:
    """`gpuq triage`'s text: a few labelled lines, the log's end, then each fix and why."""
    from gpuq.core.times import duration

    code = found.get("exit_code")
    ckpt = found["checkpoint"]
    step = f" (step {ckpt['step']})" if ckpt["step"] is not None else ""
    labelled = [
        ("waiting for", found.get("waiting_for")),
        ("exit code", None if code is None else f"{code}" + (f" ({found['signal']})" if found.get("signal") else "")),
        ("reason", found.get("reason")),
        ("note", found.get("note") if found.get("note") != found.get("waiting_for") else None),
        ("ran for", None if found.get("run_seconds") is None else duration(found["run_seconds"])),
        ("checkpoint", f"{ckpt['latest']}{step}" if ckpt["latest"] else f"none found ({ckpt['where_looked']})"),
        ("log", found["log"]),
    ]
    out = [f"#{found['id']} {found['name']}: {found['state']}"]
    out += [f"  {label.ljust(11)}  {text}" for label, text in labelled if text]
    if found["log_tail"]:
        out.append(f"  the end of its log ({len(found['log_tail'])} lines):")
        out += [f"    {security.display(line)}" for line in found["log_tail"]]
    out.append("  to fix it:" if found["fixes"] else "  nothing to fix")
    for fix in found["fixes"]:
        out += [f"    {fix['command']}", f"      {fix['why']}"]
    return out
