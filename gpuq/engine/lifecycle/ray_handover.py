"""Handing pending jobs to a Ray cluster (`submit`), keeping the spool the record of them (`sync`),
and stopping them there (`cancel`), by spool_layout.md's section 17. Ray runs each job once; the
waits for `--after` jobs and the retries are done here. The entrypoint names run/ray_entry.py by
its module path: this layer cannot import it.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from gpuq.core import failure, oom, transitions
from gpuq.core import ray_transitions as rt
from gpuq.core.errors import GpuqError, Refused
from gpuq.core.job import Job
from gpuq.core.states import CANCELLED, DONE, FAILED, FINISHED, PENDING, RAY
from gpuq.core.times import duration, iso_of, parse_iso
from gpuq.engine.lifecycle import ending, ray_room
from gpuq.engine.lifecycle.ending import claimed, pending_jobs, record_end
from gpuq.spool import Spool
from gpuq.system import rayjobs as client
from gpuq.system.rayjobs import RayError, RayNoAnswer, RayUnreachable

MIB = 1 << 20
LAUNCHER = "import sys; sys.path.insert(0, sys.argv[1]); from gpuq.run.ray_entry import launch; launch()"
LAUNCHER_FIELDS = (
    "id name cmd cwd env shell_env venv conda ckpt_glob resume_arg ckpt_since attempts umask oom_retries".split()
)
PAYLOAD_VARIABLE = "GPUQ_RAY_JOB"  # the job as JSON, in the entrypoint's environment (Ray prints the entrypoint)
ENTRYPOINT_SHOWN = "Running entrypoint for job "  # Ray's log line before the entrypoint's output (Ray 2.60)
COMMAND_ERROR = "JOB_ENTRYPOINT_COMMAND_ERROR"  # Ray's error type of a command that exited non-zero
LOG_PREFIX = "=== gpuq: "  # gpuq's own lines in a job's log, as run/supervisor/start.py writes them


def entrypoint(job: Job) -> str:
    """The shell command Ray runs: this interpreter and this gpuq (on the shared filesystem) start
    the launcher in the job's directory; the job comes in PAYLOAD_VARIABLE."""
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    q = shlex.quote
    return (
        f"cd -- {q(job.cwd)} || {{ echo '=== gpuq: could not start: cannot enter the job directory'; exit 127; }}; "
        f"exec {q(sys.executable)} -E -S -c {q(LAUNCHER)} {q(package_parent)}"
    )


@dataclass
class Submitted:
    handed: list[Job] = field(default_factory=list)
    left: dict[int, str] = field(default_factory=dict)  # job id -> why it stays here (a line naming it)


@dataclass
class SyncReport:
    changed: list[Job] = field(default_factory=list)
    ended: list[tuple[Job, str]] = field(default_factory=list)
    retried: list[Job] = field(default_factory=list)
    back: list[tuple[Job, str]] = field(default_factory=list)  # sent back to pending/, why


def fits(job: Job, nodes: list[client.Node], address: str) -> Optional[str]:
    """Why no node of the cluster could ever run `job` (None: one could)."""
    gpus, cpus, mem = job.gpu_request or 0, job.cpus or 0, (job.mem_mib or 0) * MIB
    alive = [n for n in nodes if n.alive]
    if not alive:
        return f"the Ray cluster at {address} has no live node"
    for node in alive:
        t = node.total
        if t.get("GPU", 0) >= gpus and t.get("CPU", 0) >= cpus and t.get("memory", 0) >= mem:
            return None
    most = max(int(n.total.get("GPU", 0)) for n in alive)
    asks = f"{gpus} GPU(s)" + (f", {cpus} CPU(s)" if cpus else "") + (f", {job.mem_mib} MiB" if mem else "")
    return f"it asks for {asks}; no node of the Ray cluster at {address} has that (the most GPUs on one: {most})"


def cannot_travel(job: Job, now: float) -> Optional[str]:
    """What of the job Ray's job API has no place for (refused rather than dropped)."""
    if job.time_limit:
        limit = duration(job.time_limit)
        return f"its --time {limit} has no equivalent on Ray (run it here, or add it again without --time)"
    begin = parse_iso(job.begin_at)
    if begin is not None and begin > now:
        return f"it starts no earlier than {job.begin_at} (--begin), which Ray cannot wait for: hand it over then"
    return None


