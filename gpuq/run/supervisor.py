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
from gpuq.core.jobenv import add_job_variables
from gpuq.core.states import FAILED, KILL, PENDING, PREEMPT, PREEMPTED, RUNNING
from gpuq.core.times import now_iso, parse_iso
from gpuq.run import logcap, successor
from gpuq.run.hooks import after_end
from gpuq.run.room import RESERVE_MIN, released, room_for, set_aside
from gpuq.spool import Claim, JobRef, Spool, SpoolFull
from gpuq.spool.files import MIN_FREE_TO_START, Reservation, free_bytes
from gpuq.spool.store import encode
from gpuq.system import procs

DISK_FULL_BYTES = 64 * 1024  # a filesystem with less free than this counts as full
DISK_FULL_NOTE = "the disk was full when it ended (its output may have failed for lack of space)"
FULL_RETRY_MAX_SECONDS = 30.0
PUMP_DRAIN_SECONDS = 2.0
KILL_GRACE_SECONDS = 10.0  # as `gpuq kill`: SIGTERM, then SIGKILL after this (`gpuq run --kill-grace`)
WOULD_NOT_DIE = "processes of its group outlived SIGKILL (uninterruptible?): "
_stopped = False  # someone stopped this supervisor (its job was told to stop too)


def job_environment(spool: Spool, job: dict[str, Any], slot: Optional[str]) -> dict[str, str]:
    """The environment of `gpuq add`'s shell (or the worker's, for hand-dropped jobs), the
    job's venv first on PATH, the job's own --env, and gpuq's variables."""
    env = dict(job["shell_env"] if job.get("shell_env") is not None else os.environ)
    add_job_variables(env, job)
    env["GPUQ_HOME"] = str(spool.home)
    env["GPUQ_PROGRESS_FILE"] = str(spool.reports.progress_path(job["id"]))
    if slot is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = slot
    return env


def _log_line(log_fd: int, text: str) -> None:
    try:
        os.write(log_fd, f"=== gpuq: {text}\n".encode("utf-8", "surrogateescape"))  # argv bytes as given
    except OSError:
        pass  # a full disk: the log loses a line, the job file still records everything


class Run:
    """One run of a job under this supervisor. A plain class (see core/transitions.Continuation)."""

    def __init__(
        self,
        spool: Spool,
        claim: Claim,
        ref: JobRef,
        job: dict[str, Any],
        where: dict[str, Any],  # from the worker: slot, gpus, hooks, max_log_bytes
        room: list[Reservation],  # blocks set aside: for recording the pid, then the end
    ) -> None:
        self.spool, self.claim, self.ref, self.job, self.where, self.room = spool, claim, ref, job, where, room
        self.log_fd = -1
        self.timed_out: Optional[str] = None  # the time limit (as text) that stopped the run
        self.termed_at: Optional[float] = None  # when we sent the job's group SIGTERM (time.monotonic())
        self.would_not_die: list[str] = []  # "PID NAME" of leftovers that outlived SIGKILL
        self.queued: Optional[JobRef] = None  # its pending/ copy, until the job has been started


def start(
    spool: Spool,
    claim: Claim,
    where: dict[str, Any],
    ready: Optional[list[Reservation]] = None,
    heard: Optional[successor.Heard] = None,
) -> int:
    """Run the claimed job to the end; returns the job's exit code (or -1 if it did not run).
    `ready`: room a spare supervisor set aside while it waited (see run/room.py). `heard`: the
    hand-over socket from the worker (run/successor.py): when the job ends by itself, this
    supervisor may go on with the next job the worker named there, and so on."""
    run = _begin(spool, claim, where, ready or [])
    if run is None:
        return -1
    code, started = 127, _launch(run)
    while started is not None:
        code, started = _supervise(*started, heard)
    return code


Started = tuple[Run, subprocess.Popen, Optional[Any]]  # a job under way: its run, process and log pump


def _launch(run: Run) -> Optional[Started]:
    """Start a begun job; if it cannot start, its end is recorded (exit 127) and None returned."""
    try:
        child, pump = _spawn(run)
    except OSError as exc:
        _drop_queued_copy(run)
        reason = f"could not start: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        _log_line(run.log_fd, reason)
        finish(run, exit_code=127, sig=None, note=reason, retry=False)
        after_end(run.spool, run.job["id"], run.where.get("hooks") or {})
        return None
    _drop_queued_copy(run)
    return run, child, pump


