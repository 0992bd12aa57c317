"""Preempt, resume and urgent jobs, as a library (the CLI and the worker call it).

Preempting leaves a control request ("preempt", or "preempt-resume" when the worker makes room for
an urgent job), then SIGTERMs the job's whole process group. The job's supervisor sees the request
when the job's main process exits, keeps the job in running/ (its slot taken) until nothing of the
group is left, records the newest complete checkpoint and the steps lost since it
(`preemption_record`), and moves the job to preempted/, whatever its exit code (0 after a graceful
save, 143 after a plain SIGTERM death).

The job keeps its id: `resume` puts the same file back in pending/ with the checkpoint argument
replaced, so dependents (`--after ID`) keep waiting and start after the continuation finishes, and
resuming twice cannot create a second job. spool_layout.md ("Preemption and resume") has the fields.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from gpuq import checkpoints, jobs, procs, queue
from gpuq.spool import Spool

PREEMPT = "preempt"  # by a person: stays in preempted/ until `gpuq resume`
PREEMPT_RESUME = "preempt-resume"  # by the worker for an urgent job: resumed automatically
PREEMPT_ACTIONS = (PREEMPT, PREEMPT_RESUME)
DEFAULT_TIMEOUT = 60.0  # HF's JIT save waits 3 s after SIGTERM, then saves: allow for big models
FORCE_WAIT = 10.0
DEFAULT_RESUME_ARG = "--resume_from_checkpoint {ckpt}"
HF_JIT_FLAG = "--enable_jit_checkpoint"
PREEMPTIBLE_ENV = "GPUQ_PREEMPTIBLE"  # read by CALLBACK: save on SIGTERM
CALLBACK = "gpuq.integrations.hf_preempt.GpuqPreemptCallback"
STEP_RES = (
    re.compile(rb"\bstep\s+(\d+)\s*/\s*(\d+)", re.IGNORECASE),  # "Step 12/100"
    re.compile(rb"(\d+)/(\d+) \["),  # tqdm: "12/100 [00:03<00:20, 4.1it/s]"
)
ATTEMPT_HEADER = b"=== gpuq: job #"  # the supervisor writes it at each start


def hold_until_gone(spool: Spool, job_id: int, pgid: int) -> None:
    """Supervisor side: the main process of a job being preempted has exited; keep the job in
    running/ while any process of its group lives (a DataLoader worker or a child that ignores
    SIGTERM still holds GPU memory). Stops if the preemption is withdrawn (timeout, no --force)."""
    while spool.peek_request(job_id) in PREEMPT_ACTIONS and procs.group_members(pgid):
        time.sleep(0.1)


# ---- how far did it get? ----------------------------------------------------------------------
def last_step_in(data: bytes) -> Optional[int]:
    """The step of the last `Step N/M` or tqdm `N/M [` in `data`."""
    best: tuple[int, int] = (-1, -1)
    for regex in STEP_RES:
        for m in regex.finditer(data):
            step, total = int(m.group(1)), int(m.group(2))
            if step <= total and m.start() > best[0]:
                best = (m.start(), step)
    return best[1] if best[0] >= 0 else None


def last_progress_step(spool: Spool, job: dict[str, Any]) -> Optional[int]:
    """The furthest step this attempt reported: its progress file (if written since it started)
    or its log since the attempt's header."""
    steps = []
    started = jobs.parse_iso(job.get("started_at")) or 0.0
    progress = spool.read_progress(job["id"])
    reported = progress[0].get("step") if progress else None
    if isinstance(reported, (int, float)) and not isinstance(reported, bool) and progress[1] >= started:
        steps.append(int(reported))
    tail = spool.log_tail_bytes(job["id"])
    cut = tail.rfind(ATTEMPT_HEADER)
    logged = last_step_in(tail[cut:] if cut >= 0 else tail)
    if logged is not None:
        steps.append(logged)
    return max(steps) if steps else None


def preemption_record(spool: Spool, job: dict[str, Any], exit_code: Optional[int], action: str) -> dict[str, Any]:
    """Changes for a job entering preempted/: its newest complete checkpoint and lost steps."""
    ckpt = checkpoints.latest_checkpoint(job)
    last = last_progress_step(spool, job)
    base = ckpt.step if ckpt is not None else (None if job.get("resumed_from") else 0)
    # max(0, ...): a save can be newer than the last progress line seen (tqdm refreshes lazily)
    lost = max(0, last - base) if last is not None and base is not None else None
    record = {
        "at": jobs.now_iso(),
        "by": "urgent job" if action == PREEMPT_RESUME else "user",
        "exit_code": exit_code,
        "checkpoint": ckpt.path if ckpt else None,
        "checkpoint_step": ckpt.step if ckpt else None,
        "last_step": last,
        "lost_steps": lost,
    }
    return {
        "preemptions": list(job.get("preemptions") or []) + [record],
        "checkpoint": record["checkpoint"],
        "auto_resume": action == PREEMPT_RESUME,
        "note": describe(record),
    }


