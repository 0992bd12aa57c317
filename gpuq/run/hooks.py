"""What happens when a job ends (`after_end`) or is stuck while it runs (`during_run`): `--on-finish`,
a desktop notification, messages to the `--notify URL`s. A hook is a program nobody here controls, so
it is bounded: its own session, no stdin, the first OUTPUT_CAP bytes of its output kept, and whatever
is left of its process group killed once it exited or its time is up. Nothing here raises.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from gpuq.core import schema
from gpuq.core.job import Job
from gpuq.core.states import FAILED, INTERRUPTED, PENDING, RUNNING
from gpuq.run.notify import message, send
from gpuq.run.supervisor.start import LOG_PREFIX
from gpuq.spool import Spool
from gpuq.system import procs, proctree

OUTPUT_CAP = 16 * 1024  # bytes of a hook's output passed on to the log
TERM_GRACE = 1.0  # seconds between SIGTERM and SIGKILL for a hook that ran out of time
NOTIFY_TIMEOUT = 5.0
DEFAULT_TIMEOUT = 30.0
TIMEOUT_ENV = "GPUQ_HOOK_TIMEOUT"  # seconds an --on-finish command may take (the worker's environment)
HOOK_VARIABLES = ("GPUQ_JOB_ID", "GPUQ_JOB_NAME", "GPUQ_JOB_STATE", "GPUQ_JOB_EXIT_CODE", "GPUQ_JOB_LOG")
EVENT_VARIABLE = "GPUQ_EVENT"  # finished, gpu_idle or stuck (run/notify/message.py)
_during: list[threading.Thread] = []  # hooks run for events while the job runs, joined at its end


def hook_env(
    job_id: int, name: str, state: str, exit_code: Optional[int], log_path: str, event: str = message.FINISHED
) -> dict[str, str]:
    values = (str(job_id), name, state, "" if exit_code is None else str(exit_code), log_path)
    return {**dict(zip(HOOK_VARIABLES, values)), EVENT_VARIABLE: event}


def run_on_finish(cmd: str, env_vars: Mapping[str, Any], log: Callable[[str], None], timeout: float = 30) -> None:
    """Run `sh -c CMD` with `env_vars` added, for at most `timeout` seconds; its output, then how it
    ended, to `log`."""
    try:
        env = dict(os.environ)
        env.update({str(k): "" if v is None else str(v) for k, v in env_vars.items()})
        outcome = _run_bounded(["/bin/sh", "-c", cmd], env, timeout)
    except Exception as exc:  # a bad environment value, no /bin/sh, out of processes...
        _say(log, f"on-finish hook could not start: {exc}")
        return
    for line in outcome.lines():
        _say(log, f"on-finish hook: {line}")
    if outcome.dropped:
        _say(log, f"on-finish hook: ({outcome.dropped} more bytes of output not shown)")
    _say(log, f"on-finish hook {outcome.describe(timeout)}")


def notify_desktop(job_summary: Mapping[str, Any], timeout: float = NOTIFY_TIMEOUT) -> Optional[str]:
    """A desktop notification through `notify-send`: None when it was shown, else why not."""
    tool = procs.which("notify-send")  # not shutil's: every supervisor imports this module
    if tool is None:
        return "notify-send not found (install libnotify-bin to get desktop notifications)"
    state = str(job_summary.get("state", "ended"))
    title = f"gpuq: job #{job_summary.get('id', '?')} {state}"
    body = str(job_summary.get("name", ""))
    if job_summary.get("exit_code") is not None:
        body += f" (exit {job_summary['exit_code']})"
    urgency = "critical" if state in (FAILED, INTERRUPTED) else "normal"
    try:
        outcome = _run_bounded([tool, "-u", urgency, title, body], dict(os.environ), timeout)
    except Exception as exc:
        return f"notify-send could not start: {exc}"
    if outcome.timed_out or outcome.returncode != 0:
        first = next(iter(outcome.lines()), "")
        return f"notify-send {outcome.describe(timeout)}" + (f": {first}" if first else "")
    return None


@dataclass
class _Outcome:
    returncode: Optional[int]
    timed_out: bool
    output: bytes
    dropped: int  # bytes of output beyond OUTPUT_CAP, read and thrown away

    def lines(self) -> list[str]:
        text = self.output.decode("utf-8", errors="replace")
        return [_printable(line) for line in text.splitlines() if line.strip()]

    def describe(self, timeout: float) -> str:
        if self.timed_out:
            return f"killed after {timeout:g}s (it had not finished)"
        code = self.returncode
        if code is not None and code < 0:
            try:
                return f"failed: killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"failed: killed by signal {-code}"
        return "exited 0" if code == 0 else f"failed: exit {code}"


def _run_bounded(argv: list[str], env: dict[str, str], timeout: float) -> _Outcome:
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group, to kill whatever it starts
        close_fds=True,
    )
    assert proc.stdout is not None
    output, dropped, timed_out = b"", 0, True  # if reading fails, it is ended like a hook out of time
    try:
        output, dropped, timed_out = _collect(proc, proc.stdout.fileno(), time.monotonic() + timeout)
    finally:
        if timed_out:
            proctree.signal_group(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + TERM_GRACE
            while not _has_exited(proc) and time.monotonic() < deadline:
                time.sleep(0.02)
        # The leader has exited but is not reaped yet, so its pid (the group's id) cannot have been
        # given to another process: killing the group reaches only what the hook left behind.
        proctree.signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    return _Outcome(proc.returncode, timed_out, output, dropped)


def _collect(proc: subprocess.Popen, fd: int, deadline: float) -> tuple[bytes, int, bool]:
    """Its output, until the program has exited and the pipe is closed or empty (a leftover
    background child may hold it open forever); whether its time ran out."""
    kept = bytearray()
    dropped = 0
    closed = False
    while True:
        exited = _has_exited(proc)
        left = deadline - time.monotonic()
        if (exited and closed) or left <= 0:
            return bytes(kept), dropped, not exited
        if closed:
            time.sleep(min(0.02, left))
            continue
        ready, _, _ = select.select([fd], [], [], min(0.05, left))
        if not ready:
            if exited:
                return bytes(kept), dropped, False
            continue
        chunk = os.read(fd, 65536)
        closed = not chunk
        room = max(0, OUTPUT_CAP - len(kept))
        kept += chunk[:room]
        dropped += len(chunk) - len(chunk[:room])


def _has_exited(proc: subprocess.Popen) -> bool:
    """Whether the program has exited, without reaping it (so its pid stays reserved)."""
    if not hasattr(os, "waitid"):  # macOS: poll() reaps; the group is killed right after
        return proc.poll() is not None
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _printable(line: str) -> str:
    """No control characters: a hook's output must not forge lines or escapes in a log."""
    return "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in line.rstrip())


