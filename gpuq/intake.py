"""Taking in job files that people (or programs) drop into pending/ by hand.

A dropped file is read only when it is complete: a file that does not parse yet is left alone
while a process still has it open for writing or it changed in the last GPUQ_INTAKE_QUIET seconds,
so `cat > pending/x.json` typed slowly is never rejected half-way. Once complete, it is either
turned into a proper job (new id, canonical name) or moved to rejected/ with the reason.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

from gpuq import enqueue, jobs
from gpuq.spool import JOB_NAME_RE, PLAIN_NAME_RE, Spool


def quiet_seconds() -> float:
    try:
        return float(os.environ.get("GPUQ_INTAKE_QUIET", "5"))
    except ValueError:
        return 5.0


def open_for_writing(path: Path) -> bool:
    """True if some process of ours holds `path` open for writing (Linux /proc; False elsewhere)."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return False
    target = str(path)
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            fds = os.listdir(pid_dir / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(pid_dir / "fd" / fd) != target:
                    continue
                flags = (pid_dir / "fdinfo" / fd).read_text().split("flags:")[1].split()[0]
            except (OSError, IndexError):
                continue
            if int(flags, 8) & (os.O_WRONLY | os.O_RDWR):
                return True
    return False


def still_being_written(path: Path, now: float) -> bool:
    try:
        mtime = os.stat(path, follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return False
    return now - mtime < quiet_seconds() or open_for_writing(path)


def take_in_all(spool: Spool, now: Optional[float] = None) -> list[tuple[str, str]]:
    """Process every dropped file; returns (file name, outcome) pairs for the log."""
    now = time.time() if now is None else now
    outcomes = []
    for job_id, hidden in spool.intake_leftovers():
        outcomes.append((hidden, _resume_intake(spool, job_id, hidden)))
    for name in spool.dropped_files():
        outcome = take_in(spool, name, now)
        if outcome != "waiting":
            outcomes.append((name, outcome))
    return outcomes


def take_in(spool: Spool, name: str, now: float) -> str:
    """'job #N', 'rejected: reason', 'waiting' (incomplete) or 'gone'."""
    path = spool.state_dir("pending") / name
    if not PLAIN_NAME_RE.match(name):
        if name.endswith(".json"):
            return _reject(spool, name, "file name must be letters, digits, '.', '_' or '-' and end in .json")
        return "waiting"  # not a job file at all (editor backups, notes): left alone
    try:
        fields = _read_dropped(spool, name)
    except FileNotFoundError:
        return "gone"
    except jobs.InvalidJob as exc:
        if _is_incomplete(exc) and still_being_written(path, now):
            return "waiting"
        return _reject(spool, name, str(exc))
    job_id = spool.allocate_id()
    try:
        hidden = spool.begin_intake(name, job_id)
    except FileNotFoundError:
        return "gone"
    return _publish(spool, job_id, hidden, name, fields)


def _is_incomplete(exc: jobs.InvalidJob) -> bool:
    return str(exc).startswith(("not valid JSON", "not valid UTF-8"))


def _read_dropped(spool: Spool, name: str, hidden: Optional[str] = None) -> dict[str, Any]:
    obj = jobs.parse_bytes(spool.read_bytes("pending", hidden or name))
    if "schema_version" in obj:
        raise jobs.InvalidJob("looks like a gpuq job file but is not named NNNNNN-name.json after its id")
    fields = jobs.normalize_dropped(obj)
    try:
        enqueue.check_dependencies(spool, fields["after"] + fields["after_any"])
    except enqueue.EnqueueError as exc:
        raise jobs.InvalidJob(str(exc).replace("--after: ", "after: ")) from None
    return fields


def _publish(spool: Spool, job_id: int, hidden: str, original: str, fields: dict[str, Any]) -> str:
    """Publish the job under the claim of its id, so two workers finishing the same interrupted
    intake cannot both publish it."""
    claim = spool.claim(job_id)
    if claim is None:
        return "waiting"
    try:
        if spool.find(job_id) is None:
            _publish_claimed(spool, job_id, original, fields)
        spool.finish_intake(hidden)
    except FileNotFoundError:
        pass
    except _Rejected as exc:
        return _reject(spool, original, str(exc), hidden=hidden)
    finally:
        claim.release()
    return f"job #{job_id}"


class _Rejected(Exception):
    pass


def _publish_claimed(spool: Spool, job_id: int, original: str, fields: dict[str, Any]) -> None:
    cwd = Path(fields.get("cwd") or Path.home())
    if not cwd.is_dir():
        raise _Rejected(f"cwd does not exist: {cwd}")
    venv = enqueue.find_venv(cwd)
    job = jobs.new_job(
        job_id=job_id,
        name=fields.get("name") or enqueue.default_name(cwd, fields["cmd"]),
        cmd=fields["cmd"],
        cwd=str(cwd),
        log=str(spool.log_path(job_id)),
        env=fields["env"],
        shell_env=None,
        venv=str(venv) if venv else None,
        after=fields["after"],
        after_any=fields["after_any"],
        retries=fields["retries"],
        priority=fields["priority"],
        source=f"dropped:{original}",
    )
    spool.publish(job)


def _resume_intake(spool: Spool, job_id: int, hidden: str) -> str:
    """Finish an intake that a crash interrupted, with the id it was already given."""
    original = hidden.split("-", 2)[2]
    if spool.find(job_id) is not None:  # published before the crash; only the cleanup was left
        try:
            spool.finish_intake(hidden)
        except FileNotFoundError:
            pass
        return f"job #{job_id}"
    try:
        fields = _read_dropped(spool, original, hidden)
    except FileNotFoundError:
        return "gone"
    except jobs.InvalidJob as exc:
        return _reject(spool, original, str(exc), hidden=hidden)
    return _publish(spool, job_id, hidden, original, fields)


def _reject(spool: Spool, name: str, reason: str, hidden: Optional[str] = None) -> str:
    try:
        spool.reject(name, reason, hidden_name=hidden)
    except FileNotFoundError:
        return "gone"
    return f"rejected: {reason}"


def is_canonical(name: str) -> bool:
    return bool(JOB_NAME_RE.match(name))
