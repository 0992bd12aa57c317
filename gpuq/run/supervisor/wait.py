"""The wait phase: a started job's pid recorded, then waited for within its time limit, and what is
left of its process group ended before its end is recorded (spool_layout.md, section 6).
"""

from __future__ import annotations

import functools
import os
import select
import signal
import subprocess
import time
from contextlib import suppress
from typing import Any, Callable, Optional

from gpuq.core.states import KILL_ACTIONS, PREEMPT, TIME_LIMIT
from gpuq.core.times import parse_iso
from gpuq.core.timespec import format_duration
from gpuq.run.supervisor import hostlimits, keeping, watch
from gpuq.run.supervisor.start import Pump, Run, log_line
from gpuq.spool import SpoolFull
from gpuq.system import procs, proctree

PUMP_DRAIN_SECONDS = 2.0  # what is still in a capped log's pipe once the job has ended
POLL_SECONDS = 0.05  # how often the job is looked at where its exit cannot be waited for with a pidfd
KILL_LOOK_SECONDS = 0.5  # how often a supervisor looks for a `gpuq kill` or `cancel` of its job
stopped = False  # someone stopped this supervisor (its job was told to stop too)


def record_process(run: Run, child: subprocess.Popen) -> dict[str, Any]:
    """The job's pid and this supervisor, recorded now if the job still runs, so that a crash of ours
    leaves it findable; else (or on a full disk) returned, to go with its end record."""
    ident = procs.identity(child.pid)  # before poll(): an ended child is still there, unreaped
    # the worker's --kill-grace with it: `gpuq kill` and `cancel` give the job the grace its end would;
    # and the worker's --default-time it is held to, for `show` and `triage` (the job's file has none)
    # `sends_term`: this supervisor SIGTERMs the job for a kill request; a command leaves it to one
    # that says so (one of an earlier gpuq, running on after an upgrade, does not send it)
    supervisor = {**_identity(), "sends_term": True}
    if run.order.kill_grace is not None:
        supervisor["kill_grace"] = run.order.kill_grace
    if run.job.time_limit is None and run.order.default_time:
        supervisor["default_time"] = run.order.default_time
    process = {"pid": child.pid, "pid_create_time": ident["create_time"], "supervisor": supervisor}
    if run.host is not None or run.job.host_limits_by:  # `host_limits_by`: an earlier attempt's cleared
        process["host_limits_by"] = run.host.recorded() if run.host is not None else None
    if child.poll() is None:
        with suppress(SpoolFull):
            run.job = run.spool.jobs.rewrite(run.ref, run.job, **process)
            return {}
    return process


# While the job runs: a descriptor to watch beside it (the worker's line), and what to do when it
# is readable, which says whether it is still worth watching (run/supervisor/main.py).
Listener = tuple[int, Callable[[], bool]]


def wait_for_end(
    run: Run, child: subprocess.Popen, pump: Optional[Pump], listener: Optional[Listener] = None
) -> tuple[int, Optional[int]]:
    """Wait for the job, end what is left of its group, drain its log: its exit code and the signal
    that ended it, if one did."""
    returncode = _wait_within_limit(run, child, listener)
    _end_leftovers(run, child.pid)  # the job ends when the last process of its group does
    hostlimits.close(run.host, lambda text: log_line(run.log_fd, text))  # did the kernel end it at its --mem?
    if pump is not None:
        pump.join(PUMP_DRAIN_SECONDS)  # what is still in the pipe; children holding it do not hold us up
    sig = -returncode if returncode < 0 else None
    return (128 + sig if sig else returncode), sig


def forward_termination_to(pgid: int) -> None:
    """If someone stops the supervisor itself, stop its job the same way instead of orphaning it."""

    def forward(signum: int, _frame: Any) -> None:
        global stopped
        stopped = True  # and nothing more is started by this supervisor
        proctree.signal_group(pgid, signal.SIGTERM)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)


def time_limit(run: Run) -> Optional[float]:
    return run.job.time_limit or run.order.default_time


