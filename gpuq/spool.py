"""The spool directory: the only module that knows gpuq's paths and changes files under them.

spool_layout.md is the contract this module implements. In short:
- a job is one JSON file; the state directory it sits in is its state;
- new files are written complete and fsynced in tmp/, then renamed into place without clobbering;
- a state change writes the new version (rev + 1) into the target directory, then unlinks the old
  one, so a crash in between leaves two copies and the higher rev wins (see recovery.py);
- whoever changes a job's file holds the job's claim lock (locks/NNNNNN.lock), an O_EXCL file that
  is flock()ed by its owner for as long as the claim lives, so a dead owner is seen by the kernel.
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


class Spool:
    def __init__(self, home: Optional[Path] = None):
        self.home = Path(home) if home is not None else default_home()
        self._tmp_counter = 0

    # ---- layout -------------------------------------------------------------------------------
    def ensure(self) -> Spool:
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

    # ---- claims -------------------------------------------------------------------------------
    def claim(self, job_id: int) -> Optional[Claim]:
        """Take the claim on a job, or None if someone else holds it.

        The lock file is created hidden, flocked, then renamed into place without clobbering,
        so a visible lock file is always already locked by a live owner or by nobody.
        """
        tmp = self._tmp_path("claim")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "at": time.time()}).encode())
        try:
            fsutil.rename_noreplace(tmp, self.lock_path(job_id))
        except FileExistsError:
            os.unlink(tmp)
            os.close(fd)
            return None
        return Claim(job_id, fd, self.lock_path(job_id))

    def claim_held(self, job_id: int) -> Optional[bool]:
        """True if a live owner holds the job's claim, False if the lock is stale, None if absent."""
        fd = fsutil.open_existing(self.lock_path(job_id))
        if fd is None:
            return None
        try:
            return not fsutil.try_flock(fd, exclusive=False)
        finally:
            os.close(fd)

    def take_over_claim(self, job_id: int) -> Optional[Claim]:
        """Own the job's claim: a fresh one if there is no lock, the stale one if its owner died.

        Two processes doing this at once cannot both win: only one gets the flock, and the other
        then finds the path gone or naming another inode.
        """
        fd = fsutil.open_existing(self.lock_path(job_id), os.O_RDWR)
        if fd is None:
            return self.claim(job_id)
        if fsutil.try_flock(fd) and fsutil.same_inode(fd, self.lock_path(job_id)):
            return Claim(job_id, fd, self.lock_path(job_id))
        os.close(fd)
        return None

    def lock_ids(self) -> list[int]:
        out = []
        for name in os.listdir(self.home / "locks"):
            if name.endswith(".lock") and name[:-5].isdigit():
                out.append(int(name[:-5]))
        return out

    # ---- control requests (kill, preempt) -----------------------------------------------------
    def request(self, job_id: int, action: str) -> None:
        """Leave a note for the job's supervisor saying why its job is about to be signalled."""
        tmp = self._write_tmp(json.dumps({"action": action, "at": time.time()}).encode(), "ctl")
        os.replace(tmp, self.home / "control" / f"{job_id:06d}.json")
        fsutil.fsync_dir(self.home / "control")

    def take_request(self, job_id: int) -> Optional[str]:
        path = self.home / "control" / f"{job_id:06d}.json"
        try:
            action = json.loads(path.read_bytes()).get("action")
            os.unlink(path)
        except (FileNotFoundError, ValueError, AttributeError):
            return None
        return action if isinstance(action, str) else None

    def request_ids(self) -> list[int]:
        return [int(n[:-5]) for n in os.listdir(self.home / "control") if n[:-5].isdigit()]

    def peek_request(self, job_id: int) -> Optional[str]:
        """The pending control request for a job, left in place (take_request consumes it)."""
        try:
            action = json.loads((self.home / "control" / f"{job_id:06d}.json").read_bytes()).get("action")
        except (FileNotFoundError, ValueError, AttributeError):
            return None
        return action if isinstance(action, str) else None

    # ---- reading what a job wrote (preemption: how far did it get?) ---------------------------
    def log_tail_bytes(self, job_id: int, limit: int = 65536) -> bytes:
        """The last `limit` bytes of a job's log (b"" if none); cost does not grow with the log."""
        try:
            fd = os.open(self.log_path(job_id), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return b""
        try:
            size = os.fstat(fd).st_size
            return os.pread(fd, min(limit, size), max(0, size - limit))
        finally:
            os.close(fd)

    def read_progress(self, job_id: int) -> Optional[tuple[dict[str, Any], float]]:
        """(contents, mtime) of the progress file a job may write via GPUQ_PROGRESS_FILE."""
        path = self.progress_path(job_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            data = json.loads(os.read(fd, 65536))
            mtime = os.fstat(fd).st_mtime
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        return (data, mtime) if isinstance(data, dict) else None

    # ---- progress and ETA (see "Progress and ETA" in spool_layout.md) ------------------------
    def job_log_tail(self, job: dict[str, Any], limit: int = 65536) -> tuple[bytes, float]:
        """The last `limit` bytes of a job's log and the log's mtime ((b"", 0.0) if none). An
        adopted job's log is the file it writes itself (its `log` field); others have ours."""
        path = Path(job["log"]) if job.get("adopted") and job.get("log") else self.log_path(job["id"])
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return b"", 0.0
        try:
            st = os.fstat(fd)
            if not _is_regular(st.st_mode):
                return b"", 0.0
            return os.pread(fd, min(limit, st.st_size), max(0, st.st_size - limit)), st.st_mtime
        finally:
            os.close(fd)

    def samples_path(self, job_id: int) -> Path:
        return self.home / "progress" / f"{job_id:06d}.samples.json"

    def read_samples(self, job_id: int) -> dict[str, Any]:
        """The progress samples recorded by earlier looks at a job ({} if none or unreadable)."""
        try:
            fd = os.open(self.samples_path(job_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return {}
        try:
            data = json.loads(os.read(fd, 1 << 20))
        except (OSError, ValueError):
            return {}
        finally:
            os.close(fd)
        return data if isinstance(data, dict) else {}

    def write_samples(self, job_id: int, samples: dict[str, Any]) -> None:
        """Replace a job's samples file atomically. Two lookers at once may each drop the other's
        newest sample; that costs a little precision, never a wrong value. Not fsynced: losing
        samples in a power cut only delays the next ETA."""
        path = self._tmp_path("samples")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, json.dumps(samples, separators=(",", ":")).encode())
        finally:
            os.close(fd)
        os.replace(path, self.samples_path(job_id))

    # ---- caches (derived data, always rebuildable: see "Caches" in spool_layout.md) ---------
    def dir_signature(self, state: str) -> Optional[tuple[int, int, float]]:
        """(inode, mtime_ns, mtime) of a state directory: it changes whenever a file is added,
        removed or replaced there. None if it is missing."""
        try:
            st = os.stat(self.home / state, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_mtime

    def file_signatures(self, state: str, names: list[str]) -> dict[str, tuple[int, int, int]]:
        """name -> (inode, mtime_ns, size) of job files in `state`; vanished ones are left out."""
        directory, out = os.fspath(self.home / state), {}
        for name in names:
            try:
                st = os.stat(os.path.join(directory, name), follow_symlinks=False)
            except FileNotFoundError:
                continue
            out[name] = (st.st_ino, st.st_mtime_ns, st.st_size)
        return out

    def read_cache(self, name: str) -> Optional[bytes]:
        """A cache file (cache/NAME) if it is a regular file of ours, else None."""
        try:
            fd = os.open(self.home / "cache" / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not _is_regular(st.st_mode) or st.st_uid != os.geteuid():
                return None
            chunks = []
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
        finally:
            os.close(fd)

    def write_cache(self, name: str, data: bytes) -> None:
        """Replace cache/NAME atomically. Not fsynced: a cache lost in a power cut is rebuilt."""
        path = self._tmp_path("cache")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        os.replace(path, self.home / "cache" / name)

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

    # ---- workers ------------------------------------------------------------------------------
    def register_worker(self, gpus: Optional[list[str]], info: dict[str, Any]) -> WorkerLease:
        """Take the worker locks for `gpus` (None: the whole machine) or raise WorkerBusy.

        A whole-machine worker holds workers/machine.lock exclusively; a --gpus worker holds it
        shared plus workers/gpu-N.lock exclusively for each of its GPUs. The kernel drops the
        locks when the worker dies, so a crashed worker never blocks the next one.
        """
        fds = []
        try:
            machine = os.open(self.home / "workers" / "machine.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            fds.append(machine)
            if not fsutil.try_flock(machine, exclusive=gpus is None):
                raise WorkerBusy(self.live_workers())
            for gpu in gpus or []:
                fd = os.open(self.home / "workers" / f"gpu-{gpu}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
                fds.append(fd)
                if not fsutil.try_flock(fd):
                    raise WorkerBusy([w for w in self.live_workers() if gpu in (w.get("gpus") or [gpu])])
            tmp = self._tmp_path("worker")
            info_fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            fds.append(info_fd)
            fcntl.flock(info_fd, fcntl.LOCK_EX)
            os.write(info_fd, json.dumps(info).encode())
            info_path = self.home / "workers" / f"worker-{os.getpid()}.json"
            os.replace(tmp, info_path)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return WorkerLease(fds, info_path)

    def live_workers(self) -> list[dict[str, Any]]:
        """Info of every worker alive now (its info file is flocked); stale files are removed."""
        out = []
        for name in sorted(os.listdir(self.home / "workers")):
            if not (name.startswith("worker-") and name.endswith(".json")):
                continue
            path = self.home / "workers" / name
            fd = fsutil.open_existing(path)
            if fd is None:
                continue
            try:
                if fsutil.try_flock(fd, exclusive=False):
                    if fsutil.same_inode(fd, path):
                        os.unlink(path)  # its worker died without cleaning up
                    continue
                try:
                    out.append(json.loads(os.read(fd, 65536)))
                except ValueError:
                    continue
            finally:
                os.close(fd)
        return out


class WorkerBusy(SpoolError):
    def __init__(self, holders: list[dict[str, Any]]):
        self.holders = holders
        who = ", ".join(f"pid {w.get('pid')} (gpus {','.join(w['gpus']) if w.get('gpus') else 'all'})" for w in holders)
        super().__init__(f"another worker is running for this spool: {who or 'unknown pid'}")


class WorkerLease:
    def __init__(self, fds: list[int], info_path: Path):
        self.fds, self.info_path = fds, info_path

    def release(self) -> None:
        try:
            os.unlink(self.info_path)
        except FileNotFoundError:
            pass
        for fd in self.fds:
            os.close(fd)
        self.fds = []


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


def _is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)
