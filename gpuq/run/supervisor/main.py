"""The supervisor's process: a spare waiting for its start order, then the job's phases (start,
wait, end) and, when the job ended by itself, the next job the worker named for its slot.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from contextlib import suppress
from typing import Optional

from gpuq.core.times import now_iso
from gpuq.engine.schedule import turns
from gpuq.run import successor
from gpuq.run.hooks import after_end
from gpuq.run.supervisor import end, start, wait
from gpuq.run.supervisor.order import StartOrder
from gpuq.run.supervisor.start import Run, Started
from gpuq.spool import Claim, Spool


def supervise(spool: Spool, claim: Claim, order: StartOrder, heard: Optional[successor.Heard]) -> int:
    """Run the claimed job (then those `heard` names for its slot) to the end; the last exit code."""
    run = start.begin(spool, claim, order)
    if run is None:
        return -1
    code, started = 127, _start(run)
    while started is not None:
        code, started = _run_to_end(*started, heard)
    return code


def _start(run: Run) -> Optional[Started]:
    try:
        child, pump = start.spawn(run)
    except OSError as exc:
        reason = f"could not start: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        start.log_line(run.log_fd, reason)
        end.finish(run, exit_code=127, sig=None, note=reason, retry=False)
        after_end(run.spool, run.job.id, run.order.hooks())
        return None
    return run, child, pump


def _run_to_end(
    run: Run, child: subprocess.Popen, pump: Optional[start.Pump], heard: Optional[successor.Heard]
) -> tuple[int, Optional[Started]]:
    recorded = wait.record_process(run, child)
    wait.forward_termination_to(child.pid)
    checking = start.check_code_while_running(run)
    run.spool.claims.ready()  # the next job's claim, at this one's end, then waits for nothing
    # while the job runs, the line is read as it comes, so that it never fills up
    listener = (heard.fd, heard.listen) if heard is not None else None
    exit_code, sig = wait.wait_for_end(run, child, pump, listener)
    ended_at = now_iso()  # the job's end, whenever it is recorded (after the next job's start)
    # The next job is in running/ and started before this one leaves running/: no worker ever sees
    # the slot free in between.
    started = _start_successor(run, heard) if exit_code == 0 else None
    if checking is not None:
        checking.join()  # it may still write the job's file: before the end record does
    end.finish(run, exit_code=exit_code, sig=sig, note=None, retry=True, ended_at=ended_at, recorded=recorded)
    after_end(run.spool, run.job.id, run.order.hooks())
    return exit_code, started


def _start_successor(run: Run, heard: Optional[successor.Heard]) -> Optional[Started]:
    """The next job of the slot started, if any. Whatever goes wrong with it, the ended job's end is
    recorded next; what was left half done is repaired as after a crash (spool_layout.md §10)."""
    try:
        named = _claim_successor(run, heard)
        if named is None:
            return None
        following = start.begin(run.spool, *named, run.leases)  # None: changed, or its GPUs leased, since
        return _start(following) if following is not None else None
    except Exception as exc:  # noqa: BLE001 - the ended job's end must not be lost to the next job's trouble
        start.log_line(run.log_fd, f"could not start the next job of the slot: {exc!r}")
        return None


def _claim_successor(run: Run, heard: Optional[successor.Heard]) -> Optional[tuple[Claim, StartOrder]]:
    """The claim on the first named job still pending, if this job ended by itself (no time limit, no
    request to stop, kill or preempt it)."""
    if heard is None or run.timed_out or wait.stopped or run.spool.control.peek(run.job.id) is not None:
        return None
    waiting = turns.others_waiting(held.lease.gpu_uuid for held in run.leases)
    if waiting is not None:  # another user's turn: the GPUs go back to every user's workers
        start.log_line(run.log_fd, f"GPUs not handed on to the next job: {waiting.who(os.geteuid())} waits for them")
        return None
    for order in heard.next_jobs():
        if run.spool.jobs.pending_ref(order.id, order.file) is None:
            continue  # started by someone else, or cancelled: the next one is what the worker would start
        claim = run.spool.claims.claim(order.id)
        if claim is None:  # the worker, a cancel or another worker is at it: leave the rest to them
            return None
        return claim, order
    return None


def wait_for_order(spare_fd: int) -> Optional[tuple[int, StartOrder, successor.Heard]]:
    """The claim's descriptor and start order, once the worker sends them; None if it closed the
    socket or sent something else. The socket then stays open: its end of file tells the worker
    this process has exited."""
    sock = socket.socket(fileno=spare_fd)
    try:
        message, fds, _flags, _addr = socket.recv_fds(sock, 4096, 1)
        line, _newline, more = message.partition(b"\n")  # the worker's lines may follow at once
        order = StartOrder.decode(line) if message and len(fds) == 1 else None
    except (OSError, ValueError):
        order, fds = None, []
    if order is None:
        for fd in fds:
            os.close(fd)
        sock.close()
        return None
    kept = sock.detach()
    os.set_inheritable(kept, False)  # kept open, and never passed to the job
    os.set_blocking(kept, False)  # read for what is there (run/successor.py)
    return fds[0], order, successor.Heard(kept, more)


def name_process(name: str) -> None:
    """What `ps` and `top` show (Linux: at most 15 bytes); nothing elsewhere."""
    with suppress(OSError), open("/proc/self/comm", "w") as fh:
        fh.write(name)


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or args[0] != "--home" or args[2] != "--spare-fd" or not args[3].isdigit():
        raise SystemExit(f"gpuq-supervisor: internal use only; expected --home H --spare-fd F, got {args}")
    os.umask(0o077)
    name_process("gpuq-spare")
    spool = Spool(args[1])
    assignment = wait_for_order(int(args[3]))
    if assignment is None:
        return 0
    name_process("gpuq-supervisor")
    lock_fd, order, heard = assignment
    log_fd = spool.logs.open_job_log(order.id)  # our own errors go to the job's log
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    supervise(spool, spool.claims.adopt_descriptor(order.id, lock_fd), order, heard)
    return 0


if __name__ == "__main__":
    sys.exit(main())