def describe(record: dict[str, Any]) -> str:
    where = f"checkpoint {record['checkpoint']}" if record.get("checkpoint") else "no complete checkpoint found"
    text = f"preempted by {record.get('by', 'user')}; {where}"
    if record.get("lost_steps") is not None:
        text += f"; lost {record['lost_steps']} steps: last progress {record['last_step']}"
        text += f", checkpoint {record['checkpoint_step'] or 0}"
    return text


# ---- preempt (gpuq preempt) -------------------------------------------------------------------
@dataclass
class Outcome:
    job: dict[str, Any]
    state: str  # where the job is now
    left: list[int]  # pids still alive (timeout without --force)


def preempt(
    spool: Spool, job_id: int, timeout: float = DEFAULT_TIMEOUT, force: bool = False, say: Callable = lambda _t: None
) -> Outcome:
    ref, job = queue.get(spool, job_id, ("running",))
    deadline = time.monotonic() + 5
    while job.get("pid") is None and time.monotonic() < deadline:  # its supervisor is starting it
        time.sleep(0.05)
        ref, job = queue.get(spool, job_id, ("running",))
    pgid = job.get("pid")
    if not pgid:
        raise queue.QueueError(f"job #{job_id} has no process yet; try again")
    snapshot = procs.tree_processes(pgid)
    spool.request(job_id, PREEMPT)
    procs.terminate(pgid, snapshot)
    say(f"sent SIGTERM to job #{job_id}'s process group (pid {pgid}); waiting up to {timeout:g}s for it to exit...")
    left = procs.wait_gone(pgid, snapshot, timeout)
    if left and force:
        say(f"still alive after {timeout:g}s: {_pids(left)}; sending SIGKILL")
        left = procs.kill_leftovers(pgid, snapshot, FORCE_WAIT)
        if left:
            raise queue.QueueError(f"job #{job_id}: processes {_pids(left)} survived SIGKILL")
    if left:
        if procs.job_alive(job):
            spool.take_request(job_id)  # withdrawn: the job goes on as if nothing happened
            return Outcome(job, "running", [p.pid for p in left])
        # Its main process ended but others ignore SIGTERM: the supervisor keeps it in running/.
        return Outcome(job, "running", [p.pid for p in left])
    job = queue.wait_until_settled(spool, job_id)
    found = spool.find(job_id)
    return Outcome(job, found.state if found else "unknown", [])


def _pids(processes: list[Any]) -> str:
    return ", ".join(str(p.pid) for p in processes)