def missing_here(job: Job) -> Optional[str]:
    """What the job needs that does not exist even here (the nodes share this filesystem)."""
    for what, path in (("directory", job.cwd), ("venv", job.venv), ("conda environment", job.conda)):
        if path and not os.path.isdir(path):
            return f"its {what} {path} does not exist"
    return None


def submit(
    spool: Spool,
    ids: Optional[Sequence[int]],
    address: str,
    say: Callable[[Job], None] = lambda job: None,
) -> Submitted:
    """Hand over every job that can go, in dependency order; one that cannot stays pending with the
    reason. A cluster that does not answer stops the rest."""
    out = Submitted()
    jobs = pending_jobs(spool, ids, out.left)
    try:
        nodes = client.nodes(address)
    except RayError as exc:
        for job in jobs:
            out.left[job.id] = f"job #{job.id} stays here: {exc}"
        return out
    chosen = {job.id for job in jobs}
    states = {ref.id: ref.state for ref in spool.jobs.refs()}
    for job in sorted(jobs, key=lambda j: j.id):
        why = (
            cannot_travel(job, time.time())
            or missing_here(job)
            or fits(job, nodes, address)
            or _dependency_refusal(job, states, chosen, out.left)
        )
        if why:
            out.left[job.id] = f"job #{job.id} stays here: {why}"
            continue
        try:
            handed = _hand_over_one(spool, job.id, address, states)
        except (RayNoAnswer, RayUnreachable) as exc:
            if isinstance(exc, RayNoAnswer):  # it stays in ray/, marked SUBMITTING: a sync finds or submits it
                out.left[job.id] = f"job #{job.id}: {exc}; it may be on Ray now: `gpuq ray sync` finishes the hand-over"
            else:
                out.left[job.id] = f"job #{job.id} stays here: {exc}"
            for other in jobs:  # Ray stopped answering: the jobs after it are not tried
                if other.id > job.id and other.id not in out.left:
                    out.left[other.id] = f"job #{other.id} was not handed over: {exc}"
            break
        except GpuqError as exc:
            text = str(exc)
            out.left[job.id] = text if text.startswith(f"job #{job.id} ") else f"job #{job.id} stays here: {text}"
            continue
        states[job.id] = RAY
        out.handed.append(handed)
        say(handed)
    return out


def _dependency_refusal(job: Job, states: dict[int, str], chosen: set, left: dict[int, str]) -> Optional[str]:
    """Why `job` cannot go with its dependencies where they are (None: each is done, on Ray, or
    handed over before it)."""
    for dep, any_end in [(d, False) for d in job.after] + [(d, True) for d in job.after_any]:
        state = states.get(dep)
        if state in (DONE, RAY) or (any_end and state in FINISHED):
            continue
        if dep in left:
            return f"it runs after #{dep}, which stays here"
        if state in (FAILED, CANCELLED):
            return f"it runs after #{dep}, which {state}: it would never start (`gpuq retry {dep}` first)"
        if state is None:
            return f"it runs after #{dep}, which is no longer in the queue"
        if dep not in chosen or dep > job.id:
            return f"it runs after #{dep}, which is {state} here: hand it over too (`gpuq ray submit {dep} {job.id}`)"
    return None


def _deps_state(job: Job, states: dict[int, str]) -> tuple[bool, Optional[str]]:
    """(ready, why not): whether what `job` runs after has ended as it needs."""
    for dep in job.after:
        state = states.get(dep)
        if state in (FAILED, CANCELLED) or state is None:
            return False, f"#{dep} {state or 'is gone'}: it never starts (`gpuq cancel {job.id}`)"
        if state != DONE:
            return False, f"waits for #{dep}"
    for dep in job.after_any:
        if states.get(dep) is not None and states.get(dep) not in FINISHED:
            return False, f"waits for #{dep}"
    return True, None


def _hand_over_one(spool: Spool, job_id: int, address: str, states: dict) -> Job:
    with claimed(spool, job_id, (PENDING,)) as (ref, job):
        ready, _why = _deps_state(job, states)
        base = spool.logs.size(job)
        sub_id = rt.submission_id(os.urandom(4).hex(), job) if ready else None
        ref, job = spool.jobs.move(ref, job, RAY, rt.handing(job, address, sub_id, base))
        if sub_id is None:
            return job
        try:
            client.submit(address, entrypoint(job), sub_id, **submission_fields(spool, job))
        except RayNoAnswer:
            raise  # Ray may have it: the mark stays, and the next sync asks Ray for its id
        except RayUnreachable:
            spool.jobs.move(ref, job, PENDING, rt.back_to_queue("not handed over: the Ray cluster did not answer"))
            raise
        except RayError as exc:
            if client.get(address, sub_id) is None:  # refused, not taken: the job stays here
                spool.jobs.move(ref, job, PENDING, rt.back_to_queue(f"Ray refused it: {exc}"))
                raise
        return spool.jobs.rewrite(ref, job, **rt.seen(job, "PENDING", None, None))


