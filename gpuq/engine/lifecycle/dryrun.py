"""`gpuq add --dry-run`: the request is prepared and checked as a real `add`'s; then the jobs join an
in-memory copy of the queue, where the scheduler and the queue's ETA say whether and when each would
start. Nothing is written: no id taken, no cache made, no spool created.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from functools import partial
from typing import Any, Optional

from gpuq.core import jobenv
from gpuq.core.job import Job
from gpuq.core.states import HELD, PENDING
from gpuq.core.timespec import format_duration
from gpuq.core.words import plural
from gpuq.engine.lifecycle import enqueue
from gpuq.engine.schedule import gpuview, hostroom, scheduler
from gpuq.engine.schedule.queue_read import read_queue
from gpuq.engine.tracking import eta, queue_eta
from gpuq.engine.views.card import FOUND_BY
from gpuq.engine.views.status import known_waits
from gpuq.spool import Spool


def show(request: enqueue.Request, as_json: bool) -> int:
    plan = plan_add(Spool(), request)
    if as_json:
        print(json.dumps(plan, indent=2, ensure_ascii=False))
        return 0
    for warning in plan["warnings"]:
        print(warning, file=sys.stderr)
    print(f"would queue {plural(len(plan['jobs']), 'job')} (--dry-run: nothing queued):")
    for job in plan["jobs"]:
        print("\n".join(_planned_lines(job)))
    for note in plan["notes"]:
        print(note)
    return 0


def _planned_lines(job: dict[str, Any]) -> list[str]:
    how = job["interpreter_from"]
    found = f" (from {FOUND_BY.get(how, how)})" if how else ""
    gpus = "a CPU job" if job["gpus"] == 0 else plural(job["gpus"], "GPU")
    if job["gpu_mem_mib"]:
        gpus += f", {job['gpu_mem_mib']} MiB each"
    limits = [gpus]
    if job["mem_mib"]:
        limits.append(f"{hostroom.size_text(job['mem_mib'])} host memory")
    if job["cpus"]:
        limits.append(plural(job["cpus"], "CPU"))
    if job["time_limit_seconds"]:
        limits.append(f"time limit {format_duration(job['time_limit_seconds'])}")
    deps = job["after"] + job["after_any"]
    limits += [f"after {', '.join(f'#{d}' for d in deps)}"] if deps else []
    limits += [f"begins {job['begin_at']}"] if job["begin_at"] else []
    start = job["would_start"]
    when = "would start now" if start["now"] else f"would not start now: {start['why_not']}"
    said = start["estimate"].startswith("unknown") or bool(start["why_not"] and start["why_not"] in start["estimate"])
    return [
        f"  #{job['id']} {job['name']}{'  (held)' if job['state'] == HELD else ''}",
        f"    command    {job['command_line']}",
        f"    directory  {job['cwd']}",
        *([f"    python     {job['interpreter']}{found}"] if job["interpreter"] else []),
        f"    env        {' '.join(f'{k}={shlex.quote(v)}' for k, v in job['env'].items())}",
        f"    needs      {'; '.join(limits)}",
        f"    {when}" + ("" if said else f" ({start['estimate']})"),
    ]


def plan_add(spool: Spool, request: enqueue.Request) -> dict[str, Any]:
    """JSON-ready: {"dry_run", "jobs": [...], "notes", "warnings"}."""
    prepared = enqueue.prepare(request)
    exists = os.path.isdir(spool.layout.internal_dir("workers"))  # a spool made (its last parts too)
    enqueue.check(spool, prepared, spool.workers.gpu_views(tidy=False) if exists else None, gpus=exists)
    jobs = _new_jobs(prepared, spool.ids.peek() if exists else 1)
    state = prepared.fields["state"]
    starts = _would_start(spool, jobs, state) if exists else {job.id: _start(False, NO_WORKER, None) for job in jobs}
    return {
        "dry_run": True,
        "jobs": [_entry(job, prepared.fields, starts[job.id]) for job in jobs],
        "notes": prepared.notes,
        "warnings": prepared.warnings,
    }


def starts_now(spool: Spool, prepared: enqueue.Prepared) -> bool:
    """Whether the first job `prepared` queues would start at once, asked before it is queued (for
    `add --urgent`: a free slot it fits means nothing is preempted)."""
    jobs = _new_jobs(prepared, spool.ids.peek())
    return bool(_would_start(spool, jobs, prepared.fields["state"])[jobs[0].id]["now"])


def _new_jobs(prepared: enqueue.Prepared, first_id: int) -> list[Job]:
    fields = {k: v for k, v in prepared.fields.items() if k != "state"}
    # as `enqueue_many` makes them, less their log's path and their code's copy (`--snapshot`
    # copies the repository only when it queues them: `snapshot_of` names it)
    fields["options"] = dict(fields["options"], snapshot=None)
    return enqueue.new_jobs(first_id, prepared.variants, **fields)


def _entry(job: Job, fields: dict[str, Any], starts: dict[str, Any]) -> dict[str, Any]:
    snapshot = (fields["options"] or {}).get("snapshot")
    runs_python = len(job.cmd) > 1 and job.cmd[1].endswith(".py") and os.path.basename(job.cmd[0]).startswith("python")
    return {
        "id": job.id,
        "name": job.name,
        "command": job.cmd,
        "command_line": shlex.join(job.cmd),
        "interpreter": job.cmd[0] if runs_python else None,
        "interpreter_from": job.interpreter_from,
        "venv": job.venv,
        "conda": job.conda,
        "cwd": job.cwd,
        "env": _env_added(job),
        "gpus": job.gpu_request,
        "gpu_mem_mib": job.gpu_mem_mib,
        "mem_mib": job.mem_mib,
        "cpus": job.cpus,
        "time_limit_seconds": job.time_limit,
        "begin_at": job.begin_at,
        "after": job.after,
        "after_any": job.after_any,
        "priority": job.priority,
        "retries": job.retries,
        "urgent": job.urgent,
        "preemptible": job.preemptible,
        "sweep": job.sweep["values"] if isinstance(job.sweep, dict) else None,
        "code": job.code,
        "snapshot_of": snapshot["repo"] if isinstance(snapshot, dict) else None,
        "state": fields["state"],
        "would_start": starts,
    }


def _env_added(job: Job) -> dict[str, str]:
    """What gpuq adds to the environment the job starts in (core/jobenv.py)."""
    env: dict[str, str] = {}
    jobenv.add_job_variables(env, job)
    if "PATH" in env:
        env["PATH"] += os.pathsep + "$PATH"  # put before the PATH it starts with
    return env


NO_WORKER = "no worker is running; `gpuq run --daemon` starts one"


def _start(now: bool, why: Optional[str], starts_in: Optional[float], estimate: str = "") -> dict[str, Any]:
    return {
        "now": now,
        "why_not": why,
        "starts_in_seconds": None if starts_in is None else round(starts_in, 1),
        "estimate": estimate or ("now" if now else "unknown"),
    }


def _would_start(spool: Spool, jobs: list[Job], state: str) -> dict[int, dict[str, Any]]:
    """Job id -> whether it would start at once, why not, and the queue's estimate of when."""
    if state == HELD:
        return {job.id: _start(False, "held (--hold): it starts after `gpuq release`", None) for job in jobs}
    snap, _invalid = read_queue(spool)
    for job in jobs:
        snap.states[job.id] = PENDING
    snap.pending += jobs
    views = spool.workers.gpu_views(tidy=False)
    live = spool.workers.live(tidy=False)
    workers = [info for info in live if not info.get("draining")]  # `gpuq stop --drain`: it starts nothing new
    shown = gpuview.current(spool, snap.running, views)
    waits = known_waits(spool, snap, [], views, shown)
    waits.update({i: wait for i, wait in _host_waits(snap, workers, jobs).items() if i not in waits})
    reasons = scheduler.waiting_reasons(snap, waits)
    now = time.time()
    plan = _plan(spool, snap, reasons, workers, shown, now)
    out = {}
    for job in jobs:
        wait, estimate = reasons.get(job.id), plan.get(job.id)
        starts_in = estimate.starts_in if estimate is not None else None
        note = estimate.method if estimate is not None else ""
        if wait is not None and wait.forever:  # whatever the workers do
            out[job.id] = _start(False, wait.reason, None, note)
        elif not workers:
            out[job.id] = _start(False, scheduler.DRAINING if live else NO_WORKER, None, note)
        elif wait is not None:
            out[job.id] = _start(False, wait.reason, starts_in, note)
        elif starts_in is not None and starts_in <= 0:
            out[job.id] = _start(True, None, 0.0, note)
        else:
            out[job.id] = _start(False, "every slot it could take is busy", starts_in, note)
    return out


