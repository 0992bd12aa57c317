"""`gpuq run` and `gpuq stop`: start and stop workers; `gpuq lease`: a command run under GPU leases."""

from __future__ import annotations

import argparse
import importlib
import socket
import sys
from typing import Any

from gpuq.cli.common import job_ids, spool
from gpuq.cli.options import RUN
from gpuq.core.errors import Refused, UsageError
from gpuq.core.states import DONE, FINISHED, HELD, INTERRUPTED, PENDING, RAY, RUNNING, SLURM
from gpuq.core.timespec import parse_memory_mib
from gpuq.core.words import ADOPTED_END, ids_text, plural
from gpuq.engine.lifecycle import actions, enqueue
from gpuq.engine.schedule import adhoc
from gpuq.engine.schedule.placement import Request
from gpuq.system.extras import notify_missing

RUN_NEEDS = ("psutil", "watchdog")  # what the worker and the supervisors import


def cmd_run(args: argparse.Namespace) -> int:
    _check_dependencies()
    from gpuq.run import daemon  # after the check: gpuq.run needs psutil and watchdog
    from gpuq.run.worker import Settings  # (the same)

    settings = Settings(**_settings(args))
    daemon.check_gpus(settings.gpus)
    if not settings.notify_urls:  # the user's default: GPUQ_NOTIFY, else the config file's
        from gpuq.run.notify import config  # as gpuq.run above: after the dependency check

        try:
            settings.notify_urls = config.default_urls()
        except ValueError as exc:
            raise Refused(str(exc)) from None
        missing = settings.notify_urls and notify_missing()
        if missing:  # a worker that a service starts must not stay down for its notifications
            print(f"gpuq run: warning: {missing}; until then, no job's events are sent", file=sys.stderr)
    sp = spool()
    fstype = sp.network_filesystem()  # claims and renames on a network filesystem are only sure on one host
    here = socket.gethostname()
    others = [w for w in sp.workers.recorded() if w.get("host") and w.get("host") != here] if fstype else []
    if others:
        print(
            f"gpuq run: warning: the spool {sp.home} is on a network filesystem ({fstype}) and a worker on "
            f"{others[0]['host']} (pid {others[0].get('pid')}) holds it: run gpuq's workers and commands on one host "
            "only",
            file=sys.stderr,
        )
    if args.daemon:
        pid = daemon.start_background(sp, _forwarded(args))
        print(f"[+] worker started in the background: pid {pid}, log {sp.logs.worker_log_path()}")
        print("    `gpuq status` shows the queue, `gpuq stop` stops the worker (jobs keep running).")
        return 0
    return daemon.run_foreground(sp, settings, watch=args.watch, ready_fd=args.ready_fd)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for opt in RUN.options:
        value = getattr(args, opt.dest)
        if opt.setting is None or value is None:
            continue
        try:
            out[opt.setting] = value if opt.read is None else opt.read(value, opt.flags[-1])
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if out["notify_urls"]:  # typed: refused if they cannot be sent, as `add --notify URL`
        out["notify_urls"] = enqueue.notify_urls(out["notify_urls"], "gpuq run")
    return out


def _forwarded(args: argparse.Namespace) -> list[str]:
    """The options of `gpuq run --daemon` that the background worker gets too, as typed."""
    out: list[str] = []
    for opt in RUN.options:
        value = getattr(args, opt.dest)
        if opt.setting is None or value is None or value is False or value == []:
            continue
        values = value if isinstance(value, list) else [value]  # an option given several times: each
        out += [opt.flags[-1]] if value is True else [word for v in values for word in (opt.flags[-1], v)]
    return out


def _check_dependencies() -> None:
    """A worker without psutil would start jobs whose supervisors die at once."""
    missing = []
    for name in RUN_NEEDS:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise Refused(
            f"gpuq run needs {', '.join(missing)}, which {sys.executable} cannot import: "
            f"`{sys.executable} -m pip install {' '.join(missing)}` (or install gpuq itself: pip install .)"
        )


