"""Handing pending jobs to Slurm (`submit`), keeping the spool the truth about them (`sync`), and
cancelling them there (`cancel`), by spool_layout.md's section 16. The batch script is written by the
caller's `build` (run/slurm_batch.py: this layer cannot import it).
"""

from __future__ import annotations

import hashlib
import shutil
import signal
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple, Optional, Sequence

from gpuq.core import states, transitions
from gpuq.core.errors import GpuqError, Refused
from gpuq.core.job import Job
from gpuq.core.states import CANCELLED, DONE, FAILED, FINISHED, PENDING, SLURM
from gpuq.core.times import iso_of, parse_iso
from gpuq.engine.lifecycle import ending
from gpuq.engine.lifecycle.ending import claimed, pending_jobs, record_end
from gpuq.spool import Spool
from gpuq.system import slurm as client
from gpuq.system.slurm import SlurmError, SlurmNoAnswer, SlurmUnreachable

Build = Callable[[Job, Mapping[int, int], list[str]], tuple[str, list[str]]]
Env = Optional[Mapping[str, str]]
# A Slurm job submitted before the mark was written is not the marked one; seconds of slack for the
# controller's clock. (Matters where Slurm has forgotten the job and its completion log keeps no
# comment: then a job of the same name submitted since the mark is taken for it.)
REPAIR_SLACK = 5.0


class Handed(NamedTuple):
    job: Job
    slurm_id: int
    repaired: bool = False  # found in Slurm after a hand-over cut short, not submitted again


@dataclass
class SyncReport:
    changed: list[Job] = field(default_factory=list)  # still in slurm/, state or reason new
    ended: list[tuple[Job, str]] = field(default_factory=list)  # (job, its gpuq state)
    repaired: list[Handed] = field(default_factory=list)


def spool_key(spool: Spool) -> str:
    """The spool's name in Slurm comments: a hash of its path (as the login node sees it). Jobs
    of an earlier spool at the same path are told apart by time (see REPAIR_SLACK)."""
    return hashlib.sha256(str(spool.home).encode()).hexdigest()[:12]


def spool_marker(spool: Spool, job_id: int) -> str:
    """`gpuq:<spool key>:<id>`: the `--comment` that names the job in Slurm."""
    return client.comment_marker(spool_key(spool), job_id)


@dataclass
class Submitted:
    handed: list[Handed] = field(default_factory=list)  # in the order they were handed over
    left: dict[int, str] = field(default_factory=dict)  # job id -> why it stays here (a line naming it)


def submit(
    spool: Spool,
    ids: Optional[Sequence[int]],
    extra_opts: Sequence[str],
    build: Build,
    env: Env = None,
    say: Callable[[Handed], None] = lambda handed: None,
) -> Submitted:
    """Hand over every job that can go, in dependency order, telling `say` of each; one that cannot
    stays here, with the reason. A controller that does not answer stops the rest."""
    if shutil.which("sbatch", path=env.get("PATH") if env is not None else None) is None:
        raise SlurmError("Slurm's sbatch is not on PATH: run gpuq on the cluster's login node")
    out = Submitted()
    jobs = pending_jobs(spool, ids, out.left)
    on_slurm = {ref.id for ref in spool.jobs.refs((SLURM,))}
    if any(d in on_slurm for j in jobs for d in j.after + j.after_any):
        sync(spool, env)  # a dependency Slurm finished (and may forget) must be seen as ended
    slurm_ids = _slurm_ids(spool)
    states = {ref.id: ref.state for ref in spool.jobs.refs()}
    stopped: Optional[str] = None  # why the rest is not tried
    for job in _in_dependency_order(jobs, out.left):
        job_id = job.id
        if stopped is not None:
            out.left[job_id] = f"job #{job_id} was not handed over: {stopped}"
            continue
        try:
            _check_dependencies(job, states, slurm_ids, out.left)
            result = _hand_over_one(spool, job_id, list(extra_opts), slurm_ids, build, env)
        except SlurmNoAnswer as exc:
            stopped = str(exc)
            out.left[job_id] = (
                f"job #{job_id}: {exc}; it may be on Slurm now: `gpuq slurm submit {job_id}` (or sync) finds it"
            )
        except SlurmUnreachable as exc:
            stopped = str(exc)
            out.left[job_id] = f"job #{job_id} stays here: {exc}"
        except GpuqError as exc:
            text = str(exc)  # the engine's refusals name the job; sbatch's and build's do not
            out.left[job_id] = text if text.startswith(f"job #{job_id} ") else f"job #{job_id} stays here: {text}"
        else:
            slurm_ids[job_id] = result.slurm_id
            out.handed.append(result)
            say(result)
    return out