def submission_fields(spool: Spool, job: Job) -> dict:
    """Ray's submission fields: the job's resources (ray_room.py), and the job itself for the
    launcher, with its progress file where gpuq's ETA reads it."""
    payload = {name: job.get(name) for name in LAUNCHER_FIELDS}
    payload["env"] = dict(job.env, GPUQ_PROGRESS_FILE=spool.reports.progress_path(job.id))
    room = ray_room.look(spool, (job.ray or {})["address"]) if ray_room.needs_look(job) else None
    return {
        "gpus": ray_room.num_gpus(job, room),
        "cpus": float(job.cpus or 0),
        "memory": (job.mem_mib or 0) * MIB,
        "env": {PAYLOAD_VARIABLE: json.dumps(payload)},
        "metadata": {"gpuq_job_id": str(job.id), "gpuq_name": job.name or ""},
        "resources": ray_room.resources(job, room),
    }


def sync(spool: Spool) -> SyncReport:
    """Bring the jobs in ray/ up to date with Ray: ended ones recorded (their log fetched), waiting
    ones submitted once their dependencies succeeded, failed ones with retries left submitted again."""
    report = SyncReport()
    states = {ref.id: ref.state for ref in spool.jobs.refs()}
    for _ref, job in sorted(spool.jobs.load_many(RAY), key=lambda item: item[1].id):
        try:
            with claimed(spool, job.id, (RAY,)) as (ref, current):
                _sync_one(spool, ref, current, report, states)
        except Refused:
            continue  # being changed by someone else right now: the next sync sees it
        except RayUnreachable:
            raise
        except RayError:
            continue
    return report


def _sync_one(spool: Spool, ref, job: Job, report: SyncReport, states: dict) -> None:
    mark = job.ray or {}
    address, sub_id = mark["address"], str(mark.get("submission_id"))
    if mark.get("state") == rt.WAITING:
        _submit_waiting(spool, ref, job, report, states)
        return
    seen = client.get(address, sub_id)
    if seen is None:
        if mark.get("state") == rt.SUBMITTING:  # a hand-over cut short
            client.submit(address, entrypoint(job), sub_id, **submission_fields(spool, job))
            report.changed.append(spool.jobs.rewrite(ref, job, **rt.seen(job, "PENDING", None, None)))
        elif mark.get("state") != "UNKNOWN":
            changes = rt.seen(job, "UNKNOWN", "Ray knows this job no more (`gpuq cancel` drops it)", None)
            report.changed.append(spool.jobs.rewrite(ref, job, **changes))
        return
    if seen.state == "RUNNING" or seen.finished:
        spool.logs.put_from(job.id, int(mark.get("log_base") or 0), own_part(client.logs(address, sub_id)))
    started = iso_of(seen.start) if seen.start and seen.state != "PENDING" else None
    if not seen.finished:
        if mark.get("state") != seen.state or (started and not job.started_at):
            report.changed.append(spool.jobs.rewrite(ref, job, **rt.seen(job, seen.state, None, started)))
        return
    _record_end(spool, ref, job, seen, started, report, states)


def own_part(text: str) -> bytes:
    """The job's output as Ray kept it, after Ray's line that shows the entrypoint; whole when Ray
    wrote no such line (it could not start the job: its lines say why)."""
    shown = text.find(ENTRYPOINT_SHOWN)
    start = text.find("\n", shown) + 1 if shown >= 0 else 0
    return text[start:].encode("utf-8", "replace") if start > 0 else text.encode("utf-8", "replace")


