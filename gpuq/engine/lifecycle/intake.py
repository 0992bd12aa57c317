"""Taking in job files dropped into pending/ by hand: each becomes a proper job or goes to rejected/.
A file that does not parse yet is left alone while a process has it open for writing or it changed
in the last GPUQ_INTAKE_QUIET seconds, so `cat > pending/x.json` typed slowly is never rejected.
"""

from __future__ import annotations

import os
import time
from contextlib import suppress
from pathlib import Path
from typing import Any, Optional

from gpuq.core import schema
from gpuq.core.states import PENDING, SOURCE_DROPPED
from gpuq.engine.lifecycle import enqueue, interpreter
from gpuq.spool import JobRef, Spool
from gpuq.spool.ids import NoIdLeft
from gpuq.spool.layout import PLAIN_NAME_RE
from gpuq.system import security

MAX_DROPPED_NAME = 200
# the options a dropped file gives its job as they are (None where it has none)
OPTIONS = (
    "gpu_request gpu_mem_mib mem_mib cpus notify_urls retry_oom keep_checkpoints min_free_bytes ckpt_glob"
).split()


def quiet_seconds() -> float:
    try:
        return float(os.environ.get("GPUQ_INTAKE_QUIET", "5"))
    except ValueError:
        return 5.0


class Writers:
    """Which files of one directory some process holds open for writing (Linux /proc; none elsewhere),
    scanned once per pass and only if a file needs it: a scan reads every process's descriptors."""

    MAX_AGE = 0.25  # seconds a scan is trusted: a writer may open a file after we looked

    def __init__(self, directory: str) -> None:
        self.directory = os.path.realpath(directory)  # /proc shows resolved paths
        self._paths: set[str] = set()
        self._scanned_at: Optional[float] = None

    def __contains__(self, path: object) -> bool:
        if self._scanned_at is None or time.monotonic() - self._scanned_at > self.MAX_AGE:
            self._paths = _scan_writers(self.directory + os.sep)
            self._scanned_at = time.monotonic()
        return os.path.join(self.directory, os.path.basename(str(path))) in self._paths


