"""The supervisor's process: a spare that waits for its start order, then runs the job through its
phases (start, wait, end) and, when the job ended by itself, the next job the worker named for its
slot (run/successor.py).

Every supervisor is started the same way: as a spare, on one end of a socket pair, before it has
a job: forked by the zygote (run/zygote.py) or, when none can be had, a new `python -S` running
main() below (run/launcher.py). The worker sends the order and the claim's descriptor over the
socket; the socket then stays open until this process exits, as the worker's line to it.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from gpuq.core.times import now_iso
from gpuq.run import successor
from gpuq.run.hooks import after_end
from gpuq.run.room import KEEP_FRESH_SECONDS, keep_fresh, released, set_aside
from gpuq.run.supervisor import end, start, wait
from gpuq.run.supervisor.order import StartOrder
from gpuq.run.supervisor.start import Run, Started
from gpuq.spool import Claim, Spool
from gpuq.spool.files import MIN_FREE_TO_START, Reservation, free_bytes
from gpuq.system import gpus


def supervise(
    spool: Spool, claim: Claim, order: StartOrder, ready: list[Reservation], heard: Optional[successor.Heard]
) -> int:
    """Run the claimed job to the end; returns the job's exit code (or -1 if it did not run).
    `ready`: room set aside while the spare waited (see run/room.py). `heard`: the worker's line:
    when the job ends by itself, this supervisor may go on with the next job the worker named
    there, and so on."""
    run = start.begin(spool, claim, order, ready)
    if run is None:
        return -1
    code, started = 127, _start(run)
    while started is not None:
        code, started = _run_to_end(*started, heard)
    return code


def _start(run: Run) -> Optional[Started]:
    """Start a begun job; if it cannot start, its end is recorded (exit 127) and None returned."""
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
    run: Run, child: subprocess.Popen, pump: Optional[Any], heard: Optional[successor.Heard]
) -> tuple[int, Optional[Started]]:
    """One started job to its end: its exit code, and the job started in its place, if any."""
    recorded, unused = wait.record_process(run, child)
    wait.forward_termination_to(child.pid)
    checking = start.check_code_while_running(run)
    ahead: list[Reservation] = []  # the next job's room, set aside once the worker names one
    exit_code, sig = wait.wait_for_end(run, child, pump, _listener(run, heard, ahead))
    # The next job is in running/ and started before this one leaves running/: no worker ever sees
    # the slot free in between, and this job's end record is off the next one's way.
    ended_at = now_iso()  # the job's end, whenever it is recorded (after the next job's start)
    room = unused + ahead  # the next job's: two blocks (run/room.py)
    started = _start_successor(run, heard, room[:2]) if exit_code == 0 else None
    if checking is not None:
        checking.join()  # it may still write the job's file: before the end record does
    end.finish(run, exit_code=exit_code, sig=sig, note=None, retry=True, ended_at=ended_at, recorded=recorded)
    released(room[2:] if exit_code == 0 else room)  # only now: the end sees the disk as the job left it
    after_end(run.spool, run.job.id, run.order.hooks())
    return exit_code, started


def _listener(run: Run, heard: Optional[successor.Heard], ahead: list[Reservation]) -> Optional[wait.Listener]:
    """While the job runs, the worker's line is listened to (and nothing else done with what it
    says) so that, once it names a next job for this slot, that job's room is set aside then: two
    files written and fsynced, off the way between this job's end and the next one's start (they
    were two of its four fsyncs). Room it does not get is set aside at its start, as before."""
    if heard is None:
        return None

    def heard_more() -> bool:
        try:
            still_open = heard.listen()
            if not ahead and heard.named():
                ahead.extend(set_aside(run.spool))
        except Exception as exc:  # noqa: BLE001 - the wait for the job must not end for this
            start.log_line(run.log_fd, f"could not set the next job's room aside: {exc!r}")
            return False  # what the line says is read again when the job ends
        return still_open

    return heard.fd, heard_more


def _start_successor(run: Run, heard: Optional[successor.Heard], room: list[Reservation]) -> Optional[Started]:
    """The next job of the slot begun and started, if any. Whatever goes wrong with it, the ended
    job's end is recorded next: an error is said in its log, and what was left half done (a claim,
    room, a job moved but not started) is repaired as after a crash of ours (spool_layout.md §10)."""
    try:
        named = _claim_successor(run, heard)
        if named is None:
            released(room)
            return None
        following = start.begin(run.spool, *named, room, run.leases)  # None: changed, or its GPUs leased, since
        return _start(following) if following is not None else None
    except Exception as exc:  # noqa: BLE001 - the ended job's end must not be lost to the next job's trouble
        start.log_line(run.log_fd, f"could not start the next job of the slot: {exc!r}")
        released(room)
        return None


def _claim_successor(run: Run, heard: Optional[successor.Heard]) -> Optional[tuple[Claim, StartOrder]]:
    """The claim on the first job the worker named that is still pending, if this job ended by
    itself (no time limit, nobody asking to stop, kill or preempt it) and the disk has the room the
    worker asks before a start."""
    if heard is None or run.timed_out or wait.stopped() or run.spool.control.peek(run.job.id) is not None:
        return None
    if free_bytes(run.spool.home) < MIN_FREE_TO_START:  # the worker would wait for room: so do we
        return None
    named = heard.next_jobs()
    if named and named[0].gpus and not _gpus_still_free(named[0]):
        return None
    for order in named:
        if run.spool.jobs.pending_ref(order.id, order.file) is None:
            continue  # started by someone else, or cancelled: the next one is what the worker would start
        claim = run.spool.claims.claim(order.id)
        if claim is None:  # the worker, a cancel or another worker is at it: leave the rest to them
            return None
        return claim, order
    return None


def _gpus_still_free(order: StartOrder) -> bool:
    """Whether the GPUs of the slot look now as the worker needs them to start a job there: no
    process on any of them (another job's, or one not gpuq's), and no more memory in use than the
    worker's --foreign-mem-threshold. Otherwise the worker decides, after a look of its own."""
    found = {gpu.index: gpu for gpu in gpus.look().gpus}
    threshold = order.foreign_threshold_mib or 0
    held = [found.get(index) for index in order.gpus or ()]
    return all(gpu is not None and not gpu.processes and gpu.memory_used_mib <= threshold for gpu in held)


