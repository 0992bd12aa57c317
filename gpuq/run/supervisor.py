"""The per-job supervisor: a small process that owns one job from start to finish.

The worker claims a job and hands the claim's descriptor to a supervisor (run/launcher.py: a
spare started ahead of time, or a fresh `python -S` running main() below). The supervisor moves
the job to running/, starts it in its own session, waits for it, writes the real exit code, and
moves it on. It lives in its own session too, so the worker can
die, be stopped or lose its terminal without the job losing its result (this is how nq and conmon
keep exit codes). While it lives, its flock on the claim lock tells everyone the job is supervised.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from gpuq.core import schema, transitions
from gpuq.core.states import PENDING, PREEMPT, PREEMPT_ACTIONS, PREEMPTED, RUNNING
from gpuq.core.times import parse_iso
from gpuq.spool import Claim, JobRef, Spool
from gpuq.system import procs


def job_environment(spool: Spool, job: dict[str, Any], slot: Optional[str]) -> dict[str, str]:
    """The environment of `gpuq add`'s shell (or the worker's, for hand-dropped jobs), the
    job's venv first on PATH, the job's own --env, and gpuq's variables."""
    env = dict(job["shell_env"] if job.get("shell_env") is not None else os.environ)
    venv = job.get("venv")
    if venv:
        env["VIRTUAL_ENV"] = venv
        env["PATH"] = f"{venv}/bin" + (os.pathsep + env["PATH"] if env.get("PATH") else "")
        env.pop("PYTHONHOME", None)
    env.update(job.get("env") or {})
    env["GPUQ_JOB_ID"] = str(job["id"])
    env["GPUQ_HOME"] = str(spool.home)
    env["GPUQ_PROGRESS_FILE"] = str(spool.reports.progress_path(job["id"]))
    if slot is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = slot
    return env


def _log_line(log_fd: int, text: str) -> None:
    os.write(log_fd, f"=== gpuq: {text}\n".encode("utf-8", "surrogateescape"))  # argv bytes as given


def start(
    spool: Spool,
    claim: Claim,
    slot: Optional[str],
    gpus: Optional[list[int]] = None,
    hooks: Optional[dict[str, Any]] = None,
) -> int:
    """Run the claimed job to the end; returns the job's exit code (or -1 if it did not run)."""
    ref = spool.jobs.find(claim.job_id, (PENDING,))
    if ref is None:  # cancelled or already run by someone else since the worker looked
        claim.release()
        return -1
    try:
        job = spool.jobs.load(ref)
        if spool.jobs.newer_copy_elsewhere(ref, job):  # a crash mid-move left this stale copy behind
            spool.jobs.remove(ref)
            raise FileNotFoundError(ref.name)
    except (FileNotFoundError, schema.InvalidJob):
        claim.release()
        return -1
    # The supervisor's own identity needs psutil (an import of several ms): it is recorded with
    # the job's pid after the job has started, so the job does not wait for it.
    changes = transitions.start(
        job,
        slot=slot,
        gpus=gpus,
        boot_id=procs.boot_id(),
        host=os.uname().nodename,
        log=str(spool.layout.log_path(job["id"])),
    )
    ref, job = spool.jobs.move(ref, job, RUNNING, changes)
    log_fd = spool.logs.open_job_log(job["id"])
    _log_line(log_fd, f"job #{job['id']} {job['name']} (attempt {job['attempts']})")
    _log_line(log_fd, f"cmd: {shlex.join(job['cmd'])}")
    _log_line(log_fd, f"cwd: {job['cwd']}" + (f"  CUDA_VISIBLE_DEVICES={slot}" if slot is not None else ""))
    _log_line(log_fd, f"started: {job['started_at']}")
    try:
        child = subprocess.Popen(
            job["cmd"],
            cwd=job["cwd"],
            env=job_environment(spool, job, slot),
            stdin=subprocess.DEVNULL,
            # gpuq itself runs with umask 077; the job's files get the mask of the shell that queued it
            umask=job["umask"] if job.get("umask") is not None else schema.DEFAULT_JOB_UMASK,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        reason = f"could not start: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        _log_line(log_fd, reason)
        code = finish(spool, claim, ref, job, exit_code=127, sig=None, note=reason, log_fd=log_fd, retry=False)
        _after_end(spool, job["id"], hooks or {})
        return code
    ident = procs.identity(child.pid)
    me = procs.identity(os.getpid())
    job = spool.jobs.rewrite(ref, job, pid=child.pid, pid_create_time=ident["create_time"], supervisor=me)
    _forward_termination_to(child.pid)
    returncode = child.wait()
    _hold_while_preempted_group_lives(spool, job["id"], child.pid)
    sig = -returncode if returncode < 0 else None
    exit_code = 128 + sig if sig else returncode
    finish(spool, claim, ref, job, exit_code=exit_code, sig=sig, note=None, log_fd=log_fd, retry=True)
    _after_end(spool, job["id"], hooks or {})
    return exit_code


def _after_end(spool: Spool, job_id: int, worker_hooks: dict[str, Any]) -> None:
    """The job's and the worker's hooks, once the job's end is recorded and its claim released:
    whatever they do (fail, hang), the queue is already as it must be. Their output goes to the
    worker's log."""
    found = spool.jobs.find(job_id)
    if found is None or found.state == PENDING:
        return  # gone, or back in the queue for a retry: its end is still to come
    try:
        job = spool.jobs.load(found)
    except (FileNotFoundError, schema.InvalidJob):
        return
    commands = [c for c in (job.get("on_finish"), worker_hooks.get("on_finish")) if c]
    notify = job.get("notify") or worker_hooks.get("notify")
    if not (commands or notify):
        return
    from gpuq.run import hooks  # only for jobs that have hooks

    def log(line: str) -> None:
        _worker_log(spool, f"job #{job_id}: {line}")

    state = found.state
    log_path = str(spool.logs.path_of(job))
    timeout = hooks.timeout_seconds()
    for command in commands:
        env = hooks.hook_env(job_id, job["name"], state, job.get("exit_code"), log_path)
        hooks.run_on_finish(command, env, log, timeout)
    if notify:
        problem = hooks.notify_desktop(
            {"id": job_id, "name": job["name"], "state": state, "exit_code": job.get("exit_code")}
        )
        if problem:
            log(f"no desktop notification: {problem}")


def _worker_log(spool: Spool, line: str) -> None:
    fd = spool.logs.open_worker_log()
    try:
        os.write(fd, f"[{time.strftime('%H:%M:%S')}] {line}\n".encode("utf-8", "replace"))
    finally:
        os.close(fd)


def _hold_while_preempted_group_lives(spool: Spool, job_id: int, pgid: int) -> None:
    """Being preempted: the job stays in running/ (its slot taken) until its whole group is gone."""
    if spool.control.peek(job_id) in PREEMPT_ACTIONS:
        from gpuq.engine.preemption import hold_until_gone  # rare: not loaded before the job starts

        hold_until_gone(spool, job_id, pgid)


def _forward_termination_to(pgid: int) -> None:
    """If someone stops the supervisor itself, stop its job the same way instead of orphaning it."""

    def forward(signum: int, _frame: Any) -> None:
        procs.signal_group(pgid, signal.SIGTERM)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)