def _host_waits(
    snap: scheduler.QueueState, workers: list[dict[str, Any]], jobs: list[Job]
) -> dict[int, scheduler.Wait]:
    """Why each of `jobs` would wait for host memory or CPUs, as a worker's planner admits it. With
    several workers, a job any of them admits does not wait; else the first one's reason is given."""
    if not workers or not any(hostroom.asks(job) for job in jobs):
        return {}
    new = {job.id for job in jobs}
    order = scheduler.queue_order(snap.pending)
    ready = [j for j in order if scheduler.waiting_reason(j, snap.states, now=snap.now) is None]
    found: list[dict[int, scheduler.Wait]] = []
    for info in workers:
        room = hostroom.Room(partial(_cap_of, info), lambda: snap.running)
        waits: dict[int, scheduler.Wait] = {}
        list(room.admitted(ready, waits))  # each ready job in line, admitted or told why not
        found.append({i: wait for i, wait in waits.items() if i in new})
    return {i: wait for i, wait in found[0].items() if all(i in waits for waits in found)}


def _cap_of(info: dict[str, Any]) -> hostroom.Cap:
    """A worker's cap as its registry entry says it, else a default one (an older entry)."""
    cap = info.get("host_cap")
    if isinstance(cap, dict) and all(isinstance(cap.get(k), int) for k in ("mem_mib", "cpus")):
        return hostroom.Cap(cap["mem_mib"], cap["cpus"])
    return hostroom.cap(None, None)


