"""The spool's core: paths, reading, atomic writes and state moves, ids, dropped files.

See gpuq/spool/__init__.py for the protocol in short and spool_layout.md for the contract.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional

from gpuq import fsutil, jobs, security

STATES = ("pending", "running", "done", "failed", "preempted", "interrupted", "cancelled")
FINISHED = ("done", "failed", "cancelled")
REJECTED = "rejected"
INTERNAL = ("tmp", "locks", "logs", "workers", "control", "progress", "cache")
JOB_NAME_RE = re.compile(r"^(\d{6,})-[A-Za-z0-9._-]*\.json$")
PLAIN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.json$")
INTAKE_RE = re.compile(r"^\.intake-(\d{6,})-(.+)$")
MAX_JOB_BYTES = 1 << 20
STALE_TMP_SECONDS = 600.0


class SpoolError(Exception):
    """Something in the spool prevents the operation; the message is meant for the user."""


class SpoolFull(SpoolError, OSError):
    """A write failed for lack of space (disk, quota, file-size limit); the partial file is gone.
    Also an OSError, so code that handles write errors keeps handling this one."""

    def __init__(self, home: Path, exc: OSError):
        self.message = f"cannot write to the spool {home}: {exc.strerror}; free some space and try again"
        super().__init__(exc.errno, exc.strerror)

    def __str__(self) -> str:
        return self.message


class JobRef(NamedTuple):
    id: int
    state: str
    name: str


def default_home() -> Path:
    return Path(os.environ.get("GPUQ_HOME") or Path.home() / ".gpuq").absolute()


def boot_id() -> str:
    """Identifies this boot: a process recorded under another boot id is certainly gone."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        import psutil  # macOS and others: the boot time identifies the boot well enough

        return f"boot-{int(psutil.boot_time())}"


class Claim:
    """An owned claim lock: the flock lives on `fd` until release() or process death."""

    def __init__(self, job_id: int, fd: int, path: Path):
        self.job_id, self.fd, self.path = job_id, fd, path

    def release(self) -> None:
        """Remove the lock file (it is still ours: nobody can create that name while it exists)."""
        if self.fd < 0:
            return
        if fsutil.same_inode(self.fd, self.path):
            os.unlink(self.path)
        os.close(self.fd)
        self.fd = -1

    def detach(self) -> None:
        """Forget the claim without removing it (another process now holds the descriptor)."""
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