def finish(
    spool: Spool,
    claim: Claim,
    ref: JobRef,
    job: dict[str, Any],
    *,
    exit_code: int,
    sig: Optional[int],
    note: Optional[str],
    log_fd: int,
    retry: bool,
) -> int:
    """Record how the attempt ended, move the job on and give up the claim."""
    request = spool.control.take(job["id"])
    state, why = transitions.destination(job, exit_code, request, retry)
    sig_name = signal.Signals(sig).name if sig else None
    changes = transitions.end_attempt(job, state, exit_code=exit_code, signal=sig_name, note=note or why)
    elapsed = time.time() - (parse_iso(job.get("started_at")) or time.time())
    _log_line(
        log_fd,
        f"exit {exit_code}{f' ({sig_name})' if sig_name else ''} at {changes['finished_at']} "
        f"after {elapsed:.1f}s -> {state}",
    )
    os.close(log_fd)
    if state == PREEMPTED:
        from gpuq.engine import preemption  # rare: not loaded before the job starts

        changes.update(preemption.record(spool, job, exit_code, request or PREEMPT))
    spool.jobs.move(ref, job, state, changes)
    claim.release()
    return exit_code


def parse_args(argv: list[str]) -> dict[str, str]:
    """The worker's fixed arguments: --home H, then either --job N --lock-fd F --where JSON or
    --spare-fd F (a pre-started supervisor that waits for its job). Parsed by hand: importing
    argparse cost a few ms at the start of every job."""
    known = ("--home", "--job", "--lock-fd", "--where", "--spare-fd")
    if len(argv) % 2 or any(flag not in known for flag in argv[::2]):
        raise SystemExit(f"gpuq-supervisor: internal use only; expected {' '.join(known)}, got {argv}")
    args = dict(zip(argv[::2], argv[1::2]))
    needed = ("--home", "--spare-fd") if "--spare-fd" in args else ("--home", "--job", "--lock-fd", "--where")
    missing = [flag for flag in needed if flag not in args]
    numbers = [args[f] for f in ("--job", "--lock-fd", "--spare-fd") if f in args]
    if missing or not all(n.isdigit() for n in numbers):
        raise SystemExit(f"gpuq-supervisor: internal use only; bad or missing {' '.join(missing) or 'number'}")
    return args


def wait_for_assignment(spare_fd: int) -> Optional[tuple[int, dict[str, Any]]]:
    """A spare supervisor, started ahead of time so that a job does not wait for an interpreter
    to start, blocks here until the worker sends the claim's descriptor and where the job runs
    (`{"id", "slot", "gpus"}`) over the socket. None if the worker closed the socket (it stopped
    or died) without a job."""
    import socket

    import psutil  # noqa: F401  (loaded now, while nobody waits; the job's identity needs it)

    sock = socket.socket(fileno=spare_fd)
    try:
        message, fds, _flags, _addr = socket.recv_fds(sock, 4096, 1)
    except OSError:
        return None
    finally:
        sock.close()
    if not message or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return None
    return fds[0], json.loads(message)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.umask(0o077)
    spool = Spool(Path(args["--home"]))
    if "--spare-fd" in args:
        assignment = wait_for_assignment(int(args["--spare-fd"]))
        if assignment is None:
            return 0
        lock_fd, where = assignment
        job_id = int(where["id"])
        log_fd = spool.logs.open_job_log(job_id)  # our own errors go to the job's log, as for a fresh start
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
    else:
        job_id, lock_fd, where = int(args["--job"]), int(args["--lock-fd"]), json.loads(args["--where"])
    start(
        spool, spool.claims.adopt_descriptor(job_id, lock_fd), where.get("slot"), where.get("gpus"), where.get("hooks")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