def _plan(
    spool: Spool,
    snap: scheduler.QueueState,
    reasons: dict[int, Optional[scheduler.Wait]],
    workers: list[dict[str, Any]],
    shown: Optional[dict[str, Any]],
    now: float,
) -> dict[int, eta.Estimate]:
    """queue_eta.plan_queue, as `queue_eta.annotate` calls it, with nothing recorded."""
    pending = scheduler.queue_order(snap.pending)
    running = [(job, eta.running_estimate(spool, job, now, keep=False).eta_seconds) for job in snap.running]
    keys = {eta.command_key(job) for job in pending}
    durations = queue_eta.past_durations(spool, keys, spool.finished.read(write=False))  # writes nothing
    gpus = shown["gpus"] if shown else []
    threshold = shown.get("foreign_threshold_mib") if shown else None
    return queue_eta.plan_queue(
        running,
        [(job, reasons.get(job.id)) for job in pending],
        queue_eta.worker_slots(workers, [g["index"] for g in gpus]),
        durations,
        now,
        queue_eta.outside_memory(gpus, spool.home),
        threshold if isinstance(threshold, int) else queue_eta.DEFAULT_FOREIGN_THRESHOLD_MIB,
        queue_eta.gpu_cap(shown, spool.home),
        turns=queue_eta.others_turns(gpus, spool.home),
    )