def _say(log: Callable[[str], None], line: str) -> None:
    with suppress(Exception):  # the hook's report must not break the caller either
        log(line)


def after_end(spool: Spool, job_id: int, worker_hooks: dict[str, Any]) -> None:
    """The job's and the worker's hooks, once the job's end is recorded and its claim released:
    whatever they do, the queue is already as it must be."""
    for thread in _during:  # hooks of events while it ran: bounded by their own time limits
        thread.join()
    _during.clear()
    found = spool.jobs.find(job_id)
    if found is None or found.state == PENDING:
        return  # gone, or back in the queue for a retry: its end is still to come
    try:
        job = spool.jobs.load(found)
    except (FileNotFoundError, schema.InvalidJob):
        return
    notify_urls(spool, job, found.state, message.FINISHED, worker_hooks)
    _run_hooks(spool, job, found.state, message.FINISHED, worker_hooks)


def during_run(spool: Spool, job: Job, event: str, reason: str, worker_hooks: dict[str, Any]) -> None:
    """An event of a running job (GPU_IDLE, STUCK): its hooks in a thread, so that the wait goes on."""
    notify_urls(spool, job, RUNNING, event, worker_hooks, reason)
    thread = threading.Thread(target=_run_hooks, args=(spool, job, RUNNING, event, worker_hooks), daemon=True)
    thread.start()
    _during.append(thread)


def notify_urls(
    spool: Spool, job: Job, state: str, event: str, worker_hooks: dict[str, Any], reason: Optional[str] = None
) -> None:
    """The message of `event` to the job's and the worker's `--notify URL`s, failures said in the job's log."""
    urls = [*job.notify_urls, *(worker_hooks.get("notify_urls") or ())]
    if urls:
        said = message.of_job(job, state, event, reason)
        send.send(urls, said, lambda: spool.logs.open_job_log(job.id), f"job {job.id}", LOG_PREFIX)


def _run_hooks(spool: Spool, job: Job, state: str, event: str, worker_hooks: dict[str, Any]) -> None:
    commands = [c for c in (job.on_finish, worker_hooks.get("on_finish")) if c]
    notify = job.notify or worker_hooks.get("notify")
    if not (commands or notify):
        return

    def log(line: str) -> None:
        fd = spool.logs.open_worker_log()
        try:
            os.write(fd, f"[{time.strftime('%H:%M:%S')}] job #{job.id}: {line}\n".encode("utf-8", "replace"))
        finally:
            os.close(fd)

    log_path = str(spool.logs.path_of(job))
    timeout = send.env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT, 3600)
    for command in commands:
        env = hook_env(job.id, job.name, state, job.exit_code, log_path, event)
        run_on_finish(command, env, log, timeout)
    if notify:
        shown = state if event == message.FINISHED else event.replace("_", " ")
        problem = notify_desktop({"id": job.id, "name": job.name, "state": shown, "exit_code": job.exit_code})
        if problem:
            log(f"no desktop notification: {problem}")