# ---- resume -----------------------------------------------------------------------------------
def check_resume_arg(template: str) -> Optional[str]:
    """The problem with a --resume-arg template, or None if it is usable."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        return f"--resume-arg cannot be split like a shell line: {exc}"
    if not words or "{ckpt}" not in template:
        return "--resume-arg must contain {ckpt}, e.g. '--resume_from_checkpoint {ckpt}' or 'ckpt_path={ckpt}'"
    if len(words) > 2 or "{ckpt}" in words[0] and len(words) == 2:
        return "--resume-arg must be one word (NAME={ckpt}) or a flag and its value (--flag {ckpt})"
    return None


def resume_argv(cmd: list[str], template: str, ckpt: Optional[str]) -> list[str]:
    """`cmd` without any earlier form of the resume argument (`--flag X`, `--flag=X`), plus the
    template filled with `ckpt` (nothing added when `ckpt` is None)."""
    words = shlex.split(template)
    key = words[0].split("=", 1)[0] if len(words) == 1 else words[0]
    out, i = [cmd[0]], 1
    while i < len(cmd):
        if cmd[i] == key:
            i += 2  # `--flag X`
            continue
        if not cmd[i].startswith(key + "="):
            out.append(cmd[i])
        i += 1
    return out + ([w.replace("{ckpt}", ckpt) for w in words] if ckpt is not None else [])


def where_looked(job: dict[str, Any]) -> str:
    if job.get("ckpt_glob"):
        return f"looked for {job['ckpt_glob']!r} in {job['cwd']}"
    out = checkpoints.output_dir(job["cmd"], job["cwd"])
    if out is None:
        return "its command has no --output_dir and it has no --ckpt-glob"
    return f"looked for checkpoint-N with trainer_state.json in {out}"


@dataclass
class Resumed:
    job: dict[str, Any]
    checkpoint: Optional[checkpoints.Checkpoint]


def resume(spool: Spool, job_id: int, require_checkpoint: bool = False, front: bool = True) -> Resumed:
    """Put a preempted (or interrupted) job back in pending/ with its newest checkpoint, keeping
    its id; first in line unless `front` is False."""
    found = spool.find(job_id)
    if found is not None and found.state in ("pending", "running"):
        raise queue.QueueError(f"job #{job_id} is already {found.state}; nothing to resume")
    with queue.claimed(spool, job_id, ("preempted", "interrupted")) as (ref, job):
        ckpt = checkpoints.latest_checkpoint(job)
        if ckpt is None and require_checkpoint:
            raise queue.QueueError(f"job #{job_id}: no complete checkpoint ({where_looked(job)}); left {ref.state}")
        template = job.get("resume_arg") or DEFAULT_RESUME_ARG
        changes: dict[str, Any] = {"queue_front": front, "auto_resume": False}
        if ckpt is not None:
            changes.update(cmd=resume_argv(job["cmd"], template, ckpt.path), resumed_from=ckpt.path)
            changes["resumed_from_step"] = ckpt.step
            note = f"resumes from {ckpt.path}"
        else:
            if job.get("resumed_from"):  # the checkpoint gpuq passed earlier is gone: really start over
                changes["cmd"] = resume_argv(job["cmd"], template, None)
            changes.update(resumed_from=None, resumed_from_step=None)
            note = f"no checkpoint found ({where_looked(job)}): starts from scratch"
        new = queue._requeue(spool, ref, dict(job, **changes), note)
        return Resumed(new, ckpt)


def resume_auto(spool: Spool) -> list[Resumed]:
    """Resume every job the worker preempted for an urgent job (they go first in line)."""
    out = []
    for _ref, job in spool.load_many("preempted"):
        if job.get("auto_resume"):
            try:
                out.append(resume(spool, job["id"]))
            except queue.QueueError:
                continue  # busy or changed meanwhile: the next step tries again
    return out


# ---- urgent jobs (the worker's side) ----------------------------------------------------------
@dataclass
class Preemption:
    job_id: int
    slot: Optional[str]
    pgid: int
    snapshot: list[Any]
    deadline: float


def begin(spool: Spool, victim: dict[str, Any], now: float, grace: float = DEFAULT_TIMEOUT) -> Preemption:
    """Start preempting `victim` for an urgent job without waiting: `enforce` finishes it."""
    pgid = victim["pid"]
    snapshot = procs.tree_processes(pgid)
    spool.request(victim["id"], PREEMPT_RESUME)
    procs.terminate(pgid, snapshot)
    return Preemption(victim["id"], victim.get("slot"), pgid, snapshot, now + grace)


def enforce(p: Preemption, state: Optional[str], now: float) -> bool:
    """One look at a preemption under way; SIGKILL what is left once its grace is over.
    Returns True while its slot must stay unused (something of the job still lives)."""
    left = procs.leftovers(p.pgid, p.snapshot)
    if state != "running" and not left:
        return False
    if left and now >= p.deadline:
        procs.signal_each(left, "kill")  # again at each look: a process may have been forked meanwhile
    return True


# ---- --preemptible at add time ----------------------------------------------------------------
def make_preemptible(cmd: list[str], venv: Optional[str]) -> tuple[list[str], str]:
    """The command with HF's JIT checkpoint flag when it looks like an HF Trainer run (has
    --output_dir) and the job's Python has transformers >= 5; plus a line for the user."""
    if checkpoints.output_dir(cmd, "/") is None:
        return cmd, "no --output_dir: not an HF Trainer command line; the job must save on SIGTERM itself"
    if any(w == HF_JIT_FLAG or w.startswith(HF_JIT_FLAG + "=") for w in cmd):
        return cmd, f"{HF_JIT_FLAG} already given"
    version = transformers_version(_job_python(cmd, venv))
    if version is None:
        return cmd, f"transformers not found for the job's Python; the script must save on SIGTERM ({CALLBACK})"
    if int(version.split(".")[0]) < 5:
        return cmd, f"transformers {version} has no JIT checkpoint: add {CALLBACK} to the Trainer"
    return cmd + [HF_JIT_FLAG, "true"], f"transformers {version}: added {HF_JIT_FLAG} true"


def _job_python(cmd: list[str], venv: Optional[str]) -> Optional[str]:
    if os.path.basename(cmd[0]).startswith("python"):
        return cmd[0]
    if venv and os.path.exists(os.path.join(venv, "bin", "python")):
        return os.path.join(venv, "bin", "python")
    return shutil.which("python3") or shutil.which("python")


def transformers_version(python: Optional[str]) -> Optional[str]:
    """The version of transformers installed for `python` (metadata only: no import of it)."""
    if not python:
        return None
    probe = "import importlib.metadata as m\ntry: print(m.version('transformers'))\nexcept Exception: pass"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    return text if re.match(r"^\d+\.", text) else None
