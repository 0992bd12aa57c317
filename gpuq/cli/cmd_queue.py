"""`gpuq add`, `cancel`, `kill`, `retry`, `recover`, `clear`: call the library, print the result."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Optional

from gpuq.cli.common import spool
from gpuq.core import schema
from gpuq.core.errors import UsageError
from gpuq.core.timespec import parse_size_mib
from gpuq.engine import actions, enqueue, gpuview
from gpuq.system import procs


def cmd_add(args: argparse.Namespace) -> int:
    user_umask = procs.current_umask()  # before the spool sets gpuq's own 077
    cwd = Path(args.dir).expanduser().absolute() if args.dir else Path.cwd()
    if not cwd.is_dir():
        raise UsageError(f"directory not found: {cwd}")
    if args.retries < 0:
        raise UsageError("--retries must be 0 or more")
    if args.name is not None:
        try:
            schema.check_name(args.name)
        except schema.InvalidJob as exc:
            raise UsageError(f"--name: {exc}") from None
    cmd, venv = enqueue.resolve_command(args.script, args.args, cwd, args.python)
    cmd, options = _preempt_options(args, cmd, venv)  # before env is read: it may add to it
    options.update(_gpu_options(args), notify=args.notify, on_finish=args.on_finish)
    _ref, job = enqueue.enqueue(
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
        from gpuq.core.resume_arg import check_resume_arg

        problem = check_resume_arg(args.resume_arg)
        if problem:
            raise UsageError(problem)
        options["resume_arg"] = args.resume_arg
    if args.preemptible:
        from gpuq.engine import hf

        cmd, message = hf.make_preemptible(cmd, venv)
        args.env.append((hf.PREEMPTIBLE_ENV, "1"))
        if not args.quiet:
            print(f"preemptible: {message}")
    return cmd, options


def _gpu_options(args: argparse.Namespace) -> dict[str, Any]:
    """--gpus N and --gpu-mem SIZE; a request this machine can never meet is refused here."""
    mem = None
    if args.gpu_mem is not None:
        try:
            mem = parse_size_mib(args.gpu_mem, "--gpu-mem")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.gpus == 0:
            raise UsageError("--gpu-mem needs --gpus 1 or more (--gpus 0 is a CPU job)")
    problem = gpuview.never_fits(spool(), args.gpus, mem)
    if problem:
        raise UsageError(f"{problem}: this job could never start")
    return {"gpu_request": args.gpus, "gpu_mem_mib": mem}


def cmd_cancel(args: argparse.Namespace) -> int:
    for job_id in args.ids:
        job = actions.cancel(spool(), job_id)
        print(f"[-] Job #{job_id}: {job['name']} cancelled")
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    for job_id in args.ids:
        grace = actions.KILL_GRACE_SECONDS
        print(f"sending SIGTERM to job #{job_id}'s process group (SIGKILL after {grace:.0f}s)...")
        job = actions.kill(spool(), job_id)
        print(f"[-] Job #{job_id}: {job['name']} killed (exit {job.get('exit_code')})")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    for job_id in args.ids:
        job = actions.retry(spool(), job_id)
        print(f"[+] Job #{job_id}: {job['name']} back in the queue")
    return 0


def cmd_clear(_args: argparse.Namespace) -> int:
    report = actions.clear(spool())
    print(f"removed {len(report.removed)} finished job(s)")
    if report.kept_for_dependents:
        print("kept (waiting jobs depend on them): " + ", ".join(f"#{i}" for i in sorted(report.kept_for_dependents)))
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    sp = spool()
    if args.all or args.jobs:
        jobs_back = actions.recover(sp, None if args.all else args.jobs)
        print(f"Re-queued {len(jobs_back)} job(s)." + (" Run `gpuq run` to execute." if jobs_back else ""))
        return 0
    found = actions.interrupted(sp)
    if not found:
        print("no interrupted jobs")
        return 0
    for job in found:
        print(f"  #{job['id']} {job['name']}: {job.get('note') or 'interrupted'}")
    if not sys.stdin.isatty():
        print(f"would re-queue {len(found)} job(s); run `gpuq recover --all` (or --jobs ID...) to do it")
        return 0
    if input(f"Re-queue these {len(found)} job(s)? [y/N] ").strip().lower() in ("y", "yes"):
        print(f"Re-queued {len(actions.recover(sp, [j['id'] for j in found]))} job(s).")
    return 0