def _supervise(
    run: Run, child: subprocess.Popen, pump: Optional[Any], heard: Optional[successor.Heard]
) -> tuple[int, Optional[Started]]:
    """One started job to its end: its exit code, and the job started in its place, if any."""
    spool, where = run.spool, run.where
    ident = procs.identity(child.pid)  # before poll(): an ended child is still there, unreaped
    process = {"pid": child.pid, "pid_create_time": ident["create_time"], "supervisor": _identity()}
    unused: list[Reservation] = []
    if child.poll() is None:  # recorded now, so that a crash of ours leaves the job findable
        run.job = spool.jobs.rewrite(run.ref, run.job, run.room.pop(0), **process)
        process = {}
    else:  # ended already (a short job): its pid goes with its end record, and its room to the next job
        unused.append(run.room.pop(0))
    _forward_termination_to(child.pid)
    _note_code_change(run)
    returncode = _wait_within_limit(run, child)
    _end_leftovers(run, child.pid)  # the job ends when the last process of its group does
    if pump is not None:
        pump.join(PUMP_DRAIN_SECONDS)  # what is still in the pipe; children holding it do not hold us up
    sig = -returncode if returncode < 0 else None
    exit_code = 128 + sig if sig else returncode
    # The next job is in running/ and started before this one leaves running/: no worker ever sees
    # the slot free in between, and this job's end record is off the next one's way.
    ended_at = now_iso()  # the job's end, whenever it is recorded (after the next job's start)
    started = _start_successor(run, heard, unused) if exit_code == 0 else released(unused)
    finish(run, exit_code=exit_code, sig=sig, note=None, retry=True, ended_at=ended_at, recorded=process)
    after_end(spool, run.job["id"], where.get("hooks") or {})
    return exit_code, started


def _start_successor(run: Run, heard: Optional[successor.Heard], room: list[Reservation]) -> Optional[Started]:
    """The next job of the slot begun and started, if any. Whatever goes wrong with it, the ended
    job's end is recorded next: an error is said in its log, and what was left half done (a claim,
    room, a job moved but not started) is repaired as after a crash of ours (spool_layout.md §10)."""
    try:
        following = _begin_successor(run, heard, room)
        return _launch(following) if following is not None else None
    except Exception as exc:  # noqa: BLE001 - the ended job's end must not be lost to the next job's trouble
        _log_line(run.log_fd, f"could not start the next job of the slot: {exc!r}")
        released(room)
        return None


def _begin_successor(run: Run, heard: Optional[successor.Heard], room: list[Reservation]) -> Optional[Run]:
    """The next job the worker named for this slot (run/successor.py), begun under its claim (with
    `room` towards its own, the ended job's room it did not need), or None: `room` is released, and
    the worker starts what comes next."""
    named = _claim_successor(run, heard)
    if named is None:
        released(room)
        return None
    claim, word = named
    return _begin(run.spool, claim, word, room)  # None if it changed since the worker named it


def _claim_successor(run: Run, heard: Optional[successor.Heard]) -> Optional[tuple[Claim, dict[str, Any]]]:
    """The claim on the first job the worker named that is still pending, if this job ended by
    itself (no time limit, nobody asking to stop, kill or preempt it) and the disk has the room the
    worker asks before a start."""
    if heard is None or run.timed_out or _stopped or run.spool.control.peek(run.job["id"]) is not None:
        return None
    if free_bytes(run.spool.home) < MIN_FREE_TO_START:  # the worker would wait for room: so do we
        return None
    for word in heard.next_jobs():
        if run.spool.jobs.pending_ref(word["id"], word["file"]) is None:
            continue  # started by someone else, or cancelled: the next one is what the worker would start
        claim = run.spool.claims.claim(word["id"])
        if claim is None:  # the worker, a cancel or another worker is at it: leave the rest to them
            return None
        return claim, word
    return None


def _drop_queued_copy(run: Run) -> None:
    """Unlink the job's pending/ copy, left by the move to running/ until the job was started (the
    running copy has the higher rev meanwhile: spool_layout.md, section 6)."""
    if run.queued is not None:
        run.spool.jobs.remove(run.queued)
        run.queued = None