def _record_end(
    spool: Spool, ref, job: Job, seen: client.RayJob, started: Optional[str], report: SyncReport, states: dict
) -> None:
    finished = iso_of(seen.end) if seen.end else None
    reason = None
    if seen.state == "FAILED" and seen.error_type == COMMAND_ERROR:
        reason = failure.reason(spool.logs.tail(job)[0], seen.exit_code, None)  # as a local job's
    elif seen.state == "FAILED":
        reason = (
            "Ray: " + ((seen.message or "").strip().splitlines() or [seen.error_type or "no reason given"])[0][:200]
        )
    new_state = rt.destination(seen.state, seen.exit_code)
    counted = Job(dict(job, attempts=job.attempts + 1))  # as core/oom.py counts: the attempt that ended included
    grown = ray_room.growth(spool, job, reason, (job.ray or {})["address"]) if new_state == FAILED else None
    if grown is not None:
        again = oom.retry_left(counted)
    else:
        again = new_state == FAILED and counted.attempts - oom.extra_attempts(counted) <= job.retries
    if again:  # submitted again: as it was, or with `grown`'s larger share, its log saying so
        changes = rt.retried(job, seen.state, exit_code=seen.exit_code, times=(started, finished), reason=reason)
        if grown is not None:
            changes.update(oom.retry(job, grown))
            changes["history"][-1]["change"] = oom.note(grown)
            changes["note"] = f"attempt {job.attempts + 1}: {reason or 'out of memory'}; {oom.note(grown)}"
            line = f"out of memory: the next attempt gets {grown.text} ({oom.ENV}={job.oom_retries + 1})"
            spool.logs.put_from(job.id, spool.logs.size(job), f"{LOG_PREFIX}{line}\n".encode())
        job = spool.jobs.rewrite(ref, job, **changes)
        report.retried.append(job)
        _submit_waiting(spool, ref, job, report, states)  # at once: what it waited for had succeeded
        return
    if grown is not None:
        reason = f"{reason}; {oom.would_get(grown)}"
    changes = rt.ended(
        job, seen.state, exit_code=seen.exit_code, started_at=started, finished_at=finished, reason=reason
    )
    ended = record_end(spool, ref, job, new_state, changes)[1]
    report.ended.append((ended, new_state))
    states[job.id] = new_state  # a job after it, later in this same sync, goes now


def _submit_waiting(spool: Spool, ref, job: Job, report: SyncReport, states: dict) -> None:
    mark = job.ray or {}
    ready, why = _deps_state(job, states)
    if not ready:
        if mark.get("reason") != why:
            report.changed.append(spool.jobs.rewrite(ref, job, **rt.seen(job, rt.WAITING, why, None)))
        return
    address = mark["address"]
    refusal = fits(job, client.nodes(address), address)
    if refusal:
        moved = spool.jobs.move(ref, job, PENDING, rt.back_to_queue(f"not run on Ray: {refusal}"))[1]
        report.back.append((moved, refusal))
        return
    sub_id = rt.submission_id(os.urandom(4).hex(), job)
    job = spool.jobs.rewrite(ref, job, **rt.submitting(job, sub_id, spool.logs.size(job)))
    client.submit(address, entrypoint(job), sub_id, **submission_fields(spool, job))
    report.changed.append(spool.jobs.rewrite(ref, job, **rt.seen(job, "PENDING", None, None)))


def cancel(spool: Spool, job_id: int, note: str = "cancelled by user", force: bool = False) -> Job:
    """Stop the job's Ray job, then move it to cancelled/ (also when Ray no longer knows it). When
    Ray cannot be asked, `force` records it cancelled here only; else refused."""
    with claimed(spool, job_id, (RAY,)) as (ref, job):
        mark = job.ray or {}
        sub_id = mark.get("submission_id")
        started = None
        if sub_id and mark.get("state") != rt.WAITING:
            try:
                started = _stop(job_id, mark["address"], sub_id)
            except RayError as exc:
                if not force:
                    raise Refused(f"{exc}; {transitions.FORCE_HINT.format(id=job_id)}") from None
                forced = transitions.cancel_here_only(f"Ray (job {sub_id})", str(exc))
                return ending.move(spool, ref, job, CANCELLED, rt.cancelled(job, forced))[1]
            note = f"{note} (Ray job {sub_id} stopped)"
        return ending.move(spool, ref, job, CANCELLED, rt.cancelled(job, note, started))[1]


def _stop(job_id: int, address: str, sub_id: str) -> Optional[str]:
    """Stop the job unless it ended; when it started. Refused when Ray ended it otherwise."""
    seen = client.get(address, sub_id)
    if seen is not None and not seen.finished:
        client.stop(address, sub_id)
    elif seen is not None and seen.state in ("SUCCEEDED", "FAILED"):
        raise Refused(f"job #{job_id} already ended on Ray ({seen.state}); `gpuq ray sync` records it")
    return iso_of(seen.start) if seen is not None and seen.start and seen.state != "PENDING" else None