def _wait_within_limit(run: Run, child: subprocess.Popen, listener: Optional[Listener]) -> int:
    """Wait for the job; past its time limit (or its --mem, under the watch) stop it as `gpuq kill`
    does, or preempt a --preemptible job so that it keeps its checkpoint."""
    limit = time_limit(run)
    deadline = (parse_iso(run.job.started_at) or time.time()) + limit if limit else None
    # its GPUs sampled, its checkpoints pruned by its rule, its memory watched, as it runs
    killing = KillWatch(run, child.pid)
    looks = [*watch.for_run(run), keeping.keeper(run), hostlimits.memory_watch(run.host, child.pid), killing]
    returncode = _wait_until(child, deadline, listener, [look for look in looks if look is not None])
    if returncode is not None:
        return returncode
    grace = kill_grace(run)
    if killing.asked is None:  # a look now: a kill asked since the last one stops the job, not its limit
        killing.due = time.time()
        killing.take_if_due()
    if killing.asked is not None:  # its SIGTERM sent: SIGKILL once the grace has passed since
        try:
            return child.wait(timeout=killing.seconds_left())
        except subprocess.TimeoutExpired:
            log_line(run.log_fd, f"still running {grace:g}s after `gpuq {killing.asked}`: SIGKILL")
            proctree.signal_group(child.pid, signal.SIGKILL)
            return child.wait()
    stopping, asked = hostlimits.stops(run.host, grace), False
    if stopping is not None:
        log_line(run.log_fd, stopping)
    else:
        assert limit is not None  # only the time limit or the memory watch ends the wait early
        reached = format_duration(limit)
        action = PREEMPT if run.job.preemptible else TIME_LIMIT
        with suppress(SpoolFull):  # without its note it is stopped all the same
            asked = not run.spool.control.request_unless_asked(run.job.id, action, parse_iso(run.job.started_at))
        # a preempt asked before the limit stays what ends the job, and says so; it sent its SIGTERM
        if not asked:
            run.timed_out = reached
            log_line(run.log_fd, f"time limit of {reached} reached: stopping the job (SIGKILL after {grace:g}s)")
    if not asked:  # else the preempt's command sent the SIGTERM
        run.termed_at = time.monotonic()
        proctree.signal_group(child.pid, signal.SIGTERM)
    try:
        return child.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proctree.signal_group(child.pid, signal.SIGKILL)
        return child.wait()


def _wait_until(
    child: subprocess.Popen, deadline: Optional[float], listener: Optional[Listener], samplers: list[Any]
) -> Optional[int]:
    """The job's exit code once it ends, or None if it still runs at `deadline` (time.time()) or once
    a sampler says it must stop (the memory watch)."""
    try:
        pidfd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        pidfd = -1  # no pidfd (macOS, Linux before 5.3): the job is looked at every POLL_SECONDS
    watched = [fd for fd in (pidfd, listener[0] if listener else -1) if fd >= 0]
    try:
        while (code := child.poll()) is None:
            left = None if deadline is None else deadline - time.time()
            if left is not None and left <= 0:
                return None
            waits = [sampler.seconds_left() for sampler in samplers] + ([] if left is None else [left])
            if pidfd < 0:
                waits.append(POLL_SECONDS)
            ready = select.select(watched, [], [], min(waits) if waits else None)[0]
            if listener is not None and listener[0] in ready and not listener[1]():
                watched.remove(listener[0])  # the line is closed: only the job is left to wait for
            stops = [sampler.take_if_due() for sampler in samplers]  # each takes its look
            if any(stops):  # the memory watch: past the job's --mem
                return child.poll()
        return code
    finally:
        if pidfd >= 0:
            os.close(pidfd)


class KillWatch:
    """One of the wait's samplers: it SIGTERMs the job's group when it finds a `gpuq kill` or `cancel`
    of the job (its control request), whose command leaves that to it (one stopped after asking sent
    none); `take_if_due` is True once the grace has passed since, the job still running. Whoever asked
    SIGKILLs it then too, but only if it still waits: an interrupted command, a stopped `top`, `web`
    or MCP server do not."""

    def __init__(self, run: Run, pgid: int):
        self.run, self.pgid, self.since, self.due = run, pgid, parse_iso(run.job.started_at), time.time()
        self.asked: Optional[str] = None

    def seconds_left(self) -> float:
        return max(0.0, self.due - time.time())

    def take_if_due(self) -> bool:
        now = time.time()
        if self.asked is None and now >= self.due:
            asked = self.run.spool.control.asked(self.run.job.id, self.since)
            if asked is not None and asked[0] in KILL_ACTIONS:
                self.asked, self.due = asked[0], now + kill_grace(self.run)
                self.run.termed_at = time.monotonic()
                proctree.signal_group(self.pgid, signal.SIGTERM)
            else:
                self.due = now + KILL_LOOK_SECONDS
        return self.asked is not None and now >= self.due


def kill_grace(run: Run) -> float:
    grace = run.order.kill_grace
    return float(grace) if grace is not None else proctree.KILL_GRACE_SECONDS


def _end_leftovers(run: Run, pgid: int) -> None:
    """What is left of the job's process group (DataLoader workers, torchrun ranks...) ended, as Slurm
    ends a job step, before the end is recorded: it may hold the GPU the next job needs."""
    grace = kill_grace(run)
    end = proctree.end_group(pgid, grace, since=run.termed_at)
    if end is None:
        return
    if end.by_term:
        log_line(run.log_fd, f"ended what was left of the job's process group with SIGTERM: {', '.join(end.by_term)}")
    if end.by_kill:
        log_line(run.log_fd, f"ended with SIGKILL after {grace:g}s: {', '.join(end.by_kill)}")
    if end.survivors:
        run.would_not_die = end.survivors
        log_line(run.log_fd, f"still alive after SIGKILL: {', '.join(end.survivors)}")


@functools.cache
def _identity() -> dict[str, Any]:  # this supervisor's, looked up once
    return procs.identity(os.getpid())