def _wait_within_limit(run: Run, child: subprocess.Popen) -> int:
    """Wait for the job; past its time limit (`--time`, else `gpuq run --default-time`) stop it
    as `gpuq kill` does (SIGTERM to its group, SIGKILL after a grace), or, for a --preemptible
    job, preempt it so that it keeps its checkpoint."""
    limit = run.job.get("time_limit") or run.where.get("default_time")
    if not limit:
        return child.wait()
    started = parse_iso(run.job.get("started_at")) or time.time()
    try:
        return child.wait(timeout=max(0.0, started + limit - time.time()))
    except subprocess.TimeoutExpired:
        pass
    from gpuq.core.timespec import format_duration  # only when a limit is reached

    run.timed_out = format_duration(limit)
    grace = _kill_grace(run)
    _log_line(run.log_fd, f"time limit of {run.timed_out} reached: stopping the job (SIGKILL after {grace:g}s)")
    if run.job.get("preemptible"):
        run.spool.control.request(run.job["id"], PREEMPT)
    run.termed_at = time.monotonic()
    procs.signal_group(child.pid, signal.SIGTERM)
    try:
        return child.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        procs.signal_group(child.pid, signal.SIGKILL)
        return child.wait()


def _kill_grace(run: Run) -> float:
    """Seconds between SIGTERM and SIGKILL for this job's processes (`gpuq run --kill-grace`)."""
    grace = run.where.get("kill_grace")
    return float(grace) if grace is not None else KILL_GRACE_SECONDS


def _end_leftovers(run: Run, pgid: int) -> None:
    """Whatever is left of the job's process group once its main process has ended (DataLoader
    workers, torchrun ranks, a pipeline's other end, a child that ignores SIGTERM) is ended, as
    Slurm ends a job step, before the job's end is recorded: they may hold the GPU the next job
    needs. Said in the job's log. A process that left the group (setsid, a daemon) is not touched."""
    grace = _kill_grace(run)
    end = procs.end_group(pgid, grace, since=run.termed_at)
    if end is None:
        return
    if end.by_term:
        _log_line(run.log_fd, f"ended what was left of the job's process group with SIGTERM: {', '.join(end.by_term)}")
    if end.by_kill:
        _log_line(run.log_fd, f"ended with SIGKILL after {grace:g}s: {', '.join(end.by_kill)}")
    if end.survivors:
        run.would_not_die = end.survivors
        _log_line(run.log_fd, f"still alive after SIGKILL: {', '.join(end.survivors)}")


def _note_code_change(run: Run) -> None:
    """Whether the code of the job's repository changed since it was queued (not for a snapshot,
    which runs the queued copy): said in its file, so `status` and `show` can say it."""
    queued = run.job.get("code")
    if not queued or run.job.get("snapshot"):
        return
    from gpuq.system import gitinfo  # only for jobs queued from a git repository

    now = gitinfo.provenance(run.job["cwd"])
    changed = gitinfo.changed(queued, now)
    if changed:  # an unchanged start needs no write: `code` is what runs
        _log_line(run.log_fd, changed)
        try:
            run.job = run.spool.jobs.rewrite(run.ref, run.job, code_changed=changed, code_at_start=now)
        except OSError as exc:  # a full disk: the log line has it; the job runs regardless
            _log_line(run.log_fd, f"could not record the code change in the job file: {exc}")


def _begin(spool: Spool, claim: Claim, where: dict[str, Any], ready: list[Reservation]) -> Optional[Run]:
    """pending -> running, with room set aside to record the job's pid and its end even if its
    output fills the disk (`ready`, if big and fresh enough). None (the claim given up, the job left
    as it is) when the job is gone or there is no room to start it: it stays pending."""
    room: list[Reservation] = list(ready)
    ref = spool.jobs.pending_ref(claim.job_id, where.get("file"))
    if ref is None:  # cancelled or already run by someone else since the worker looked
        for reservation in room:
            reservation.release()
        claim.release()
        return None
    try:
        job = spool.jobs.load(ref)
        if where.get("rev") is not None and job["rev"] != where["rev"]:
            raise FileNotFoundError(ref.name)  # changed since it was named: the worker looks again
        if spool.jobs.newer_copy_elsewhere(ref, job):  # a crash mid-move left this stale copy behind
            spool.jobs.remove(ref)
            raise FileNotFoundError(ref.name)
        room = room_for(spool, room, max(RESERVE_MIN, 2 * len(encode(job)) + 16384))
        # The supervisor's own identity needs psutil (an import of several ms): it is recorded with
        # the job's pid after the job has started, so the job does not wait for it.
        changes = transitions.start(
            job,
            slot=where.get("slot"),
            gpus=where.get("gpus"),
            boot_id=procs.boot_id(),
            host=os.uname().nodename,
            log=str(spool.layout.log_path(job["id"])),
        )
        queued = ref
        ref, job = spool.jobs.move(ref, job, RUNNING, changes, keep_old=True)  # pending/'s copy goes once it runs
    except (FileNotFoundError, schema.InvalidJob, SpoolFull):
        for reservation in room:
            reservation.release()
        claim.release()
        return None
    run = Run(spool, claim, ref, job, where, room)
    run.queued = queued
    run.log_fd = spool.logs.open_job_log(job["id"])
    slot = where.get("slot")
    _log_line(run.log_fd, f"job #{job['id']} {job['name']} (attempt {job['attempts']})")
    _log_line(run.log_fd, f"cmd: {shlex.join(job['cmd'])}")
    _log_line(run.log_fd, f"cwd: {job['cwd']}" + (f"  CUDA_VISIBLE_DEVICES={slot}" if slot is not None else ""))
    _log_line(run.log_fd, f"started: {job['started_at']}")
    return run


