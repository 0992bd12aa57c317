"""What the everyday commands do to jobs and workers. Every change to a job is made while holding
its claim, so it cannot race a worker starting it.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import suppress
from dataclasses import dataclass, field
from itertools import takewhile
from typing import Any, Callable, Optional

from gpuq.core import oom, schema, states, transitions
from gpuq.core.errors import Damaged, GpuqError, Refused
from gpuq.core.job import Job
from gpuq.core.states import (
    ACTIVE,
    CANCEL,
    CANCELLED,
    DONE,
    FAILED,
    FINISHED,
    HELD,
    INTERRUPTED,
    KILL,
    NEEDS_USER,
    PENDING,
    PREEMPTED,
    RAY,
    REJECTED,
    RUNNING,
    SLURM,
)
from gpuq.core.transitions import Continuation
from gpuq.engine.lifecycle import ending, ray_handover, repairs, slurm_handover
from gpuq.engine.lifecycle.ending import claimed, get, unseen_oom
from gpuq.engine.schedule import scheduler
from gpuq.engine.schedule.queue_read import PendingCache, load, read_queue
from gpuq.engine.tracking import continuation
from gpuq.spool import JobRef, Spool, SpoolFull
from gpuq.system import proctree

KILLED_THERE = "killed by user (gpuq kill)"
PID_WAIT_SECONDS = 5.0  # a job just handed to its supervisor gets its pid within milliseconds
# A kill's own SIGKILL comes this long after the grace: the job's supervisor SIGKILLs its group once
# the grace has passed since the request, and logs it; ours is for a dead supervisor's, an adopted job.
SUPERVISOR_LEAD = 2.0


def running_with_pid(spool: Spool, job_id: int) -> tuple[JobRef, Job]:
    """A running job, once its supervisor has recorded its pid if it is starting right now."""
    ref, job = get(spool, job_id, (RUNNING,))
    deadline = time.monotonic() + PID_WAIT_SECONDS
    while job.pid is None and time.monotonic() < deadline:
        time.sleep(0.05)
        ref, job = get(spool, job_id, (RUNNING,))
    return ref, job


def cancel(
    spool: Spool, job_id: int, killing: Callable[[float], object] = lambda _grace: None, force: bool = False
) -> Job:
    """A running job is killed first (`killing` told its grace just before), as Slurm's scancel does. `force`:
    a job on a cluster that cannot be told is recorded cancelled here only."""
    if spool.jobs.find(job_id, (RUNNING,)):
        return kill(spool, job_id, action=CANCEL, stopping=killing)
    if spool.jobs.find(job_id, (SLURM,)):
        return slurm_handover.cancel(spool, job_id, force=force)
    if spool.jobs.find(job_id, (RAY,)):
        return ray_handover.cancel(spool, job_id, force=force)
    with claimed(spool, job_id, (PENDING, HELD, PREEMPTED, INTERRUPTED)) as (ref, job):
        if states.handing_over(job):  # Slurm may hold it: cancelled only here, it would run there
            raise Refused(
                f"job #{job_id} is being handed to Slurm; `gpuq slurm submit {job_id}` finishes that, "
                f"then `gpuq cancel {job_id}`"
            )
        return ending.move(spool, ref, job, CANCELLED, transitions.cancel())[1]


def hold(spool: Spool, job_id: int) -> Job:
    if spool.jobs.find(job_id, (RUNNING,)):
        raise Refused(
            f"job #{job_id} is running and cannot be held; `gpuq preempt {job_id}` stops it, keeping its checkpoint"
        )
    with claimed(spool, job_id, (PENDING,)) as (ref, job):
        return spool.jobs.move(ref, job, HELD, transitions.hold())[1]


def release(spool: Spool, job_id: int) -> Job:
    with claimed(spool, job_id, (HELD,)) as (ref, job):
        return spool.jobs.move(ref, job, PENDING, transitions.release())[1]


def kill(
    spool: Spool, job_id: int, action: str = KILL, stopping: Callable[[float], object] = lambda _grace: None
) -> Job:
    """SIGTERM the running job's process group (its supervisor does, finding the request), SIGKILL after
    its worker's --kill-grace (`stopping` told that wait just before; ours by SUPERVISOR_LEAD later);
    its note says who asked. A job on a cluster is stopped there (scancel, Ray's stop) and cancelled,
    as `gpuq cancel` does."""
    if spool.jobs.find(job_id, (SLURM,)):
        return slurm_handover.cancel(spool, job_id, note=KILLED_THERE)
    if spool.jobs.find(job_id, (RAY,)):
        return ray_handover.cancel(spool, job_id, note=KILLED_THERE)
    _ref, job = running_with_pid(spool, job_id)
    grace = proctree.job_grace(job)
    stopping(grace + SUPERVISOR_LEAD if job.adopted else grace)  # an adopted job has no supervisor: ours
    term = True  # a full disk: the job is still stopped; its supervisor records it as failed (143)
    with suppress(SpoolFull):
        spool.control.request(job_id, action)
        # a live supervisor that says it does SIGTERMs the job when it finds the request, also if we are
        # stopped now; a second SIGTERM could restart the job's save. Ours goes to an adopted job, a dead
        # supervisor's, or one whose supervisor (of an earlier gpuq) sends none
        sends = bool((job.supervisor or {}).get("sends_term"))
        term = bool(job.adopted) or not (sends and spool.claims.held(job_id))
    if not proctree.terminate_tree(job, grace + SUPERVISOR_LEAD, term):
        raise Refused(f"job #{job_id} (pid {job.pid}) did not die")
    return wait_until_settled(spool, job_id)


def kill_each(spool: Spool, jobs: list[Job]) -> list[tuple[Job, Optional[str]]]:
    """`gpuq stop --kill-jobs`: (job, None) each, or (job, the state it ended in) for one that ended
    by itself since `jobs` were listed."""
    outcomes: list[tuple[Job, Optional[str]]] = []
    for job in jobs:
        try:
            kill(spool, job.id)
            outcomes.append((job, None))
        except Refused:
            found = spool.jobs.find(job.id)
            if found is None or found.state == RUNNING:
                raise  # still running (or gone): a real refusal
            outcomes.append((job, found.state))
    return outcomes


def wait_until_settled(spool: Spool, job_id: int, timeout: float = 10.0) -> Job:
    """The job once its end is recorded (by us if its supervisor is gone)."""
    deadline = time.monotonic() + timeout
    while spool.jobs.find(job_id, (RUNNING,)) is not None:
        repairs.settle_unsupervised(spool, repairs.Report())
        if time.monotonic() > deadline:
            raise Refused(f"job #{job_id} ended but its new state was not recorded within {timeout:.0f}s")
        time.sleep(0.05)
    return get(spool, job_id)[1]


def retry(spool: Spool, job_id: int, from_scratch: bool = False) -> tuple[Job, Continuation]:
    found = spool.jobs.find(job_id, (INTERRUPTED, PREEMPTED))
    if found is not None:  # not retried: each has its own command, which the refusal names
        how = f"`gpuq resume {job_id}`"
        how = f"`gpuq recover --jobs {job_id}` or {how}" if found.state == INTERRUPTED else how
        raise Refused(f"job #{job_id} is {found.state}, not failed or cancelled: {how} puts it back in the queue")
    return _requeue(spool, job_id, (FAILED, CANCELLED), "retried by user", from_scratch)


def _requeue(
    spool: Spool, job_id: int, states: tuple[str, ...], why: str, from_scratch: bool
) -> tuple[Job, Continuation]:
    """Back to pending with the same id, its history kept, from its newest checkpoint unless `from_scratch`."""
    with claimed(spool, job_id, states) as (ref, job):
        how = continuation.plan(spool, job, from_scratch)
        changes = transitions.requeue(job, f"{why}; {how.text()}", how)
        return ending.move(spool, ref, job, PENDING, changes)[1], how


def reached_their_end(spool: Spool) -> list[tuple[Job, str]]:
    """The interrupted jobs whose last attempt had reached its end (`step 10/10`): a re-run would do
    the work again, so only a person who names them re-queues them."""
    ended = ((job, continuation.reached_end(spool, job)) for job in jobs_in(spool, (INTERRUPTED,)))
    return [(job, reached) for job, reached in ended if reached]


def to_recover(spool: Spool) -> list[Job]:
    ended = {job.id for job, _reached in reached_their_end(spool)}
    return [job for job in jobs_in(spool, (INTERRUPTED,)) if job.id not in ended]


RECOVERED = "recovered after interruption"


def recover(spool: Spool, job_id: int, from_scratch: bool = False) -> tuple[Job, Continuation]:
    """An interrupted job back in the queue; one whose log shows its GPU ran out of memory gets the
    larger share, as its supervisor would have given it (recovery cannot know its exit code)."""
    with claimed(spool, job_id, (INTERRUPTED,)) as (ref, job):
        how = continuation.plan(spool, job, from_scratch)
        oomed = unseen_oom(spool, job)
        grown = f"; {oom.note(oomed[1])}" if oomed else ""
        changes = transitions.requeue(job, f"{RECOVERED}{grown}; {how.text()}", how)
        if oomed and job.history:
            changes.update(oom.retry(job, oomed[1]))
            last = {**job.history[-1], "change": oom.note(oomed[1])}
            changes["history"] = [*job.history[:-1], {**last, "reason": last.get("reason") or oomed[0]}]
        return spool.jobs.move(ref, job, PENDING, changes)[1], how


def recovery_plans(spool: Spool, from_scratch: bool = False) -> list[tuple[Job, Continuation]]:
    return [(job, continuation.plan(spool, job, from_scratch)) for job in to_recover(spool)]


def recover_at_start(spool: Spool) -> tuple[list[tuple[Job, Continuation]], list[tuple[Job, str]]]:
    """`gpuq run --recover`: (recovered, left, with why): a job interrupted more times in a row than
    its --retries allow (it may take the machine down), or one that had reached its end, is left."""
    recovered: list[tuple[Job, Continuation]] = []
    left = [(job, repairs.reached_end_text(reached)) for job, reached in reached_their_end(spool)]
    ended = {job.id for job, _why in left}
    for job in jobs_in(spool, (INTERRUPTED,)):
        if job.id in ended:
            continue
        earlier = reversed(job.history[:-1])
        in_a_row = sum(1 for _entry in takewhile(lambda entry: entry.get("outcome") == INTERRUPTED, earlier))
        if in_a_row > job.retries:
            left.append((job, "interrupted again"))
            continue
        try:
            recovered.append(recover(spool, job.id))
        except Refused:
            continue  # being changed right now: a person is on it
    return recovered, left


def sweep_jobs(spool: Spool, sweep_id: int) -> list[dict[str, Any]]:
    """The jobs of a sweep (consecutive ids from `sweep_id`)."""
    out = []
    index = spool.jobs.index()
    job_id = sweep_id
    while job_id in index:
        ref = index[job_id][-1]
        try:
            job = spool.jobs.load(ref)
        except (FileNotFoundError, schema.InvalidJob):
            break
        sweep = job.sweep
        if not isinstance(sweep, dict) or sweep.get("id") != sweep_id:
            break
        out.append({"id": job_id, "name": job.name, "state": ref.state, "values": sweep.get("values")})
        job_id += 1
    return out


def stop_workers(spool: Spool, timeout: float = 10.0) -> list[dict[str, Any]]:
    """SIGTERM every live worker and wait for them to exit. Jobs are left running."""
    workers = _signal_workers(spool, signal.SIGTERM)
    _signal_workers(spool, signal.SIGCONT)  # one stopped by Ctrl-Z takes its SIGTERM only once continued
    deadline = time.monotonic() + timeout
    while spool.workers.live():
        if time.monotonic() > deadline:
            raise Refused(f"worker did not stop within {timeout:.0f}s")
        time.sleep(0.05)
    return workers


def drain_workers(spool: Spool) -> list[dict[str, Any]]:
    """Ask every live worker to start nothing new and to exit once its jobs have ended."""
    return _signal_workers(spool, signal.SIGUSR1)


def _signal_workers(spool: Spool, signum: int) -> list[dict[str, Any]]:
    workers = spool.workers.live()
    for info in workers:
        with suppress(ProcessLookupError, KeyError, ValueError):
            os.kill(int(info["pid"]), signum)
    return workers


@dataclass
class Waited:
    """How the jobs `gpuq wait` waited for ended: id -> (state, why it is not done, or None).
    `stranded`: pending jobs no worker is running to start; `damaged`: jobs whose file is no job
    (they never run: not waited for)."""

    ends: dict[int, tuple[str, Optional[str]]] = field(default_factory=dict)
    stranded: list[int] = field(default_factory=list)
    damaged: list[int] = field(default_factory=list)

    @property
    def all_done(self) -> bool:
        return all(state == DONE for state, _why in self.ends.values())


def wait_for(
    spool: Spool,
    ids: list[int],
    timeout: Optional[float] = None,
    poll: float = 0.5,
    said: Callable[[int, str, str], None] = lambda _id, _state, _why: None,
) -> Waited:
    """Block until each job has ended (or can no longer start without a person) or `timeout` passes;
    stop once every job left is pending and no worker runs (`stranded`). A job whose file is
    damaged is waited for no longer (in running/, once no supervisor holds it to record its end),
    and `said` (id, state, why) at once."""
    index = spool.jobs.index()
    unknown = [i for i in ids if i not in index]
    if unknown:
        raise Refused(f"no such job {', '.join(f'#{i}' for i in unknown)}")
    cache, out = PendingCache(), Waited()
    deadline = None if timeout is None else time.monotonic() + timeout
    left = set(ids)
    while True:
        repairs.settle_unsupervised(spool, repairs.Report())  # a dead job ends as soon as we look
        # jobs on a cluster end when it says so; one that does not answer is asked again later
        for cluster, sync in ((SLURM, slurm_handover.sync), (RAY, ray_handover.sync)):
            if left & {ref.id for ref in spool.jobs.refs((cluster,))}:
                with suppress(GpuqError):
                    sync(spool)
        snap, reasons = _as_waited(spool, cache)
        for job_id in sorted(left):
            state = snap.states.get(job_id)
            wait = reasons.get(job_id)
            if state == PENDING and wait is not None and wait.forever:
                out.ends[job_id] = (state, f"blocked: {wait.reason}")
            elif state is None:
                out.ends[job_id] = _gone(spool, index[job_id][-1].name)
            elif waited_out(state, wait) or (state == RUNNING and not spool.claims.held(job_id)):
                try:
                    why = None if state == DONE else _why_not_done(spool, job_id, state)
                except Damaged as exc:
                    why = str(exc)
                    out.damaged.append(job_id)
                    said(job_id, state, why)
                if state != RUNNING or job_id in out.damaged:  # a whole one is settled once its process ended
                    out.ends[job_id] = (state, why)
        left -= set(out.ends)
        if not left:
            return out
        if all(snap.states.get(i) == PENDING for i in left) and not spool.workers.live():
            out.stranded = sorted(left)
            out.ends.update((job_id, (PENDING, "no worker is running")) for job_id in left)
            return out
        if deadline is not None and time.monotonic() > deadline:
            resuming = set(auto_resumed(spool))  # counted as pending above, but still in preempted/
            for job_id in left:
                state = PREEMPTED if job_id in resuming else snap.states.get(job_id, "gone")
                how = "for an urgent job, resumes by itself; " if job_id in resuming else ""
                out.ends[job_id] = (state, f"{how}still waiting when --timeout ran out")
            return out
        time.sleep(poll)


def waited_out(state: Optional[str], wait: Optional[scheduler.Wait]) -> bool:
    """`gpuq wait`'s rule: a job is waited for no longer once it ended or will not start without a
    person (held, preempted, interrupted, or pending and blocked for ever: `wait`, its reason)."""
    blocked = state == PENDING and wait is not None and wait.forever
    return state is None or state in FINISHED or state in NEEDS_USER or blocked


def will_not_start(spool: Spool, job_id: int, cache: Optional[PendingCache] = None) -> bool:
    """Whether `gpuq wait` would stop waiting for this job that has not started (`gpuq log -f`)."""
    snap, reasons = _as_waited(spool, cache)
    return waited_out(snap.states.get(job_id), reasons.get(job_id))


def _as_waited(
    spool: Spool, cache: Optional[PendingCache]
) -> tuple[scheduler.QueueState, dict[int, Optional[scheduler.Wait]]]:
    """The queue and why its pending jobs wait, with each job preempted for an urgent one counted as
    pending: the worker puts it back in line by itself, so it and its dependents are waited for."""
    snap, _ = read_queue(spool, cache)
    stopped = [job_id for job_id, state in snap.states.items() if state == PREEMPTED]
    if stopped:  # read after the listing: one resumed since then is gone from preempted/, and pending
        read = [(ref.id, load(spool, ref)) for ref in spool.jobs.refs((PREEMPTED,))]
        damaged = {i for i, job in read if isinstance(job, schema.InvalidJob)}  # stays preempted: no worker resumes it
        manual = damaged | {i for i, job in read if isinstance(job, Job) and not job.auto_resume}
        snap.states.update((job_id, PENDING) for job_id in stopped if job_id not in manual)
    return snap, scheduler.waiting_reasons(snap)


def auto_resumed(spool: Spool) -> list[int]:
    """The preempted jobs that a worker resumes by itself (victims of an urgent job)."""
    return [job.id for _ref, job in spool.jobs.load_many(PREEMPTED) if job.auto_resume]


def _gone(spool: Spool, name: str) -> tuple[str, Optional[str]]:
    """A job whose file left every state: the worker rejects a damaged one in pending/."""
    rejected = [n for n in spool.dropbox.rejected() if n == name or n.startswith(f"{name}.")]
    if not rejected:
        return "gone", None
    newest = max(rejected, key=spool.dropbox.rejected_at)
    why = spool.dropbox.reason(newest) or "no reason recorded"
    return REJECTED, f"{why} (its file is {REJECTED}/{newest}: `gpuq rejected`)"


def _why_not_done(spool: Spool, job_id: int, state: str) -> str:
    waits = {HELD: "release", PREEMPTED: "resume", INTERRUPTED: "recover --jobs"}.get(state)
    hint = f"waits for `gpuq {waits} {job_id}`" if waits else ""  # not `held: held`
    try:  # the copy in the state the look found: during a move the old one is still there too
        job = get(spool, job_id, (state,))[1]
    except Damaged:
        raise  # said apart: a file that is no job never runs, whatever its state would need
    except Refused:
        return hint
    code = f"exit {job.exit_code}" if job.exit_code is not None else ""
    return ": ".join(p for p in (code, job.reason or job.note or "") if p) or hint


def jobs_in(spool: Spool, states: tuple[str, ...] = ACTIVE) -> list[Job]:
    return [job for state in states for _ref, job in spool.jobs.load_many(state)]