def _slurm_ids(spool: Spool) -> dict[int, int]:
    """gpuq id -> Slurm id of every job in slurm/."""
    return {job.id: job.slurm["job_id"] for _ref, job in spool.jobs.load_many(SLURM) if job.slurm}


def _in_dependency_order(jobs: list[Job], left: dict[int, str]) -> list[Job]:
    """The jobs, each after those of them it depends on (ids break ties). Jobs that depend on each
    other in a circle go into `left` instead."""
    by_id = {job.id: job for job in jobs}
    done: dict[int, Job] = {}

    def visit(job_id: int, path: tuple[int, ...]) -> None:
        if job_id in done or job_id in left:
            return
        if job_id in path:
            circle = path[path.index(job_id) :]
            for member in circle:
                left[member] = f"jobs {', '.join(f'#{i}' for i in circle)} depend on each other in a circle"
            return
        for dep in sorted(by_id[job_id].after + by_id[job_id].after_any):
            if dep in by_id:
                visit(dep, path + (job_id,))
        if job_id not in left:
            done[job_id] = by_id[job_id]

    for job_id in sorted(by_id):
        visit(job_id, ())
    return list(done.values())


def _check_dependencies(job: Job, states: dict[int, str], slurm_ids: dict, left: dict[int, str]) -> None:
    """Refuse a dependency Slurm cannot be given: a job that will not end well, one left here, one
    gone (Slurm takes an unknown id as satisfied)."""
    for dep, any_end in [(d, False) for d in job.after] + [(d, True) for d in job.after_any]:
        state = states.get(dep)
        if dep in slurm_ids or state == DONE or (any_end and state in FINISHED):
            continue
        head = f"job #{job.id} runs after #{dep}"
        if dep in left:
            raise Refused(f"{head}, which stays here: it stays too")
        if state in (FAILED, CANCELLED):
            raise Refused(f"{head}, which {state}: it would never start (`gpuq retry {dep}` first, or --after-any)")
        if state is None:
            raise Refused(f"{head}, which is no longer in the queue")
        raise Refused(f"{head}, which is {state} here: hand it over too (`gpuq slurm submit {dep} {job.id}`)")


def _hand_over_one(spool: Spool, job_id: int, extra: list[str], slurm_ids: dict, build: Build, env: Env) -> Handed:
    with claimed(spool, job_id, (PENDING,)) as (ref, job):
        mark = job.slurm or {}
        if states.handing_over(job):  # a hand-over cut short: Slurm may have the job already
            found = _find(spool, job, env)
            if found is not None:
                return Handed(spool.jobs.move(ref, job, SLURM, transitions.hand_over(job, found))[1], found, True)
            extra = list(mark.get("cluster_opts") or [])
        else:
            job = spool.jobs.rewrite(ref, job, **transitions.slurm_submitting(extra))
        try:
            # The script resumes from checkpoints written since ckpt_since, as hand_over records it.
            since = job.ckpt_since or (job.slurm or {})["submitted_at"]
            script, options = build(Job(job, ckpt_since=since), slurm_ids, extra)
            slurm_id = client.submit(script, options, env=env)
        except (SlurmNoAnswer, KeyboardInterrupt):
            raise  # it may have been submitted: the mark stays; the next submit or sync repairs it
        except Exception:
            spool.jobs.rewrite(ref, job, **transitions.slurm_abandoned())  # Slurm did not take it
            raise
        return Handed(spool.jobs.move(ref, job, SLURM, transitions.hand_over(job, slurm_id))[1], slurm_id)


def _find(spool: Spool, job: Job, env: Env) -> Optional[int]:
    """The Slurm job a cut-short hand-over of `job` made, if any (the oldest, should there be two)."""
    mark = job.slurm or {}
    since = (parse_iso(mark.get("submitted_at")) or 0.0) - REPAIR_SLACK
    name = client.slurm_job_name(job.name or str(job.id))
    found = client.find_by_comment(spool_marker(spool, job.id), name=name, since=since, env=env)
    return found[0][0] if found else None


