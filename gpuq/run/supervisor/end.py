"""The end phase: how the attempt ended, recorded through engine/lifecycle/ending.py, and the claim
given up (spool_layout.md, section 6; section 14 for a full disk).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Optional

from gpuq.core import failure, oom, transitions
from gpuq.core.states import FAILED, KILL_ACTIONS, PENDING, PREEMPT, PREEMPTED, TIME_LIMIT
from gpuq.core.times import parse_iso
from gpuq.engine.lifecycle import ending
from gpuq.engine.tracking import continuation, retention
from gpuq.run.supervisor import keeping
from gpuq.run.supervisor.hostlimits import reached
from gpuq.run.supervisor.lease import record_usage, release
from gpuq.run.supervisor.start import Run, log_line
from gpuq.run.supervisor.wait import time_limit
from gpuq.spool.files import free_bytes
from gpuq.system import gpus

DISK_FULL_BYTES = 64 * 1024  # a filesystem with less free than this counts as full
DISK_FULL_NOTE = "the disk was full when it ended (its output may have failed for lack of space)"
WOULD_NOT_DIE = "processes of its group outlived SIGKILL (uninterruptible?): "


def finish(
    run: Run,
    *,
    exit_code: int,
    sig: Optional[int],
    note: Optional[str],
    retry: bool,
    ended_at: Optional[str] = None,
    recorded: Optional[dict[str, Any]] = None,
) -> None:
    """Record how the attempt ended, move the job on and give up the claim. On a full disk the end
    is noted in the claim's lock file and written once there is room."""
    spool, job = run.spool, run.job
    # Its processes are gone: its GPUs are free. Released before its end is recorded, so that the
    # worker, which starts the next job once this one leaves running/, never finds its lease there.
    release(run.leases)
    record_usage(run.leases)  # before the worker sees the job end, and ranks the waiting users by usage
    request = spool.control.take(job.id, since=parse_iso(job.started_at))  # not one left for the run before
    request = None if request == TIME_LIMIT else request  # our own, for `status`: run.timed_out says it
    # a job that reached its end as it was asked to stop is done: its progress, read for that one only
    completed = continuation.reached_end(spool, job, counted=True) if request and exit_code == 0 else None
    state, why = transitions.destination(
        job, exit_code, request, retry, run.timed_out, host_memory=reached(run.host), completed=completed
    )
    if completed and why:
        log_line(run.log_fd, why)
    sig_name = signal.Signals(sig).name if sig else None
    if state == PREEMPTED:
        why = None  # the preemption's record says it (engine/lifecycle/ending.attempt_end)
    else:
        if exit_code != 0 and free_bytes(spool.home) < DISK_FULL_BYTES:
            why = f"{why or f'exit {exit_code}'}; {DISK_FULL_NOTE}"
        if run.would_not_die:
            why = f"{why or f'exit {exit_code}'}; {WOULD_NOT_DIE}{', '.join(run.would_not_die)}"
    reason = _failure_reason(run, state, exit_code, sig_name, request)
    oom_changes: dict[str, Any] = {}
    grown = _oom_growth(run, state, reason) if request is None else None
    if grown is not None and retry and oom.retry_left(job):
        state, oom_changes = PENDING, oom.retry(job, grown)
        why = f"attempt {job.attempts}: {reason or 'out of memory'}; {oom.note(grown)}"
        log_line(run.log_fd, f"out of memory: the next attempt gets {grown.text} ({oom.ENV}={job.oom_retries + 1})")
    elif grown is not None and state == FAILED:
        reason = f"{reason}; {oom.would_get(grown)}"
    end = ending.End(
        state, exit_code, signal=sig_name, note=note or why, reason=reason, finished_at=ended_at,
        preempt_action=request or PREEMPT,
        preempted_by=f"its time limit of {run.timed_out}" if run.timed_out else None,
    )  # fmt: skip
    changes = ending.attempt_end(spool, job, end)
    changes.update(_checkpoints_at_end(run))
    if oom_changes:
        changes.update(oom_changes)
        changes["history"][-1]["change"] = oom.note(grown) if grown else None
    changes.update(recorded or {})
    elapsed = time.time() - (parse_iso(job.started_at) or time.time())
    ended = changes["history"][-1]["finished_at"]
    log_line(
        run.log_fd, f"exit {exit_code}{f' ({sig_name})' if sig_name else ''} at {ended} after {elapsed:.1f}s -> {state}"
    )
    os.close(run.log_fd)
    ending.record_end(spool, run.ref, job, state, changes, while_full=lambda: _note_end(run, state, changes))
    run.claim.release()


def _checkpoints_at_end(run: Run) -> dict[str, Any]:
    """Its checkpoints pruned by its rule once more, and the newest one's size (the disk guard's)."""
    keeping.prune(run, keeping.rule(run))
    size = retention.newest_bytes(run.job)
    return {} if size is None else {"ckpt_bytes": size}


def _oom_growth(run: Run, state: str, reason: Optional[str]) -> Optional[oom.Growth]:
    """The larger share an out-of-memory failure would get (core/oom.py), or None."""
    if state not in (FAILED, PENDING):
        return None
    memory, largest = reached(run.host), None
    if memory is None and not run.order.gpus:
        return None  # it held no GPU (a machine without any, a CPU job): there is no GPU share to grow
    if memory is None and oom.gpu_oom(reason) and run.job.gpu_request:
        sizes = [gpu.memory_total_mib for gpu in gpus.look().gpus]  # its sizes, as the worker sees them
        largest = max(sizes) if sizes else None
    return oom.grow(run.job, reason, memory, largest, run.order.host_mem_cap_mib)


def _note_end(run: Run, state: str, changes: dict[str, Any]) -> None:
    """The end in the claim's lock file: what recovery records should this supervisor die meanwhile."""
    waiting = {"pid": os.getpid(), "exit_code": changes["exit_code"], "state": state, "waiting": "disk full"}
    waiting["finished_at"] = changes["history"][-1]["finished_at"]  # `status` shows the run's time up to its end
    if state == PREEMPTED:  # its request is taken: what recovery needs to record the preemption
        waiting.update(by=changes["preemptions"][-1]["by"], auto_resume=changes["auto_resume"])
    run.claim.note(waiting)


def _failure_reason(
    run: Run, state: str, exit_code: int, sig_name: Optional[str], request: Optional[str]
) -> Optional[str]:
    """Why a failed attempt failed, read from the tail of its log (never the whole log)."""
    memory = reached(run.host)
    if state not in (FAILED, PENDING) or (exit_code == 0 and not memory):
        return None
    tail, _mtime = run.spool.logs.tail(run.job, failure.TAIL_BYTES)
    limit = time_limit(run) if run.timed_out else None
    return failure.reason(
        tail, exit_code, sig_name, killed_by_user=request in KILL_ACTIONS, time_limit=limit, host_memory=memory
    )