def _spawn(run: Run) -> tuple[subprocess.Popen, Optional[Any]]:
    """Start the job in its own session, its output into its log (through a pipe and the cap's
    pump when the log is capped)."""
    job = run.job
    cap = logcap.cap_of(job.get("max_log_bytes"), run.where.get("max_log_bytes"))
    out_fd, read_fd = run.log_fd, -1
    if cap:
        read_fd, out_fd = os.pipe()
    try:
        child = subprocess.Popen(
            job["cmd"],
            cwd=job["cwd"],
            env=job_environment(run.spool, job, run.where.get("slot")),
            stdin=subprocess.DEVNULL,
            # gpuq itself runs with umask 077; the job's files get the mask of the shell that queued it
            umask=job["umask"] if job.get("umask") is not None else schema.DEFAULT_JOB_UMASK,
            stdout=out_fd,
            stderr=out_fd,
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        if cap:
            os.close(read_fd)
            os.close(out_fd)
        raise
    if not cap:
        return child, None
    os.close(out_fd)
    log = logcap.CappedLog(run.log_fd, str(run.spool.logs.path_of(job)), cap)
    return child, logcap.pump(read_fd, log)


_me: Optional[dict[str, Any]] = None


def _identity() -> dict[str, Any]:
    """This supervisor's identity (it does not change from one job of its slot to the next)."""
    global _me
    if _me is None or _me["pid"] != os.getpid():  # (a spare is a fork: never its zygote's)
        _me = procs.identity(os.getpid())
    return _me


def _forward_termination_to(pgid: int) -> None:
    """If someone stops the supervisor itself, stop its job the same way instead of orphaning it."""

    def forward(signum: int, _frame: Any) -> None:
        global _stopped
        _stopped = True  # and nothing more is started by this supervisor
        procs.signal_group(pgid, signal.SIGTERM)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)


def finish(
    run: Run,
    *,
    exit_code: int,
    sig: Optional[int],
    note: Optional[str],
    retry: bool,
    ended_at: Optional[str] = None,
    recorded: Optional[dict[str, Any]] = None,
) -> int:
    """Record how the attempt ended, move the job on and give up the claim. The end goes into the
    blocks set aside at the start, so a disk the job filled cannot lose it; should even that fail,
    it is noted in the claim's lock file and written as soon as there is room. `recorded`: the
    job's process and this supervisor, for a job that ended before they were recorded."""
    spool, job = run.spool, run.job
    request = spool.control.take(job["id"])
    state, why = transitions.destination(job, exit_code, request, retry, run.timed_out)
    sig_name = signal.Signals(sig).name if sig else None
    how = None
    if state == PENDING:  # an automatic retry continues from the job's newest checkpoint
        from gpuq.engine.tracking import continuation  # rare: not loaded before the job starts

        how = continuation.plan(spool, job)
        why = f"{why}; {how.text()}"
    if exit_code != 0 and free_bytes(spool.home) < DISK_FULL_BYTES:
        why = f"{why or f'exit {exit_code}'}; {DISK_FULL_NOTE}"
    if run.would_not_die:
        why = f"{why or f'exit {exit_code}'}; {WOULD_NOT_DIE}{', '.join(run.would_not_die)}"
    reason = _failure_reason(run, state, exit_code, sig_name, request)
    changes = transitions.end_attempt(
        job, state, exit_code=exit_code, signal=sig_name, note=note or why, continuation=how, reason=reason,
        finished_at=ended_at,
    )  # fmt: skip
    changes.update(recorded or {})
    elapsed = time.time() - (parse_iso(job.get("started_at")) or time.time())
    ended = changes["history"][-1]["finished_at"]
    _log_line(
        run.log_fd, f"exit {exit_code}{f' ({sig_name})' if sig_name else ''} at {ended} after {elapsed:.1f}s -> {state}"
    )
    os.close(run.log_fd)
    if state == PREEMPTED:
        from gpuq.engine.tracking import continuation  # rare: not loaded before the job starts

        by = f"its time limit of {run.timed_out}" if run.timed_out else None
        changes.update(continuation.record_preemption(spool, job, exit_code, request or PREEMPT, by=by))
    _record_end(run, state, changes, exit_code)
    for reservation in run.room:
        reservation.release()
    run.claim.release()
    return exit_code


