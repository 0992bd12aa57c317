"""The gpuq command lines that would fix a job, chosen by why it waits or failed (`gpuq triage`):
each `{"command": ..., "why": ...}`, a whole shell-quoted line gpuq's parser reads. `gpuq edit`
changes only a waiting job: a failed one is queued again with `gpuq add` (add_line), changed.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from contextlib import suppress
from typing import Any, Optional

from gpuq.core.job import Job
from gpuq.core.states import CANCELLED, FAILED, HELD, INTERRUPTED, PENDING, PREEMPTED
from gpuq.core.timespec import format_duration
from gpuq.core.words import OVER_CAP
from gpuq.engine.schedule.queue_read import waits_for_itself
from gpuq.engine.schedule.scheduler import BLOCKED, loop_reason
from gpuq.engine.views.card import worker_time_limit
from gpuq.spool import Spool

Fix = dict[str, str]

# Options that set a batch size, as training scripts spell them (`--NAME N`, `--NAME=N`, `NAME=N`)
BATCH_NAMES = (
    "batch_size",
    "per_device_train_batch_size",
    "train_batch_size",
    "micro_batch_size",
    "train_micro_batch_size_per_gpu",
    "bs",
)

# Why a job failed, as engine/views/triage.py tells it from core/failure.py's reason (its `cause`)
TIME_LIMIT = "time_limit"
GPU_OOM = "gpu_out_of_memory"
HOST_OOM = "host_out_of_memory"
OOM_KILLER = "killed_sigkill"  # SIGKILL gpuq did not send: likely the kernel's OOM killer
DISK_FULL = "disk_full"
KILLED_BY_USER = "killed_by_user"
OTHER = "other"

# What a job asks that this worker can never give, as placement.py and hostroom.py say it: the
# --set key that asks for what it has instead, and the most it has (a count, or a size and its unit;
# for N GPUs, the memory of the smallest of the N largest; for --min-free, the space free now).
_TOO_BIG = (
    ("gpus", re.compile(r"needs \d+ GPUs; this worker has ([1-9]\d*)()")),
    ("gpu_mem", re.compile(r"needs .+ GPUs?; the .*largest here is GPU \d+ with ([\d.]+) ([GM])iB$")),
    ("cpus", re.compile(r"needs \d+ CPUs; this worker hands out at most (\d+)()$")),
    ("mem", re.compile(r"needs \S+ host memory; this worker hands out at most ([\d.]+)([GM])$")),
    ("min_free", re.compile(r"needs \S+ free disk space \(--min-free\); .* filesystem of \S+, ([\d.]+)([GM]) free$")),
)


def suggest(spool: Spool, job: Job, state: str, facts: dict[str, Any]) -> list[Fix]:
    """The fixes for `job` in `state`, most likely first; `facts`: what the triage found."""
    if state == HELD:
        return [_fix(["release", job.id], "it is held: this puts it back in line")]
    if state == PENDING:
        return _waiting(spool, job, facts)
    if state in (PREEMPTED, INTERRUPTED):
        return [_fix(["resume", job.id], f"it is {state}: this queues it again, from its newest checkpoint")]
    if state in (FAILED, CANCELLED):
        return _failed(job, state, facts)
    return []


def _fix(words: list[Any], why: str) -> Fix:
    return {"command": shlex.join(["gpuq", *map(str, words)]), "why": why}


def _waiting(spool: Spool, job: Job, facts: dict[str, Any]) -> list[Fix]:
    out = _dependencies(spool, job)
    if facts.get("cause") in (GPU_OOM, HOST_OOM):  # waits to run again after a failed attempt
        out += _smaller(job, facts, edit=True)
    waiting = str(facts.get("waiting_for") or "")
    blocked = waiting.startswith(BLOCKED)  # a worker would not start it
    # `asks for 2 GPUs, over your limit of 1 GPU at once ...`: the machine's policy holds it for good
    cap = int(waiting.split(OVER_CAP, 1)[1].split(" ", 1)[0]) if OVER_CAP in waiting else 0
    if cap > 0:
        why = f"it asks for more GPUs than the machine's policy lets you hold at once: this asks for {cap}"
        out.append(_fix(["edit", job.id, "--set", f"gpus={cap}"], f"{why} (or ask its admin to raise your limit)"))
    if blocked:
        out += _to_fit(job, waiting[len(BLOCKED) :])
    if not out and not blocked and not spool.workers.live():
        out.append(_fix(["run", "--daemon"], "no worker is running: this starts one, which starts the job"))
    return out


def _to_fit(job: Job, reason: str) -> list[Fix]:
    """A job that asks more than this worker has: the edit that asks for what it has."""
    for key, pattern in _TOO_BIG:
        found = pattern.match(reason)
        if not found:
            continue
        most, unit = found.groups()
        if unit == "G" and "." in most:  # rounded to one decimal: the whole GiB below what it shows
            most = str(math.floor(float(most) - 0.05))
        if float(most) >= 1:
            return [_fix(["edit", job.id, "--set", f"{key}={most}{unit}"], f"it {reason}: this asks for what fits")]
    return []


def _dependencies(spool: Spool, job: Job) -> list[Fix]:
    """What frees a job whose dependencies will not end well by themselves."""
    index = spool.jobs.index()
    out, gone = [], []
    for dep in [*job.after, *job.after_any]:
        if dep not in index:
            gone.append(dep)
            continue
        ref = index[dep][-1]
        if ref.state in (FAILED, CANCELLED) and dep in job.after:
            why = f"#{job.id} waits for #{dep} ({ref.state}{_reason_of(spool, ref)}): it starts once #{dep} succeeds"
            out.append(_fix(["retry", dep], why))
        elif ref.state == HELD:
            out.append(_fix(["release", dep], f"#{job.id} waits for #{dep}, which is held"))
        elif ref.state in (PREEMPTED, INTERRUPTED):
            out.append(_fix(["resume", dep], f"#{job.id} waits for #{dep}, which is {ref.state}"))
    if gone:
        named = ", ".join(f"#{d}" for d in gone)
        out.append(_fix(_edit_without(job, gone), f"it waits for {named}, which no longer exist"))
    loop = waits_for_itself(spool, job.id, [d for d in [*job.after, *job.after_any] if d not in gone])
    if loop:
        why = f"it {loop_reason([job.id, *loop])}: this stops it waiting for #{loop[0]}"
        out.append(_fix(_edit_without(job, [loop[0]]), why))
    return out


def _edit_without(job: Job, deps: list[int]) -> list[Any]:
    """The words of `gpuq edit` that take `deps` out of what `job` waits for."""
    kept = {key: [d for d in getattr(job, key) if d not in deps] for key in ("after", "after_any")}
    pairs = [f"{key}={json.dumps(ids)}" for key, ids in kept.items() if ids != getattr(job, key)]
    return ["edit", job.id, *[w for pair in pairs for w in ("--set", pair)]]


def _reason_of(spool: Spool, ref: Any) -> str:
    try:
        reason = spool.jobs.load(ref).reason
    except (OSError, ValueError):
        return ""
    return f": {reason}" if reason else ""


def _failed(job: Job, state: str, facts: dict[str, Any]) -> list[Fix]:
    cause, ckpt = facts.get("cause"), facts.get("checkpoint") or {}
    resumable = bool(ckpt.get("latest")) and ckpt.get("resumes")
    retry_why = f"back in the queue, continuing from {ckpt['latest']}" if resumable else "back in the queue"
    if state == CANCELLED:
        return [_fix(["retry", job.id], f"it was cancelled: {retry_why}")]
    if cause == TIME_LIMIT:
        out = [_fix(["retry", job.id], f"{retry_why}, with the same time limit")] if resumable else []
        limit = job.time_limit or worker_time_limit(job)  # the worker's --default-time, else retry meets it again
        if limit:
            twice = f"{format_duration(limit)} -> {format_duration(limit * 2)}"
            why = f"queue it again with twice the time ({twice}), from the start"
            out.append({"command": add_line(job, time_limit=limit * 2), "why": why})
        return out or [_fix(["retry", job.id], retry_why)]
    if cause in (GPU_OOM, HOST_OOM):
        return _smaller(job, facts, edit=False) + [
            _fix(["retry", job.id], f"{retry_why} as it was: if other processes held the memory it needed then")
        ]
    if cause == DISK_FULL:
        return [
            _fix(["clear", "--logs"], "drops finished jobs' logs: room on the spool's disk, if the job wrote there"),
            _fix(["retry", job.id], f"{retry_why}, once there is room"),
        ]
    return [_fix(["retry", job.id], f"{retry_why}, once the cause in its log is fixed")]


def _smaller(job: Job, facts: dict[str, Any], edit: bool) -> list[Fix]:
    """Out of memory: a smaller batch, and a bigger share of a GPU; by `gpuq edit` for a waiting
    job (`edit`), else by queueing it again. Each change: (add_line's change, edit's --set, why)."""
    changes: list[tuple[dict[str, Any], str, str]] = []
    halved = halve_batch(job.cmd)
    if halved is not None:
        cmd, before, after = halved
        why = f"half the batch ({before} -> {after}), so that it needs less memory"
        changes.append(({"cmd": cmd}, "cmd=" + json.dumps(cmd), why))
    if job.gpu_mem_mib and facts.get("cause") == GPU_OOM:
        more = _more_memory(job.gpu_mem_mib, facts.get("tried_to_allocate"))
        why = f"a bigger share of a GPU ({job.gpu_mem_mib} -> {more} MiB)"
        changes.append(({"gpu_mem_mib": more}, f"gpu_mem={more}M", why))
    if job.mem_mib and facts.get("cause") == HOST_OOM:
        why = f"twice the host memory ({job.mem_mib} -> {job.mem_mib * 2} MiB)"
        changes.append(({"mem_mib": job.mem_mib * 2}, f"mem={job.mem_mib * 2}M", why))
    if edit:
        return [_fix(["edit", job.id, "--set", setting], why) for _change, setting, why in changes]
    return [{"command": add_line(job, **change), "why": f"queue it again with {why}"} for change, _s, why in changes]


def _more_memory(mib: int, tried: Optional[str]) -> int:
    """What it had plus what it tried to allocate (PyTorch's `2.00 GiB`; else half again), in GiB."""
    number, _, unit = (tried or "").partition(" ")
    scale = {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024, "TiB": 1 << 20}.get(unit)
    extra = 0
    with suppress(ValueError):
        extra = math.ceil(float(number) * scale) if scale else 0
    return math.ceil((mib + (extra or mib // 2)) / 1024) * 1024


def halve_batch(cmd: list[str]) -> Optional[tuple[list[str], int, int]]:
    """`cmd` with its batch size halved, the size before and after; None without one above 1."""
    for i, word in enumerate(cmd):
        key, eq, value = word.partition("=")
        name = key.lstrip("-").replace("-", "_").rsplit(".", 1)[-1]  # `data.batch_size=32` (Hydra)
        if name not in BATCH_NAMES:
            continue
        if not eq and key.startswith("-") and i + 1 < len(cmd) and cmd[i + 1].isdigit():
            size = int(cmd[i + 1])
            if size > 1:
                return [*cmd[: i + 1], str(size // 2), *cmd[i + 2 :]], size, size // 2
        elif eq and value.isdigit() and int(value) > 1:
            size = int(value)
            return [*cmd[:i], f"{key}={size // 2}", *cmd[i + 1 :]], size, size // 2
    return None


def add_line(
    job: Job,
    cmd: Optional[list[str]] = None,
    time_limit: Optional[float] = None,
    gpu_mem_mib: Optional[int] = None,
    mem_mib: Optional[int] = None,
) -> str:
    """`gpuq add ...` that queues the job again as it was, with the changes given."""
    mem, limit, host_mem = gpu_mem_mib or job.gpu_mem_mib, time_limit or job.time_limit, mem_mib or job.mem_mib
    options = (  # each given when it has a value
        ("--gpus", str(job.gpu_request) if job.gpu_request != 1 else None),
        ("--gpu-mem", f"{mem}M" if mem else None),  # a typed size needs its unit
        ("--mem", f"{host_mem}M" if host_mem else None),
        ("--time", format_duration(limit) if limit else None),
        ("--priority", str(job.priority) if job.priority else None),
        ("--ckpt-glob", job.ckpt_glob),
        ("--resume-arg", job.resume_arg),
    )
    words = ["gpuq", "add", "--name", job.name, "-d", job.cwd]
    words += [word for option, value in options if value for word in (option, value)]
    words += ["--no-resume"] if job.no_resume else []
    words += [word for key, value in job.env.items() for word in ("-e", f"{key}={value}")]
    return shlex.join([*words, "--", *(job.cmd if cmd is None else cmd)])