def cmd_stop(args: argparse.Namespace) -> int:
    sp = spool()
    if args.drain:
        drained = actions.drain_workers(sp)
        if not drained:
            print("no worker was running")
        for info in drained:
            print(f"worker {info.get('pid')}: starting nothing new; it exits once its running jobs have ended")
        return 0
    stopped = actions.stop_workers(sp)
    pids = ", ".join(str(w.get("pid")) for w in stopped)
    print(f"stopped worker{'s' if len(stopped) > 1 else ''} {pids}" if stopped else "no worker was running")
    running = actions.jobs_in(sp, (RUNNING,))
    if args.kill_jobs:
        for job, ended in actions.kill_each(sp, running):
            print(f"killed job #{job.id} {job.name}" if ended is None else f"job #{job.id} {job.name} ended ({ended})")
    elif running:
        said = []
        supervised = [f"#{j.id} {j.name}" for j in running if not j.adopted]
        if supervised:
            said.append(f"{', '.join(supervised)} (their supervisors record how they end)")
        adopted = [f"#{j.id} {j.name}" for j in running if j.adopted]
        if adopted:  # no supervisor: gpuq's next look finds its process gone and records it done
            said.append(f"{', '.join(adopted)} ({ADOPTED_END})")
        print(f"jobs keep running: {'; '.join(said)}. `gpuq stop --kill-jobs` stops them too.")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    sp = spool()
    queued = [ref.id for ref in sp.jobs.refs((PENDING, RUNNING, HELD, SLURM, RAY))]
    ids = sorted(job_ids(args.ids) or queued + actions.auto_resumed(sp))  # an urgent job's victims come back
    if not ids:
        print("nothing queued or running")
        return 0
    # the pending ones will not start after the running ones unless a worker comes
    states = {i: refs[-1].state for i, refs in sp.jobs.index().items() if i in set(ids)}
    pending = [i for i, state in states.items() if state == PENDING]
    if pending and any(state in (RUNNING, SLURM, RAY) for state in states.values()) and not sp.workers.live():
        print(
            f"gpuq wait: no worker is running; {ids_text(pending)} will not start unless one does "
            "(`gpuq run --daemon`); waiting for the running ones",
            file=sys.stderr,
        )
    waited = actions.wait_for(sp, ids, args.timeout, said=_never_runs)
    for job_id, (state, why) in sorted(waited.ends.items()):
        if state != DONE and job_id not in waited.stranded and job_id not in waited.damaged:
            print(f"#{job_id} {state}" + (f": {why}" if why else ""))
    if waited.stranded:
        waits = "waits" if len(waited.stranded) == 1 else "wait"
        print(
            f"gpuq wait: nothing will run: no worker is running; {ids_text(waited.stranded)} {waits} "
            "for `gpuq run --daemon`",
            file=sys.stderr,
        )
        return 1
    if waited.all_done:
        print(f"{'all ' if len(ids) > 1 else ''}{plural(len(ids), 'job')} done")
        return 0
    return 1


def _never_runs(_job_id: int, state: str, why: str) -> None:
    """A job whose file is damaged, said as soon as `wait` finds it (it goes on with the others)."""
    if state in FINISHED or state == INTERRUPTED:  # it ended (or was cancelled): only how is lost
        fate = "its end cannot be read"
    elif state == RUNNING:
        fate = "no supervisor holds it to record its end: not waited for"
    else:
        fate = "it will never run: not waited for"
    print(f"gpuq wait: {why} (in {state}/); {fate}", file=sys.stderr, flush=True)


def cmd_lease(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("give the command to run: gpuq lease [--gpus N | --gpu-mem SIZE] -- CMD...")
    if args.gpus == 0:
        raise UsageError("--gpus 0 leases no GPU: run the command without gpuq lease")
    mem = enqueue.usage(parse_memory_mib, args.gpu_mem, "--gpu-mem")
    request = Request(gpus=1 if args.gpus is None else args.gpus, gpu_mem_mib=mem)
    return adhoc.lease_and_run(cmd, request, wait=not args.no_wait)