def sync(spool: Spool, env: Env = None) -> SyncReport:
    """Bring the files of jobs in slurm/ up to date with Slurm (see the module's docstring)."""
    report = SyncReport()
    report.repaired = _repair_marked(spool, env)
    jobs = {job.slurm["job_id"]: job.id for _ref, job in spool.jobs.load_many(SLURM) if job.slurm}
    if not jobs:
        return report
    seen = client.query(list(jobs), env=env)
    for slurm_id, job_id in sorted(jobs.items(), key=lambda item: item[1]):
        _record(spool, job_id, seen.get(slurm_id), report)
    return report


def _record(spool: Spool, job_id: int, seen: Optional[client.SlurmJob], report: SyncReport) -> None:
    try:
        with claimed(spool, job_id, (SLURM,)) as (ref, job):
            reason: Optional[str]
            if seen is None:
                state, reason = "UNKNOWN", "Slurm knows this job no more (`gpuq cancel` drops it)"
            elif seen.finished:
                changes = transitions.slurm_end(
                    job,
                    seen.state,
                    exit_code=seen.exit_code,
                    signal=signal.Signals(seen.signal).name if seen.signal and seen.signal < 65 else None,
                    started_at=iso_of(seen.start) if seen.start else None,
                    finished_at=iso_of(seen.end) if seen.end else None,
                )
                new_state = transitions.slurm_destination(seen.state, seen.exit_code)
                report.ended.append((record_end(spool, ref, job, new_state, changes)[1], new_state))
                return
            else:
                state, reason = seen.state, seen.reason
            started = iso_of(seen.start) if seen is not None and seen.state == "RUNNING" and seen.start else None
            mark = job.slurm or {}
            if (mark.get("state"), mark.get("reason")) != (state, reason) or (started and not job.started_at):
                changes = transitions.slurm_seen(job, state, reason, started)
                report.changed.append(spool.jobs.rewrite(ref, job, **changes))
    except Refused:
        return  # being changed by someone else right now (a cancel): the next sync sees it


def _repair_marked(spool: Spool, env: Env) -> list[Handed]:
    """Pending jobs marked by a hand-over that was cut short and whose Slurm job exists: moved to
    slurm/ with its id. Those Slurm never got stay marked for `gpuq slurm submit` to finish."""
    out = []
    for _ref, job in spool.jobs.load_many(PENDING):
        if not states.handing_over(job):
            continue
        try:
            with claimed(spool, job.id, (PENDING,)) as (ref, current):
                if not states.handing_over(current):
                    continue
                found = _find(spool, current, env)
                if found is not None:
                    moved = spool.jobs.move(ref, current, SLURM, transitions.hand_over(current, found))[1]
                    out.append(Handed(moved, found, True))
        except Refused:
            continue  # a hand-over in progress holds it
    return out


def cancel(spool: Spool, job_id: int, env: Env = None, note: str = "cancelled by user", force: bool = False) -> Job:
    """scancel the job's Slurm job, then move it to cancelled/ (also when Slurm no longer knows it).
    When Slurm cannot be asked, `force` records it cancelled here only; else refused."""
    with claimed(spool, job_id, (SLURM,)) as (ref, job):
        slurm_id = (job.slurm or {})["job_id"]
        try:
            _scancel(job_id, slurm_id, env)
        except SlurmError as exc:
            if not force:
                raise Refused(f"{exc}; {transitions.FORCE_HINT.format(id=job_id)}") from None
            forced = transitions.cancel_here_only(f"Slurm (job {slurm_id})", str(exc))
            return ending.move(spool, ref, job, CANCELLED, transitions.slurm_cancelled(job, forced))[1]
        changes = transitions.slurm_cancelled(job, f"{note} (scancel of Slurm job {slurm_id})")
        return ending.move(spool, ref, job, CANCELLED, changes)[1]


def _scancel(job_id: int, slurm_id: int, env: Env) -> None:
    """Cancel the Slurm job; Refused when Slurm had already ended it otherwise (a sync records that)."""
    if not client.cancel(slurm_id, env=env):
        seen = client.query([slurm_id], env=env).get(slurm_id)
        if seen is not None and seen.finished and seen.state != "CANCELLED":
            raise Refused(f"job #{job_id} already ended on Slurm ({seen.state}); `gpuq slurm sync` records it")
