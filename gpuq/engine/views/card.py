"""What `gpuq show ID` and `gpuq log ID` tell a person about one job: the fields a person asks
about, each a label and one line, empty ones left out (`--json` is the file as it is)."""

from __future__ import annotations

import os
import shlex
import time
from collections import Counter
from typing import Optional

from gpuq.core.job import Job
from gpuq.core.states import (
    CANCELLED,
    FINISHED,
    HELD,
    HELD_NOTE,
    PENDING,
    PREEMPTED,
    RAY,
    RUNNING,
    SLURM,
    SOURCE_ADOPT,
    SOURCE_CLI,
    SOURCE_IMPORTED,
)
from gpuq.core.times import duration, parse_iso
from gpuq.core.timespec import format_duration
from gpuq.core.transitions import describe_preemption
from gpuq.core.words import plural, stopping_text, url_text
from gpuq.engine.lifecycle import interpreter
from gpuq.engine.lifecycle.actions import sweep_jobs
from gpuq.engine.schedule import gpuview, hostroom, scheduler
from gpuq.engine.schedule.queue_read import read_queue
from gpuq.engine.tracking import gpuuse
from gpuq.engine.views import attempts
from gpuq.engine.views.status import pending_reasons
from gpuq.spool import JobRef, Spool
from gpuq.system.gpu_presence import may_have_gpus
from gpuq.system.gpus import mib_text
from gpuq.system.security import display

Line = tuple[str, str]  # (label, text)
INHERITED = "inherited from the shell (`gpuq show %d --env` lists them)"
# `resumed_from` is where the next or the running attempt starts, else where the last one did
RESUMED_FROM = {PENDING: "resumes from", HELD: "resumes from", RUNNING: "resumed from"}

# How the interpreter was found (the job's `interpreter_from`), as the card says it
FOUND_BY = {
    interpreter.FROM_PYTHON: "--python",
    interpreter.FROM_CONDA: "--conda",
    interpreter.FROM_VENV: "the nearest .venv",
    interpreter.FROM_ACTIVE_CONDA: "the conda env active when it was added",
    interpreter.FROM_PATH: "PATH",
}


def card(spool: Spool, ref: JobRef, job: Job, now: Optional[float] = None) -> list[Line]:
    """The lines of `gpuq show`, in the order a person reads them; an empty field has none."""
    now = time.time() if now is None else now
    figures = gpuuse.of_job(spool, job.id) if job.gpu_request else None
    lines = [
        *_what_runs(job),
        *_state(spool, ref.state, job),
        *_times(ref.state, job, now),
        *_outcome(job),
        *_checkpoints(ref.state, job),
        *_gpus(ref.state, job),
        ("GPU use", gpuuse.summary_text(figures) if figures else ""),
        ("host", hostroom.request_text(job)),  # what it reserves of the machine (--mem, --cpus)
        ("host limits", _host_limits(job)),  # how its latest attempt was held to it
        *_dependencies(spool, job),
        *_attempts(job),
        ("out-of-memory retries", attempts.oom_retries_text(job, ref.state)),
        *(attempts.attempt_lines(job) if any(entry.get("change") for entry in job.history) else ()),
        ("time limit", _time_limit(job)),
        ("begins", _clock(job.begin_at)),
        ("notify", _notify(job)),
        ("on finish", job.on_finish or ""),
        *_sweep(spool, job),
        *_provenance(job),
        ("log", _log(spool, ref, job)),
    ]
    return [(label, text) for label, text in lines if text]


def worker_time_limit(job: Job) -> Optional[float]:
    """The worker's --default-time its supervisor held the job to (it has no --time of its own)."""
    limit = (job.supervisor or {}).get("default_time")
    return float(limit) if isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit > 0 else None


def _time_limit(job: Job) -> str:
    if job.time_limit:
        return format_duration(job.time_limit)
    limit = worker_time_limit(job)
    return f"{format_duration(limit)} (the worker's --default-time)" if limit else ""


def _log(spool: Spool, ref: JobRef, job: Job) -> str:
    gone = log_gone(spool, ref, job)
    return spool.logs.path_of(job) + (f" {gone}" if gone else "")


def not_started(spool: Spool, ref: JobRef, job: Job) -> Optional[str]:
    """Why `gpuq log` has nothing for a job that never ran; None for one that ran or has a log."""
    if ref.state not in (PENDING, HELD, CANCELLED) or spool.logs.size(job) or job.started_at:
        return None
    if ref.state == CANCELLED:
        return "cancelled before it ran"
    return f"{ref.state}: {why_waiting(spool, ref.state, job)}"


def log_gone(spool: Spool, ref: JobRef, job: Job) -> Optional[str]:
    """`was removed (...)`: what became of a job's log that is not there; None while it is or may be."""
    if not job.started_at or ref.state in (PENDING, HELD, RUNNING) or spool.logs.signature(job) is not None:
        return None
    # an adopted or imported job's log is a file of its own, which gpuq never removes
    if ref.state in FINISHED and not (job.adopted or job.source.startswith(SOURCE_IMPORTED)):
        return "was removed (`gpuq clear --logs` removes the logs of finished jobs)"
    return "is not there"