def _failure_reason(
    run: Run, state: str, exit_code: int, sig_name: Optional[str], request: Optional[str]
) -> Optional[str]:
    """Why a failed attempt failed, read from the tail of its log (never the whole log)."""
    if state not in (FAILED, PENDING) or exit_code == 0:
        return None
    from gpuq.core import failure  # only for failures

    tail, _mtime = run.spool.logs.tail(run.job, failure.TAIL_BYTES)
    limit = (run.job.get("time_limit") or run.where.get("default_time")) if run.timed_out else None
    return failure.reason(tail, exit_code, sig_name, killed_by_user=request == KILL, time_limit=limit)


def _record_end(run: Run, state: str, changes: dict[str, Any], exit_code: int) -> None:
    """Move the job to `state`, retrying (and saying so in the lock file) while the disk is full."""
    room = run.room[-1] if run.room else None
    delay = 1.0
    while True:
        try:
            run.spool.jobs.move(run.ref, run.job, state, changes, room)
            return
        except SpoolFull:
            room = None  # used up, or too small: from now on the spool's own room
            waiting = {"pid": os.getpid(), "exit_code": exit_code, "state": state, "waiting": "disk full"}
            if state == PREEMPTED:  # its request is taken: what recovery needs to record the preemption
                waiting.update(by=changes["preemptions"][-1]["by"], auto_resume=changes["auto_resume"])
            run.claim.note(waiting)
            time.sleep(delay)
            delay = min(FULL_RETRY_MAX_SECONDS, delay * 2)


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


def wait_for_assignment(spare_fd: int) -> Optional[tuple[int, dict[str, Any], successor.Heard]]:
    """A spare supervisor, started ahead of time so that a job does not wait for an interpreter
    to start, blocks here until the worker sends the claim's descriptor and where the job runs
    (`{"id", "slot", "gpus"}`) over the socket. None if the worker closed the socket (it stopped
    or died) without a job. With a job, the socket stays open until this process exits: its end
    of file is how the worker learns that a supervisor it did not start itself (a zygote's child,
    run/zygote.py) has exited."""
    import socket

    import psutil  # noqa: F401  (loaded now, while nobody waits; the job's identity needs it)

    sock = socket.socket(fileno=spare_fd)
    try:
        message, fds, _flags, _addr = socket.recv_fds(sock, 4096, 1)
    except OSError:
        sock.close()
        return None
    if not message or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        sock.close()
        return None
    line = sock.detach()
    os.set_inheritable(line, False)  # kept open, and never passed to the job
    os.set_blocking(line, False)  # read only once a job has ended, for what is there (run/successor.py)
    assignment, _newline, more = message.partition(b"\n")  # the worker's lines may follow at once
    return fds[0], json.loads(assignment), successor.Heard(line, more)


def name_process(name: str) -> None:
    """What `ps` and `top` show for this process (Linux: at most 15 bytes); nothing elsewhere."""
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(name)
    except OSError:
        pass


def serve_spare(home: str, spare_fd: int) -> int:
    """A spare supervisor: set room aside, wait for a job on `spare_fd`, run it."""
    name_process("gpuq-spare")
    spool = Spool(Path(home))
    ready = set_aside(spool)
    assignment = wait_for_assignment(spare_fd)
    if assignment is None:
        for reservation in ready:
            reservation.release()
        return 0
    name_process("gpuq-supervisor")
    lock_fd, where, heard = assignment
    job_id = int(where["id"])
    log_fd = spool.logs.open_job_log(job_id)  # our own errors go to the job's log, as for a fresh start
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    start(spool, spool.claims.adopt_descriptor(job_id, lock_fd), where, ready, heard)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.umask(0o077)
    if "--spare-fd" in args:
        return serve_spare(args["--home"], int(args["--spare-fd"]))
    name_process("gpuq-supervisor")
    spool = Spool(Path(args["--home"]))
    job_id, lock_fd, where = int(args["--job"]), int(args["--lock-fd"]), json.loads(args["--where"])
    start(spool, spool.claims.adopt_descriptor(job_id, lock_fd), where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
