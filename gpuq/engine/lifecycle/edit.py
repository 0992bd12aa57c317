"""`gpuq edit`: change a waiting job's fields that a dropped file may say, with the checks a dropped
file gets; written under its claim only if the job has not changed meanwhile.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from gpuq.core import schema, timespec
from gpuq.core.errors import Refused, UsageError
from gpuq.core.job import Job
from gpuq.core.states import WAITING
from gpuq.engine.lifecycle import actions, enqueue, interpreter
from gpuq.engine.schedule import diskguard, gpuview
from gpuq.engine.schedule.queue_read import waits_for_itself
from gpuq.spool import Spool

# The job fields behind each editable key (the keys of a dropped file).
FIELD_OF = {"gpus": "gpu_request", "gpu_mem": "gpu_mem_mib", "mem": "mem_mib", "min_free": "min_free_bytes"}
# Keys left out of what a person edits while null (no request): a key they delete clears the field.
UNSET_WHEN_NULL = ("gpu_mem", "mem", "cpus", "keep_checkpoints", "min_free", "ckpt_glob", "conda")
# Sizes typed with --set need a unit, as `add --gpu-mem`/`--mem` do: `--set gpu_mem=20` would be
# 20 MiB (a job file's bare number), nothing a job needs. A file edited in the editor keeps its MiB.
TYPED_SIZES = ("gpu_mem", "mem")
EDITABLE = sorted(schema.DROPPED_FIELDS)


def read(spool: Spool, job_id: int) -> tuple[dict[str, Any], int]:
    _ref, job = actions.get(spool, job_id, WAITING)
    out = {key: getattr(job, FIELD_OF.get(key, key)) for key in EDITABLE}  # a field the file lacks: its default
    if out["min_free"] is not None:  # bytes, shown with the unit that reads back exact (a bare number is MiB)
        out["min_free"] = _bytes_text(out["min_free"])
    return {k: v for k, v in out.items() if not (k in UNSET_WHEN_NULL and v is None)}, job.rev


def _bytes_text(count: int) -> str:
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if count % (1 << shift) == 0:
            return f"{count >> shift}{unit}"
    return f"{count}B"


def with_pairs(fields: dict[str, Any], pairs: list[str]) -> dict[str, Any]:
    """VALUE is JSON when it parses, else a string (`name=exp 2`); a size needs its unit."""
    out = dict(fields)
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--set wants KEY=VALUE, not {pair!r}")
        if key not in EDITABLE:
            raise UsageError(f"--set {key}: not editable; these are: {', '.join(EDITABLE)}")
        shown = text.strip()
        if key == "min_free" and shown != "null":
            if not shown[-1:].isalpha() and not shown.startswith("-") and shown.strip("0.") != "":
                raise UsageError(f"--set min_free: {shown!r} has no unit: did you mean min_free={shown}G?")
            try:
                timespec.parse_typed_bytes(shown, "--set min_free")  # as add's --min-free: above 0
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            out[key] = shown  # read again by the dropped file's rules
            continue
        if key in TYPED_SIZES and text.strip() != "null":
            try:
                timespec.parse_memory_mib(text, f"--set {key}")
            except ValueError as exc:
                raise UsageError(str(exc).replace("did you mean ", f"did you mean {key}=", 1)) from None
            out[key] = text.strip()  # read again by the dropped file's rules, with its unit
            continue
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out


def apply_edited(
    spool: Spool, job_id: int, fields: dict[str, Any], edited: dict[str, Any], rev: int
) -> tuple[Optional[Job], list[str]]:
    """The job as written and the keys whose value changed; (None, []) when none did."""
    return apply(spool, job_id, edited, rev) if edited != fields else (None, [])


def apply(spool: Spool, job_id: int, fields: dict[str, Any], rev: int) -> tuple[Optional[Job], list[str]]:
    try:
        clean = schema.normalize_dropped(fields)
    except schema.InvalidJob as exc:
        raise UsageError(f"job #{job_id} not changed: {exc}") from None
    missing = enqueue.missing_jobs(spool, clean["after"] + clean["after_any"])
    if missing:
        raise Refused(f"job #{job_id} not changed: after: no such job {missing}")
    if job_id in clean["after"] + clean["after_any"]:
        raise UsageError(f"job #{job_id} not changed: a job cannot wait for itself")
    loop = waits_for_itself(spool, job_id, clean["after"] + clean["after_any"])
    if loop:
        chain = " after ".join(f"#{i}" for i in [job_id, *loop])
        raise UsageError(f"job #{job_id} not changed: it would wait for itself ({chain}), and none of them would start")
    if clean.get("cwd") is not None and not os.path.isdir(clean["cwd"]):
        raise UsageError(f"job #{job_id} not changed: cwd does not exist: {clean['cwd']}")
    with actions.claimed(spool, job_id, WAITING) as (ref, job):
        if job.rev != rev:
            raise Refused(f"job #{job_id} changed while it was being edited; not changed: edit it again")
        changes = {FIELD_OF.get(key, key): value for key, value in clean.items()}
        for key in UNSET_WHEN_NULL:
            changes.setdefault(FIELD_OF.get(key, key), None)
        gpus = (changes["gpu_request"], changes["gpu_mem_mib"])
        if gpus != (job.gpu_request, job.gpu_mem_mib):  # as `add` refuses it, else it waits for ever
            problem = gpuview.never_fits(spool, *gpus)
            if problem:
                raise UsageError(f"job #{job_id} not changed: {problem}")
        problem = changes["min_free_bytes"] != job.min_free_bytes and diskguard.never_fits(
            changes["min_free_bytes"], changes["cmd"], changes.get("cwd") or job.cwd, changes["ckpt_glob"]
        )
        if problem:
            raise UsageError(f"job #{job_id} not changed: {problem}: this job could never start")
        enqueue.notify_urls([url for url in changes["notify_urls"] if url not in job.notify_urls], "gpuq edit")
        cwd = changes.get("cwd") or job.cwd
        if (changes["cmd"], cwd, changes["conda"]) != (job.cmd, job.cwd, job.conda):
            try:
                resolved = runs_with(job, changes["cmd"], cwd, changes["conda"])
            except (interpreter.EnqueueError, OSError) as exc:
                why = str(exc) if isinstance(exc, interpreter.EnqueueError) else f"{exc.strerror}: {cwd}"
                raise UsageError(f"job #{job_id} not changed: {why}") from None
            changes.update(cmd=resolved.cmd, venv=resolved.venv, conda=resolved.conda)
            changes.update(interpreter_from=resolved.found_by)
        # Compared as the job holds them: a size in other units, or a command that resolves to the
        # one it runs, is no change, whether typed with --set or in the editor.
        fields_of = {key: FIELD_OF.get(key, key) for key in EDITABLE}
        changed = [k for k, f in fields_of.items() if f in changes and changes[f] != getattr(job, f)]
        return (spool.jobs.move(ref, job, ref.state, changes)[1], changed) if changed else (None, [])


def runs_with(job: Job, cmd: list[str], cwd: str, conda: Optional[str]) -> interpreter.Resolved:
    """The edited command as `gpuq add` would run it for the job's user, the interpreter chosen
    again unless given with `--python` or `--conda`."""
    chosen = interpreter.interpreter_in_front(job.cmd, job.interpreter_from, job.venv or job.conda)
    if chosen is not None and cmd[0] == chosen and cmd[1:2] and cmd[1].endswith(".py"):
        cmd = cmd[1:]  # gpuq's own choice, not the user's: made again for what runs where
    python = chosen if job.interpreter_from == interpreter.FROM_PYTHON else None
    if conda == job.conda and job.interpreter_from == interpreter.FROM_ACTIVE_CONDA:
        conda = None  # the shell's active environment, no choice: found again, after a nearer .venv
    env = job.shell_env if job.shell_env is not None else {"PATH": os.environ.get("PATH", "")}
    return interpreter.resolve_dropped(cmd, cwd, conda, env, python)