def why_waiting(spool: Spool, state: str, job: Job) -> str:
    """Why a pending or held job has not started, as `gpuq status` says it."""
    if state == HELD:
        return f"`gpuq release {job.id}` puts it back in line"
    snap, _ = read_queue(spool)
    live, views = spool.workers.live(), spool.workers.gpu_views()
    shown = gpuview.current(spool, snap.running, views)
    wait = pending_reasons(spool, snap, live, views, shown).get(job.id)
    if wait is not None:
        return (scheduler.BLOCKED if wait.forever else "") + wait.reason
    if not live:
        return "no worker is running; `gpuq run --daemon` starts one"
    return "next in line for a worker"


def python_text(job: Job) -> str:
    """The interpreter of a job that runs a *.py script and how it was chosen; "" otherwise."""
    how, cmd = job.interpreter_from, job.cmd
    if not (len(cmd) > 1 and cmd[1].endswith(".py") and os.path.basename(cmd[0]).startswith("python")):
        return ""
    chosen = interpreter.interpreter_in_front(cmd, how, job.venv or job.conda)
    return cmd[0] + (f" (from {FOUND_BY.get(how, how)})" if how and chosen else "")  # else: as typed


def _what_runs(job: Job) -> list[Line]:
    inherited = job.shell_env
    return [
        ("command", display(shlex.join(job.cmd))),  # a file name with escapes must not reach a terminal raw
        ("directory", job.cwd),
        ("python", python_text(job)),
        ("venv", job.venv or ""),
        ("conda", job.conda or ""),
        ("env", " ".join(f"{k}={shlex.quote(v)}" for k, v in job.env.items())),
        ("shell env", inherited is not None and f"{plural(len(inherited), 'variable')} {INHERITED % job.id}" or ""),
    ]


def _state(spool: Spool, state: str, job: Job) -> list[Line]:
    why = ""
    if state == HELD and job.note and job.note != HELD_NOTE:
        why = job.note  # another note on a held job (`gpuq hold`'s own says what status says: below)
    elif state in (PENDING, HELD):
        why = why_waiting(spool, state, job)
    elif state == RUNNING:
        where = f"GPU {job.slot}" if job.slot else ("CPU" if job.gpus == [] else "")  # "": a CPU job beside GPU ones
        asked = spool.control.asked(job.id, since=parse_iso(job.started_at))  # being killed or preempted
        stopping = stopping_text(*asked, time.time()) if asked else ""
        pid = f"pid {job.pid}" if job.pid else "starting"
        why = ", ".join(p for p in (stopping, pid, where, f"on {job.host}" if job.host else "") if p)
    elif state == SLURM and isinstance(job.slurm, dict):
        why = f"Slurm job {job.slurm.get('job_id') or '(being submitted)'}: {job.slurm.get('state')}"
    elif state == RAY and isinstance(job.ray, dict):
        sub = job.ray.get("submission_id") or "(waiting for its dependencies)"
        why = f"Ray job {sub} at {job.ray.get('address')}: {job.ray.get('state')}"
        if job.ray.get("reason"):
            why += f" ({job.ray['reason']})"
    urgent = f"urgent={job.urgent}" if isinstance(job.urgent, str) else "urgent" if job.urgent else ""
    flags = [f"priority {job.priority}" if job.priority else "", urgent]
    shown = state + (f": {why}" if why else "")
    note = job.note if job.note != why and not (state == HELD and job.note == HELD_NOTE) else ""
    return [("state", shown), ("note", note or ""), ("flags", ", ".join(f for f in flags if f))]


def _clock(iso: Optional[str]) -> str:
    when = parse_iso(iso)
    return "" if when is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))


def _times(state: str, job: Job, now: float) -> list[Line]:
    queued, started, finished = (parse_iso(t) for t in (job.created_at, job.started_at, job.finished_at))
    # the wait before its first start: a later attempt's start (a retry, a resume) counts earlier runs too
    first_at = job.history[0].get("started_at") if job.history else job.started_at
    first = parse_iso(first_at)
    # an adopted process started before it was queued: it never waited
    wait = duration(first - queued) if first and queued else ""
    told = [f"first started {_clock(first_at)}"] if first and first_at != job.started_at else []
    told += [f"after {wait} in the queue"] if wait else []
    waited = f" ({', '.join(told)})" if told else ""
    ran = ""
    if started and finished and finished >= started:
        ran = duration(finished - started)
    elif started and state == RUNNING:
        ran = duration(now - started) + " so far"
    return [
        ("queued", _clock(job.created_at)),
        ("started", _clock(job.started_at) and _clock(job.started_at) + waited),
        ("finished", _clock(job.finished_at)),
        ("ran for", ran),
    ]


def _outcome(job: Job) -> list[Line]:
    code = "" if job.exit_code is None else str(job.exit_code) + (f" ({job.signal})" if job.signal else "")
    previous = "" if job.previous_exit_code is None else str(job.previous_exit_code)
    return [("exit code", code), ("failed because", job.reason or ""), ("previous exit", previous)]