def _scan_writers(prefix: str) -> set[str]:
    proc = Path("/proc")
    found: set[str] = set()
    if not (proc / "self" / "fd").is_dir():
        return found
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            fds = os.listdir(pid_dir / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(pid_dir / "fd" / fd)
                if not target.startswith(prefix) or target in found:
                    continue
                flags = (pid_dir / "fdinfo" / fd).read_text().split("flags:")[1].split()[0]
            except (OSError, IndexError):
                continue
            if int(flags, 8) & (os.O_WRONLY | os.O_RDWR):
                found.add(target)
    return found


def still_being_written(path: str, now: float, writers: Optional[Writers] = None) -> bool:
    try:
        mtime = os.stat(path, follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return False
    if now - mtime < quiet_seconds():
        return True
    return path in (writers if writers is not None else Writers(os.path.dirname(path)))


def take_in_some(
    spool: Spool, now: Optional[float] = None, budget: Optional[float] = None
) -> tuple[list[tuple[str, str]], bool]:
    """Process dropped files for at most `budget` seconds (None: all), so that a burst cannot hold up
    the queue: (printable file name, outcome) pairs, and True if files were left for the next pass."""
    now = time.time() if now is None else now
    stop_at = None if budget is None else time.monotonic() + budget
    writers = Writers(spool.layout.state_dir(PENDING))
    outcomes: list[tuple[str, str]] = []
    for job_id, hidden in spool.dropbox.leftovers():
        outcomes.append((security.display(hidden), _resume_intake(spool, job_id, hidden)))
    for name in spool.dropbox.dropped():
        if stop_at is not None and time.monotonic() > stop_at:
            return outcomes, True
        outcome = take_in(spool, name, now, writers)
        if outcome != "waiting":
            outcomes.append((security.display(name), outcome))
    return outcomes, False


def take_in(spool: Spool, name: str, now: float, writers: Optional[Writers] = None) -> str:
    """'job #N', 'rejected: reason', 'waiting' (incomplete) or 'gone'."""
    path = spool.layout.job_path(PENDING, name)
    if not PLAIN_NAME_RE.match(name):
        if name.endswith(".json"):
            return _reject(spool, name, "file name must be letters, digits, '.', '_' or '-' and end in .json")
        return "waiting"  # not a job file at all (editor backups, notes): left alone
    if len(name) > MAX_DROPPED_NAME:  # the hidden intake name adds a prefix; keep it under 255 bytes
        return _reject(spool, name, f"file name is longer than {MAX_DROPPED_NAME} characters")
    try:
        try:
            fields = _read_dropped(spool, name)
        except schema.IncompleteJob:
            if still_being_written(path, now, writers):
                return "waiting"
            # Its writer may have finished between our read and our look at /proc: the file is
            # closed now, so this second read sees its final content.
            fields = _read_dropped(spool, name)
    except FileNotFoundError:
        return "gone"
    except schema.InvalidJob as exc:
        return _reject(spool, name, str(exc))
    try:
        job_id = spool.ids.allocate()
        while spool.jobs.find(job_id) is not None:  # a finished job moved in by hand that no look has seen
            job_id = spool.ids.allocate()
    except NoIdLeft as exc:  # it could never be taken in: set aside, not tried at every step
        return _reject(spool, name, str(exc))
    try:
        hidden = spool.dropbox.begin(name, job_id)
    except FileNotFoundError:
        return "gone"
    return _publish(spool, job_id, hidden, name, fields, fresh=True)


def _read_dropped(spool: Spool, name: str, hidden: Optional[str] = None) -> dict[str, Any]:
    obj = schema.parse_bytes(spool.jobs.read_bytes(PENDING, hidden or name))
    if "schema_version" in obj:
        raise schema.InvalidJob("looks like a gpuq job file but is not named NNNNNN-name.json after its id")
    fields = schema.normalize_dropped(obj)
    missing = enqueue.missing_jobs(spool, fields["after"] + fields["after_any"])
    if missing:
        raise schema.InvalidJob(f"after: no such job {missing}")
    return fields


def _publish(spool: Spool, job_id: int, hidden: str, original: str, fields: dict[str, Any], fresh: bool = False) -> str:
    """Publish the job under its id's claim (two workers finishing one intake cannot both).
    `fresh`: the id was just found unused, and no other intake has this file."""
    claim = spool.claims.claim(job_id)
    if claim is None:
        return "waiting"
    try:
        with suppress(FileNotFoundError):
            if fresh or spool.jobs.find(job_id) is None:
                _publish_claimed(spool, job_id, original, fields)
            spool.dropbox.finish(hidden)
    except _Rejected as exc:
        return _reject(spool, original, str(exc), hidden=hidden)
    finally:
        claim.release()
    return f"job #{job_id}"


class _Rejected(Exception):
    pass


def _publish_claimed(spool: Spool, job_id: int, original: str, fields: dict[str, Any]) -> None:
    cwd = Path(fields.get("cwd") or Path.home())
    try:
        if not cwd.is_dir():
            raise _Rejected(f"cwd does not exist: {cwd}")
        conda = fields.get("conda")
        if conda is not None and not interpreter.is_conda_prefix(conda):
            raise _Rejected(f"conda: not a conda environment (no conda-meta/ in it): {conda}")
        # a script runs as `gpuq add` would run it: the job runs with the worker's PATH
        resolved = interpreter.resolve_dropped(fields["cmd"], str(cwd), conda, {"PATH": os.environ.get("PATH", "")})
    except OSError as exc:  # not ours to read, name too long...: the file's problem, not the worker's
        raise _Rejected(f"cwd cannot be used: {exc.strerror}: {cwd}") from None
    except interpreter.EnqueueError as exc:
        raise _Rejected(str(exc)) from None
    job = schema.new_job(
        job_id=job_id,
        name=fields.get("name") or enqueue.default_name(cwd, fields["cmd"]),
        cmd=resolved.cmd,
        cwd=str(cwd),
        log=str(spool.layout.log_path(job_id)),
        env=fields["env"],
        shell_env=None,
        venv=resolved.venv,
        after=fields["after"],
        after_any=fields["after_any"],
        retries=fields["retries"],
        priority=fields["priority"],
        source=SOURCE_DROPPED + original,
        options={
            **{key: fields.get(key) for key in OPTIONS},
            "conda": conda,
            "interpreter_from": resolved.found_by,
        },
    )
    spool.jobs.publish(job)


def _resume_intake(spool: Spool, job_id: int, hidden: str) -> str:
    """Finish an intake that a crash interrupted, with the id it was already given."""
    original = hidden.split("-", 2)[2]
    if spool.jobs.find(job_id) is not None:  # published before the crash; only the cleanup was left
        with suppress(FileNotFoundError):
            spool.dropbox.finish(hidden)
        return f"job #{job_id}"
    try:
        fields = _read_dropped(spool, original, hidden)
    except FileNotFoundError:
        return "gone"
    except schema.InvalidJob as exc:
        return _reject(spool, original, str(exc), hidden=hidden)
    return _publish(spool, job_id, hidden, original, fields)


def _reject(spool: Spool, name: str, reason: str, hidden: Optional[str] = None) -> str:
    try:
        spool.dropbox.reject(name, reason, hidden_name=hidden or "")
    except FileNotFoundError:
        return "gone"
    return f"rejected: {reason}"


def reject_broken(
    spool: Spool, invalid: list[tuple[JobRef, str]], now: float, budget: float
) -> tuple[list[tuple[str, str]], bool, bool]:
    """Move canonical-looking pending files that are not valid jobs to rejected/ once written, for at
    most `budget` seconds: (file name, outcome) pairs, True if some were left, and True if some are
    still being written (nothing announces that their writer is done: they need another look)."""
    writers = Writers(spool.layout.state_dir(PENDING))  # one /proc scan for all of them
    stop_at = time.monotonic() + budget
    outcomes: list[tuple[str, str]] = []
    writing = False
    for ref, reason in invalid:
        if time.monotonic() > stop_at:
            return outcomes, True, writing
        if ref.state != PENDING:
            continue
        if still_being_written(spool.layout.job_path(ref.state, ref.name), now, writers):
            writing = True
        elif _reject(spool, ref.name, reason) != "gone":
            outcomes.append((ref.name, f"rejected: {reason}"))
    return outcomes, False, writing
