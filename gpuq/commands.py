"""What each `gpuq` command does: call the library, print the result. cli.py parses the command
line and dispatches here. Nothing here touches spool files; heavy imports (the worker, psutil)
happen inside the commands that need them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

from gpuq import enqueue, jobs, queue, render, security
from gpuq.spool import Spool


class UsageError(Exception):
    """A bad command line: one line on stderr, exit code 2."""


def spool() -> Spool:
    return Spool().ensure()


# ---- commands ---------------------------------------------------------------------------------
def cmd_add(args: argparse.Namespace) -> int:
    user_umask = jobs.current_umask()  # before Spool.ensure() sets gpuq's own 077
    cwd = Path(args.dir).expanduser().absolute() if args.dir else Path.cwd()
    if not cwd.is_dir():
        raise UsageError(f"gpuq add: directory not found: {cwd}")
    if args.retries < 0:
        raise UsageError("gpuq add: --retries must be 0 or more")
    if args.name is not None:
        try:
            jobs.check_name(args.name)
        except jobs.InvalidJob as exc:
            raise UsageError(f"gpuq add: --name: {exc}") from None
    try:
        cmd, venv = enqueue.resolve_command(args.script, args.args, cwd, args.python)
        cmd, options = _preempt_options(args, cmd, venv)  # before env is read: it may add to it
        ref, job = enqueue.enqueue(
            spool(),
            cmd=cmd,
            cwd=cwd,
            name=args.name,
            venv=venv,
            env=dict(args.env),
            shell_env=dict(os.environ),
            after=[i for ids in args.after for i in ids],
            after_any=[i for ids in args.after_any for i in ids],
            retries=args.retries,
            priority=args.priority,
            options=options,
            umask=user_umask,
        )
    except enqueue.EnqueueError as exc:
        raise UsageError(f"gpuq add: {exc}") from None
    if args.quiet:
        print(job["id"])
        return 0
    deps = job["after"] + job["after_any"]
    print(f"[+] Job #{job['id']}: {job['name']}" + (f"  after {', '.join(f'#{d}' for d in deps)}" if deps else ""))
    return 0


def _preempt_options(args: argparse.Namespace, cmd: list[str], venv: Optional[str]) -> tuple[list[str], dict[str, Any]]:
    """The command and job fields for --urgent/--preemptible/--ckpt-glob/--resume-arg
    (--preemptible may add a flag to the command and GPUQ_PREEMPTIBLE=1 to args.env)."""
    options: dict[str, Any] = {"urgent": args.urgent, "preemptible": args.preemptible, "ckpt_glob": args.ckpt_glob}
    if args.resume_arg is not None:
        from gpuq.preempt import check_resume_arg

        problem = check_resume_arg(args.resume_arg)
        if problem:
            raise UsageError(f"gpuq add: {problem}")
        options["resume_arg"] = args.resume_arg
    if args.preemptible:
        from gpuq.preempt import PREEMPTIBLE_ENV, make_preemptible

        cmd, message = make_preemptible(cmd, venv)
        args.env.append((PREEMPTIBLE_ENV, "1"))
        if not args.quiet:
            print(f"preemptible: {message}")
    return cmd, options


def cmd_run(args: argparse.Namespace) -> int:
    from gpuq import daemon

    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()] if args.gpus else None
    if args.gpus is not None and not gpus:
        raise UsageError("gpuq run: --gpus needs a list such as 0 or 0,1")
    if args.daemon:
        return daemon.start_background(spool(), gpus)
    return daemon.run_foreground(spool(), gpus, watch=args.watch, ready_fd=args.ready_fd)


def cmd_stop(args: argparse.Namespace) -> int:
    sp = spool()
    stopped = queue.stop_workers(sp)
    print(f"stopped worker(s): {', '.join(str(w.get('pid')) for w in stopped)}" if stopped else "no worker was running")
    running = queue.running_jobs(sp)
    if args.kill_jobs:
        for job in running:
            queue.kill(sp, job["id"])
            print(f"killed job #{job['id']} {job['name']}")
    elif running:
        names = ", ".join(f"#{j['id']} {j['name']}" for j in running)
        print(
            f"jobs keep running: {names} (their supervisors record how they end). "
            "`gpuq stop --kill-jobs` stops them too."
        )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    st = queue.status(spool(), show_all=args.all, summarize=None if args.json else render.finished_cells)
    if args.json:
        print(json.dumps([_json_row(r) for r in st.rows], indent=2))
        return 0
    pending = sum(1 for r in st.rows if r.state == "pending")
    print(render.worker_line(st.workers, pending))
    if st.rows:
        print("\n".join(render.status_table(st.rows)))
    else:
        print("no jobs")
    if st.hidden_finished:
        print(f"({st.hidden_finished} older finished job(s) hidden; `gpuq status -a` shows all)")
    for name in st.dropped:
        print(f"pending/{security.display(name)}: dropped file, not taken in yet (a worker takes it in)")
    return 0


def _json_row(row: queue.Row) -> dict[str, Any]:
    job = row.job
    out = {
        key: job.get(key)
        for key in (
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
            "preemptions",
        )
    }
    out["state"] = row.state
    out["waiting"] = row.wait.reason if row.wait else None
    est = row.estimate
    out["progress"] = round(est.fraction, 4) if est and est.fraction is not None else None
    out["eta_seconds"] = round(est.eta_seconds, 1) if est and est.eta_seconds is not None else None
    out["starts_in_seconds"] = round(est.starts_in, 1) if est and est.starts_in is not None else None
    out["eta_method"] = est.method if est else None
    out["progress_source"] = est.reading.source if est and est.reading else None
    out["adopted"] = bool(job.get("adopted"))
    return out


def cmd_adopt(args: argparse.Namespace) -> int:
    from gpuq import adopt

    try:
        ref, job = adopt.adopt(spool(), args.pid, name=args.name, log=args.log)
    except adopt.AdoptError as exc:
        print(f"gpuq adopt: {exc}", file=sys.stderr)
        return 1
    print(f"[+] Job #{job['id']}: {job['name']} adopted (pid {job['pid']}, started {job['started_at']})")
    print(f"    log: {job['log']}" if job["log"] else "    no log: progress only from checkpoints (use --log FILE)")
    return 0


def cmd_eta(args: argparse.Namespace) -> int:
    sp = spool()
    if args.id is not None:
        queue.get(sp, args.id)  # "no such job #N" as a one-line error
    rows = [r for r in queue.status(sp).rows if r.estimate is not None]  # running and pending rows
    if args.id is not None:
        rows = [r for r in rows if r.job["id"] == args.id]
        if not rows:
            state = queue.get(sp, args.id)[0].state
            print(f"#{args.id}: {state}; an ETA is given for running and pending jobs only")
            return 0
    if not rows:
        print("no running or pending jobs")
    for line in render.eta_lines(rows):
        print(line)
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    sp = spool()
    ref, job = queue.get(sp, args.id)
    path = sp.log_path(args.id)
    for line in render.tail_lines(path, args.lines):
        print(line)
    if args.follow:
        from gpuq.follow import follow

        follow(sp, args.id, path)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    ref, job = queue.get(spool(), args.id)
    print(json.dumps(dict(job, state=ref.state, file=ref.name), indent=2, ensure_ascii=False))
    return 0


def cmd_preempt(args: argparse.Namespace) -> int:
    from gpuq import preempt

    if args.timeout < 0:
        raise UsageError("gpuq preempt: --timeout must be 0 or more")
    outcome = preempt.preempt(spool(), args.id, args.timeout, args.force, say=print)
    job = outcome.job
    if outcome.state == "preempted":
        print(f"[~] Job #{job['id']}: {job['name']} preempted (exit {job.get('exit_code')}): {job.get('note')}")
        print(f"    `gpuq resume {job['id']}` continues it")
        return 0
    if outcome.left and outcome.state == "running" and job.get("pid") in outcome.left:
        print(f"job #{job['id']} did not exit within {args.timeout:g}s; left running, unchanged (--force kills it)")
    elif outcome.left:
        print(
            f"job #{job['id']}: its main process exited but {', '.join(map(str, outcome.left))} ignore SIGTERM; "
            f"it keeps its slot until they are gone (`gpuq preempt {job['id']} --force` kills them)"
        )
    else:
        print(f"job #{job['id']} ended on its own meanwhile: {outcome.state}")
    return 1


def cmd_resume(args: argparse.Namespace) -> int:
    from gpuq import preempt

    resumed = preempt.resume(spool(), args.id, args.require_checkpoint, front=not args.back)
    job = resumed.job
    if resumed.checkpoint is None:
        print(f"no checkpoint found for job #{job['id']}: {job.get('note')}")
    where = "in normal order" if args.back else "first in line"
    print(f"[+] Job #{job['id']}: {job['name']} back in the queue ({where}): {job.get('note')}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    for job_id in args.ids:
        job = queue.cancel(spool(), job_id)
        print(f"[-] Job #{job_id}: {job['name']} cancelled")
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    for job_id in args.ids:
        print(f"sending SIGTERM to job #{job_id}'s process group (SIGKILL after {queue.KILL_GRACE_SECONDS:.0f}s)...")
        job = queue.kill(spool(), job_id)
        print(f"[-] Job #{job_id}: {job['name']} killed (exit {job.get('exit_code')})")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    for job_id in args.ids:
        job = queue.retry(spool(), job_id)
        print(f"[+] Job #{job_id}: {job['name']} back in the queue")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    report = queue.clear(spool())
    print(f"removed {len(report.removed)} finished job(s)")
    if report.kept_for_dependents:
        print("kept (waiting jobs depend on them): " + ", ".join(f"#{i}" for i in sorted(report.kept_for_dependents)))
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    sp = spool()
    if args.all or args.jobs:
        jobs_back = queue.recover(sp, None if args.all else args.jobs)
        print(f"Re-queued {len(jobs_back)} job(s)." + (" Run `gpuq run` to execute." if jobs_back else ""))
        return 0
    found = queue.interrupted(sp)
    if not found:
        print("no interrupted jobs")
        return 0
    for job in found:
        print(f"  #{job['id']} {job['name']}: {job.get('note') or 'interrupted'}")
    if not sys.stdin.isatty():
        print(f"would re-queue {len(found)} job(s); run `gpuq recover --all` (or --jobs ID...) to do it")
        return 0
    if input(f"Re-queue these {len(found)} job(s)? [y/N] ").strip().lower() in ("y", "yes"):
        print(f"Re-queued {len(queue.recover(sp, [j['id'] for j in found]))} job(s).")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gpuq.demo import run_demo

    return run_demo()