def _checkpoints(state: str, job: Job) -> list[Line]:
    resumed = ""
    if job.resumed_from:
        step = f" (step {job.resumed_from_step})" if job.resumed_from_step is not None else ""
        lost = f", lost {plural(job.lost_steps, 'step')}" if job.lost_steps is not None else ""
        resumed = f"{job.resumed_from}{step}{lost}"
    how = "; ".join(
        p
        for p in (
            "preemptible" if job.preemptible else "",
            "every attempt starts over (--no-resume)" if job.no_resume else "",
            f"checkpoints {job.ckpt_glob}" if job.ckpt_glob else "",
            f"resumes with {job.resume_arg}" if job.resume_arg else "",
        )
        if p
    )
    label = RESUMED_FROM.get(state, "last attempt resumed from")
    # `checkpoint`: the newest when it was preempted; once it went on, it is past (the resumed-from
    # line says where the job continued, `preemptions` what each preemption left)
    preempted = job.checkpoint if state == PREEMPTED else None
    return [("checkpoint", preempted or ""), (label, resumed), ("resume", how)]


def _gpus(state: str, job: Job) -> list[Line]:
    if job.gpu_request == 0:
        return [("GPUs", "none (a CPU job)")]
    if job.gpu_request == 1 and not job.gpu_mem_mib and not job.gpus and not may_have_gpus():
        return []  # the default, on a machine without GPUs: it runs in the one slot there is
    asked = plural(job.gpu_request, "GPU") + (f", {mib_text(job.gpu_mem_mib)} each" if job.gpu_mem_mib else "")
    verb = "holds" if state == RUNNING else "last held"  # an ended attempt gave its GPUs back
    held = f"; {verb} GPU {', '.join(map(str, job.gpus))}" if job.gpus else ""
    return [("GPUs", asked + held)]


def _dependencies(spool: Spool, job: Job) -> list[Line]:
    if not (job.after or job.after_any):
        return []
    index = spool.jobs.index()

    def listed(ids: list[int]) -> str:
        return ", ".join(f"#{i} ({index[i][-1].state if i in index else 'gone'})" for i in ids)

    return [("after", listed(job.after)), ("after any", listed(job.after_any))]


def _attempts(job: Job) -> list[Line]:
    attempts = ""
    if job.attempts > 1 or job.retries:
        attempts = str(job.attempts) + (
            f" of at most {job.retries + 1} (--retries {job.retries})" if job.retries else ""
        )
    runs = len(job.history)
    earlier = f"{plural(runs, 'run')} in all, counting earlier ones" if runs > job.attempts else ""
    preempted = ""
    if job.preemptions:
        preempted = f"{plural(len(job.preemptions), 'time')}; last: {describe_preemption(job.preemptions[-1])}"
    return [("attempts", attempts), ("history", earlier), ("preemptions", preempted)]


def _notify(job: Job) -> str:
    """The desktop, and each URL by its scheme and host (the rest may be a secret)."""
    return ", ".join((["desktop"] if job.notify else []) + [url_text(url) for url in job.notify_urls or ()])


def _host_limits(job: Job) -> str:
    """How its latest attempt's --mem and --cpus were kept."""
    by = job.host_limits_by
    if not by:
        return ""
    kept = {"cgroup2": "kept by cgroup v2", "systemd-run": "kept by systemd-run"}.get(by)
    if kept is None:  # "watch:SECONDS"
        watch = [f"kept by watching memory every {by.partition(':')[2]} s"] if job.mem_mib else []
        kept = "; ".join(watch + (["CPUs counted, not capped"] if job.cpus else []))
    return kept


def _sweep(spool: Spool, job: Job) -> list[Line]:
    if not isinstance(job.sweep, dict):
        return []
    members = sweep_jobs(spool, job.sweep["id"])
    counts = Counter(member["state"] for member in members)
    values = " ".join(f"{k}={v}" for k, v in job.sweep["values"].items())
    counted = ", ".join(f"{n} {state}" for state, n in counts.items())
    return [("sweep", f"{values}; {plural(len(members), 'job')} from #{job.sweep['id']}: {counted}")]


def _provenance(job: Job) -> list[Line]:
    code = ""
    if isinstance(job.code, dict) and job.code.get("repo"):
        commit = str(job.code.get("commit") or "")[:12] or "no commit yet"  # a hash shortened, not the words
        branch = f" on {job.code['branch']}" if job.code.get("branch") else ""
        code = f"{commit}{branch}" + (" with uncommitted changes" if job.code.get("dirty") else "")
        code += f" ({job.code['repo']})"
    snapshot = job.snapshot.get("path", "") if isinstance(job.snapshot, dict) else ""
    source = "" if job.source in ("", SOURCE_CLI) else job.source
    return [
        ("code", code),
        ("code changed", job.code_changed or ""),
        ("runs a copy", snapshot),
        ("came from", source + (" (adopted)" if job.adopted and source != SOURCE_ADOPT else "")),
    ]
