"""Preempt, resume and urgent jobs, as a library (spool_layout.md section 11). A preempted job keeps
its id: `resume` puts the same file back in pending/, so dependents wait for the continuation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from gpuq.core import transitions
from gpuq.core.errors import Refused
from gpuq.core.job import Job
from gpuq.core.states import ACTIVE, INTERRUPTED, PENDING, PREEMPT, PREEMPT_RESUME, PREEMPTED, RUNNING
from gpuq.engine.lifecycle import actions
from gpuq.engine.schedule.planner import Assignment
from gpuq.engine.tracking import checkpoints, continuation
from gpuq.spool import Spool
from gpuq.system import proctree

DEFAULT_TIMEOUT = 60.0  # HF's JIT save waits 3 s after SIGTERM, then saves: allow for big models
FORCE_WAIT = 10.0


@dataclass
class Outcome:
    job: Job
    state: str  # where the job is now
    left: list[int]  # pids still alive (timeout without --force)


def preempt(
    spool: Spool, job_id: int, timeout: float = DEFAULT_TIMEOUT, force: bool = False, say: Callable = lambda _t: None
) -> Outcome:
    _ref, job = actions.running_with_pid(spool, job_id)
    pgid = job.pid
    if not pgid:
        raise Refused(f"job #{job_id} has no process yet; try again")
    snapshot = proctree.ungrouped_tree(pgid)
    spool.control.request(job_id, PREEMPT)
    proctree.terminate(pgid, snapshot)
    say(f"sent SIGTERM to job #{job_id}'s process group (pid {pgid}); waiting up to {timeout:g}s for it to exit...")
    left = proctree.wait_gone(pgid, snapshot, timeout)
    if left and force:
        say(f"still alive after {timeout:g}s: {_pids(left)}; sending SIGKILL")
        left = proctree.wait_gone(pgid, snapshot, FORCE_WAIT, kill=True)
        if left:
            raise Refused(f"job #{job_id}: processes {_pids(left)} survived SIGKILL")
    if left:
        # The request stays: SIGTERM is sent, so however it exits (still saving, or later) it is
        # preempted, not failed or retried. A main process gone with others ignoring SIGTERM: the
        # supervisor keeps it in running/ until they are.
        return Outcome(job, RUNNING, [p.pid for p in left])
    job = actions.wait_until_settled(spool, job_id)
    found = spool.jobs.find(job_id)
    return Outcome(job, found.state if found else "unknown", [])


def _pids(processes: list[Any]) -> str:
    return ", ".join(str(p.pid) for p in processes)


@dataclass
class Resumed:
    job: Job
    checkpoint: Optional[checkpoints.Checkpoint]


def resume(spool: Spool, job_id: int, require_checkpoint: bool = False, front: bool = True) -> Resumed:
    """Put a preempted (or interrupted) job back in pending/ with its newest checkpoint, keeping
    its id; first in line unless `front` is False."""
    found = spool.jobs.find(job_id)
    if found is not None and found.state in ACTIVE:
        raise Refused(f"job #{job_id} is already {found.state}; nothing to resume")
    with actions.claimed(spool, job_id, (PREEMPTED, INTERRUPTED)) as (ref, job):
        how = continuation.plan(spool, job)
        if how.checkpoint is None and require_checkpoint:
            why = "it was queued with --no-resume" if job.no_resume else checkpoints.where_looked(job)
            raise Refused(f"job #{job_id}: no complete checkpoint ({why}); left {ref.state}")
        if how.checkpoint is not None:
            note = f"resumes from {how.checkpoint}"
        elif job.no_resume:
            note = "starts from scratch: queued with --no-resume"
        else:
            note = f"no checkpoint found ({checkpoints.where_looked(job)}): starts from scratch"
        changes = transitions.resume(job, how, front, note)
        ckpt = checkpoints.Checkpoint(how.checkpoint, how.step) if how.checkpoint else None
        return Resumed(spool.jobs.move(ref, job, PENDING, changes)[1], ckpt)


def resume_auto(spool: Spool) -> tuple[list[Resumed], bool]:
    """Resume every job the worker preempted for an urgent job; and whether one was still busy."""
    out, busy = [], False
    for _ref, job in spool.jobs.load_many(PREEMPTED):
        if job.auto_resume:
            try:
                out.append(resume(spool, job.id))
            except Refused:
                busy = True  # busy or changed meanwhile: the next step tries again
    return out, busy


# How long the GPUs emptied for an urgent job wait for it: longer than a victim may take to go, but
# not for ever should something else (another user's process) keep the job from them.
KEPT_SECONDS = 2 * DEFAULT_TIMEOUT


@dataclass
class Preemption:
    where: Assignment  # the slot or GPUs it holds until every process of it is gone
    pgid: int
    snapshot: list[Any]
    deadline: float


@dataclass
class Kept:
    """GPUs emptied for an urgent job, kept for it until it starts (or `until`)."""

    job_id: int
    gpus: frozenset[int]
    until: float


class UrgentPreemptions:
    """A worker's preemptions under way: a victim's slot stays unused until every process of it is gone."""

    def __init__(self, spool: Spool):
        self.spool = spool
        self.under_way: dict[int, Preemption] = {}  # job id -> its preemption
        self.kept: Optional[Kept] = None

    def begin(self, victim: Job, now: float, for_job: Optional[int] = None) -> None:
        pgid = victim.pid
        assert pgid is not None  # victims are chosen among jobs with a process
        snapshot = proctree.ungrouped_tree(pgid)
        self.spool.control.request(victim.id, PREEMPT_RESUME)
        proctree.terminate(pgid, snapshot)
        where = Assignment.of_job(victim)
        self.under_way[victim.id] = Preemption(where, pgid, snapshot, now + DEFAULT_TIMEOUT)
        if for_job is not None and where.gpus:
            gpus = set(where.gpus) | (self.kept.gpus if self.kept and self.kept.job_id == for_job else set())
            self.kept = Kept(for_job, frozenset(gpus), now + KEPT_SECONDS)

    def kept_for(self) -> Optional[tuple[int, frozenset[int]]]:
        """The urgent job preemptions made room for and the GPUs they empty: kept for it, so that
        no other job (an urgent one ahead of it, a victim put back first in line) takes them."""
        return (self.kept.job_id, self.kept.gpus) if self.kept else None

    def holding(self, state_of: dict[int, str], now: float) -> dict[int, Assignment]:
        """Where victims still alive hold their place; past the grace, SIGKILL (at each look: a process
        may have been forked meanwhile)."""
        if self.kept and (state_of.get(self.kept.job_id) != PENDING or now >= self.kept.until):
            self.kept = None  # it started (or is gone): the GPUs are its or anyone's
        for job_id, p in list(self.under_way.items()):
            left = proctree.leftovers(p.pgid, p.snapshot)
            if state_of.get(job_id) != RUNNING and not left:
                del self.under_way[job_id]
            elif left and now >= p.deadline:
                proctree.signal_each(left, "kill")
        return {job_id: p.where for job_id, p in self.under_way.items()}