class SpoolBase:
    """Layout, listing, reading, atomic writes and moves, ids, hand-dropped files, housekeeping."""

    def __init__(self, home: Optional[Path] = None):
        self.home = Path(home) if home is not None else default_home()
        self._tmp_counter = 0

    # ---- layout -------------------------------------------------------------------------------
    def ensure(self) -> SpoolBase:
        """Create the tree (mode 0700) on first use, and refuse a tree that others could write
        into: whoever can drop a file in pending/ runs commands as us (see security.py)."""
        os.umask(0o077)
        for sub in ("",) + STATES + (REJECTED,) + INTERNAL:
            path = self.home / sub
            try:
                if sub == "":
                    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass  # checked below, whatever it turns out to be
            problem = security.directory_problem(path, is_home=(sub == ""))
            if problem:
                raise SpoolError(problem)
        return self

    def state_dir(self, state: str) -> Path:
        return self.home / state

    def log_path(self, job_id: int) -> Path:
        return self.home / "logs" / f"{job_id:06d}.log"

    def progress_path(self, job_id: int) -> Path:
        return self.home / "progress" / f"{job_id:06d}.json"

    def worker_log_path(self) -> Path:
        return self.home / "logs" / "worker.log"

    def lock_path(self, job_id: int) -> Path:
        return self.home / "locks" / f"{job_id:06d}.lock"

    # ---- listing ------------------------------------------------------------------------------
    def names(self, state: str) -> list[str]:
        """Job file names in a state directory, in id order (dot-files and strangers excluded)."""
        try:
            entries = os.listdir(self.home / state)
        except FileNotFoundError:
            return []
        return sorted(n for n in entries if JOB_NAME_RE.match(n))

    def refs(self, states: tuple[str, ...] = STATES) -> Iterator[JobRef]:
        for state in states:
            for name in self.names(state):  # names() matched JOB_NAME_RE: the id ends at the first "-"
                yield JobRef(int(name[: name.index("-")]), state, name)

    def newer_copy_elsewhere(self, ref: JobRef, job: dict[str, Any]) -> bool:
        """Whether a crash mid-move left this job in another state too, with a higher rev (then
        `ref` is the stale copy). Older copies found are removed. The caller holds the claim.
        A job keeps its file name in every state, so this is a handful of exact-name lookups."""
        newer = False
        for state in STATES:
            if state == ref.state or not os.path.lexists(self.home / state / ref.name):
                continue
            other = JobRef(ref.id, state, ref.name)
            try:
                other_rev = self.load(other)["rev"]
            except (FileNotFoundError, jobs.InvalidJob):
                continue
            if other_rev > job["rev"]:
                newer = True
            else:
                self.remove(other)
        return newer

    def signature(self) -> tuple[tuple[int, int], ...]:
        """Changes whenever a job enters or leaves pending/ or running/, or a claim or request
        appears or goes: a worker that sees the same signature has nothing new to schedule."""
        out = []
        for sub in ("pending", "running", "locks", "control"):
            try:
                st = os.stat(self.home / sub)
            except FileNotFoundError:
                st = None
            out.append((st.st_ino, st.st_mtime_ns) if st else (0, 0))
        return tuple(out)

    def index(self) -> dict[int, list[JobRef]]:
        """id -> every copy of that job in the tree (more than one only after a crash mid-move)."""
        found: dict[int, list[JobRef]] = {}
        for ref in self.refs():
            found.setdefault(ref.id, []).append(ref)
        return found

    def find(self, job_id: int, states: tuple[str, ...] = STATES) -> Optional[JobRef]:
        prefix = f"{job_id:06d}-"
        for state in states:
            for name in self.names(state):
                if name.startswith(prefix):
                    return JobRef(job_id, state, name)
        return None

    def dropped_files(self) -> list[str]:
        """Files in pending/ that are not (yet) gpuq job files: candidates for intake."""
        try:
            entries = os.listdir(self.home / "pending")
        except FileNotFoundError:
            return []
        return sorted(n for n in entries if not n.startswith(".") and not JOB_NAME_RE.match(n))

    # ---- reading ------------------------------------------------------------------------------
    def read_bytes(self, state: str, name: str) -> bytes:
        """Read a file of a state directory safely: no symlinks, regular, ours, size-capped.

        Raises FileNotFoundError if it vanished and jobs.InvalidJob for anything we refuse.
        """
        path = self.home / state / name
        try:
            # O_NONBLOCK: a FIFO dropped here must not hang the worker in open()
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise
        except OSError as exc:
            reason = security.open_error_reason(exc)
            if reason is None and os.path.islink(path):  # a platform with another errno for links
                reason = security.open_error_reason(OSError(errno.ELOOP, "link"))
            if reason is None:
                raise  # not about the file (out of descriptors...): it stays for the next look
            raise jobs.InvalidJob(reason) from None
        try:
            problem = security.job_file_problem(os.fstat(fd), MAX_JOB_BYTES)
            if problem:
                raise jobs.InvalidJob(problem)
            chunks, total = [], 0
            while total <= MAX_JOB_BYTES:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            if total > MAX_JOB_BYTES:
                raise jobs.InvalidJob(f"grew past the limit of {MAX_JOB_BYTES} bytes")
            return b"".join(chunks)
        finally:
            os.close(fd)

    def load(self, ref: JobRef) -> dict[str, Any]:
        """A valid job dict for `ref`; jobs.InvalidJob or FileNotFoundError otherwise."""
        obj = jobs.parse_bytes(self.read_bytes(ref.state, ref.name))
        return jobs.validate(obj, expected_id=ref.id)

    def load_many(self, state: str) -> list[tuple[JobRef, dict[str, Any]]]:
        """Every valid job of a state directory; vanished or invalid files are skipped."""
        out = []
        for ref in self.refs((state,)):
            try:
                out.append((ref, self.load(ref)))
            except (FileNotFoundError, jobs.InvalidJob):
                continue
        return out

    # ---- writing ------------------------------------------------------------------------------
    def _tmp_path(self, kind: str) -> Path:
        self._tmp_counter += 1
        return self.home / "tmp" / f".{kind}-{os.getpid()}-{self._tmp_counter}-{os.urandom(4).hex()}"

    def _write_tmp(self, data: bytes, kind: str = "job") -> Path:
        path = self._tmp_path(kind)
        try:
            fsutil.write_new_file(path, data)  # removes its partial file on any error
        except OSError as exc:
            if exc.errno in security.FULL_ERRNOS:
                raise SpoolFull(self.home, exc) from None
            raise
        return path

    def _place(self, job: dict[str, Any], state: str) -> JobRef:
        """Write `job` into `state` as a new file; FileExistsError if that name is taken."""
        name = jobs.filename(job["id"], job["name"])
        tmp = self._write_tmp(_encode(job))
        try:
            fsutil.rename_noreplace(tmp, self.home / state / name)
        except BaseException:
            os.unlink(tmp)
            raise
        fsutil.fsync_dir(self.home / state)
        return JobRef(job["id"], state, name)

    def publish(self, job: dict[str, Any], state: str = "pending") -> JobRef:
        """Publish a brand-new job; once this returns it survives a power cut."""
        return self._place(job, state)

    def transition(self, ref: JobRef, job: dict[str, Any], state: str, **changes: Any) -> tuple[JobRef, dict]:
        """Move a job to `state` (or rewrite it in place of its old file when `state` is the same)
        with `changes` applied and rev + 1. The caller holds the job's claim."""
        new = dict(job, **changes)
        new["rev"] = job["rev"] + 1
        if state == ref.state:
            tmp = self._write_tmp(_encode(new))
            os.replace(tmp, self.home / ref.state / ref.name)  # replaces our own file, by design
            fsutil.fsync_dir(self.home / ref.state)
            return ref, new
        new_ref = self._place(new, state)
        self.remove(ref)  # a recovery scan may have removed the old copy already
        return new_ref, new

    def rewrite(self, ref: JobRef, job: dict[str, Any], **changes: Any) -> dict[str, Any]:
        """A new version of a job in its current state (never an edit of the published file)."""
        return self.transition(ref, job, ref.state, **changes)[1]

    def remove(self, ref: JobRef) -> None:
        try:
            os.unlink(self.home / ref.state / ref.name)
        except FileNotFoundError:
            return
        fsutil.fsync_dir(self.home / ref.state)

    # ---- ids ----------------------------------------------------------------------------------
    @contextmanager
    def _flocked(self, name: str) -> Iterator[None]:
        fd = os.open(self.home / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextmanager
    def intake_turn(self) -> Iterator[bool]:
        """True for the one process taking in dropped files right now (others skip their turn),
        so several workers do not race for the same file and waste ids on it."""
        fd = os.open(self.home / "intake.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            yield fsutil.try_flock(fd)
        finally:
            os.close(fd)

    def adopt_lock(self) -> Any:
        """Held by `gpuq adopt` from "is this process tracked yet?" to publishing it, so two
        adopters of one process cannot both create a job (the kernel drops it if we die)."""
        return self._flocked("adopt.lock")

    def allocate_id(self) -> int:
        """The next job id: unique and increasing even with many concurrent callers."""
        with self._flocked("ids.lock"):
            counter = self.home / "next_id"
            try:
                next_id = int(counter.read_text())
            except (FileNotFoundError, ValueError):
                next_id = self._highest_known_id() + 1
            tmp = self._write_tmp(f"{next_id + 1}\n".encode(), "id")
            os.replace(tmp, counter)
            fsutil.fsync_dir(self.home)
            return next_id

    def _highest_known_id(self) -> int:
        ids = [ref.id for ref in self.refs()]
        for name in os.listdir(self.home / "pending"):
            m = INTAKE_RE.match(name)
            if m:
                ids.append(int(m.group(1)))
        return max(ids, default=0)

    # ---- hand-dropped files -------------------------------------------------------------------
    def begin_intake(self, name: str, job_id: int) -> str:
        """Rename a dropped file to a hidden name that carries its new id (so a crash cannot
        take it in twice); returns the hidden name."""
        hidden = f".intake-{job_id:06d}-{name}"
        fsutil.rename_noreplace(self.home / "pending" / name, self.home / "pending" / hidden)
        return hidden

    def intake_leftovers(self) -> list[tuple[int, str]]:
        out = []
        for name in os.listdir(self.home / "pending"):
            m = INTAKE_RE.match(name)
            if m:
                out.append((int(m.group(1)), name))
        return sorted(out)

    def finish_intake(self, hidden: str) -> None:
        os.unlink(self.home / "pending" / hidden)
        fsutil.fsync_dir(self.home / "pending")

    def reject(self, name: str, reason: str, *, hidden_name: Optional[str] = None) -> str:
        """Move a file that is not a valid job from pending/ to rejected/, reason beside it."""
        source = self.home / "pending" / (hidden_name or name)
        base = _short_name(name)  # room for ".N.reason" within the 255-byte name limit
        target = base
        for n in range(1, 10000):
            try:
                fsutil.rename_noreplace(source, self.home / REJECTED / target)
                break
            except FileExistsError:
                target = f"{base}.{n}"
        tmp = self._write_tmp(f"{reason}\n".encode(), "reason")
        os.replace(tmp, self.home / REJECTED / f"{target}.reason")
        fsutil.fsync_dir(self.home / REJECTED)
        return target

    # ---- housekeeping -------------------------------------------------------------------------
    def clean_tmp(self, now: Optional[float] = None) -> int:
        """Remove tmp files left by writers that died (or that are implausibly old)."""
        from gpuq.procs import pid_alive

        now = time.time() if now is None else now
        removed = 0
        for name in os.listdir(self.home / "tmp"):
            parts = name.split("-")
            path = self.home / "tmp" / name
            try:
                age = now - os.stat(path, follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            writer = int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else -1
            if age > STALE_TMP_SECONDS or not pid_alive(writer):
                try:
                    os.unlink(path)
                    removed += 1
                except FileNotFoundError:
                    pass
        return removed

    def delete_log(self, job_id: int) -> None:
        for path in (self.log_path(job_id), self.progress_path(job_id), self.samples_path(job_id)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _short_name(name: str, limit: int = 200) -> str:
    """`name`, or if its encoding is longer than `limit` bytes, a prefix of it plus a hash."""
    raw = os.fsencode(name)
    if len(raw) <= limit:
        return name
    import hashlib

    return os.fsdecode(raw[: limit - 17]) + "~" + hashlib.sha1(raw).hexdigest()[:16]


def _encode(job: dict[str, Any]) -> bytes:
    try:
        return (json.dumps(job, indent=2, ensure_ascii=False) + "\n").encode()
    except UnicodeEncodeError:
        # an argument or variable holding bytes that are not UTF-8 (kept by Python as \udcXX):
        # \u escapes keep them exactly, in a file that is still valid UTF-8
        return (json.dumps(job, indent=2, ensure_ascii=True) + "\n").encode()