def wait_for_order(
    spare_fd: int, room: Optional[list[Reservation]] = None
) -> Optional[tuple[int, StartOrder, successor.Heard]]:
    """Block until the worker sends the claim's descriptor and the job's start order over the
    socket, keeping the `room` set aside for the job fresh meanwhile. None if the worker closed the
    socket (it stopped or died) without a job, or sent something else. With a job, the socket stays
    open until this process exits: its end of file is how the worker learns that this supervisor
    has exited (it is not the parent of a forked one)."""
    sock = socket.socket(fileno=spare_fd)
    if not select.select([sock], [], [], 0)[0]:  # nobody waits yet: load now what the job's start needs
        import psutil  # noqa: F401  (the job's identity, recorded once it runs; a fork has it already)
    while room and not select.select([sock], [], [], KEEP_FRESH_SECONDS)[0]:
        keep_fresh(room)
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
    os.set_blocking(kept, False)  # read only once a job has ended, for what is there (run/successor.py)
    return fds[0], order, successor.Heard(kept, more)


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
    assignment = wait_for_order(spare_fd, ready)
    if assignment is None:
        released(ready)
        return 0
    name_process("gpuq-supervisor")
    lock_fd, order, heard = assignment
    log_fd = spool.logs.open_job_log(order.id)  # our own errors go to the job's log
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    supervise(spool, spool.claims.adopt_descriptor(order.id, lock_fd), order, ready, heard)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """`--home H --spare-fd F`, as the worker's launcher starts a supervisor (run/launcher.py)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or args[0] != "--home" or args[2] != "--spare-fd" or not args[3].isdigit():
        raise SystemExit(f"gpuq-supervisor: internal use only; expected --home H --spare-fd F, got {args}")
    os.umask(0o077)
    return serve_spare(args[1], int(args[3]))


if __name__ == "__main__":
    sys.exit(main())
