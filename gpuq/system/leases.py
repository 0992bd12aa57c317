"""GPU leases: who is using which GPU of this machine, in a sticky directory every user's gpuq
reads (the protocol: lease_layout.md). A lease is alive exactly while its holder keeps an flock on
its file, so a crashed holder's lease is stale the moment the kernel drops the lock. Nothing here
trusts the directory's other users: files are opened without following links and must be owned by
the uid they name; what cannot be trusted raises LeaseDirProblem, said once (`say_once`)."""

from __future__ import annotations

import json
import os
import stat
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional

from gpuq.system import fsutil, lease_io, procs
from gpuq.system.lease_io import OFF, LeaseDirProblem
from gpuq.system.security import display

LEASE_DIR_ENV = "GPUQ_LEASE_DIR"
PLACING_TIMEOUT = 2.0  # seconds: a placement takes milliseconds; a lock held longer is stuck or hostile
PREFIX, SUFFIX = "gpuq-lease.", ".lease"  # a lease's name: PREFIX<UUID>.<uid>.<pid>.<n>SUFFIX
STALE_TMP_SECONDS = 60.0  # a writer's temporary file older than this, unlocked, was left by a crash
_POLL_SECONDS = 0.005


class Lease(NamedTuple):
    """One live lease of one GPU: its file's name, then the fields of its line (lease_layout.md)."""

    file: str
    gpu_uuid: str
    gpu_index: int
    mem_mib: Optional[int]  # None: the whole GPU
    user: str
    uid: int
    pid: int
    pid_start: float
    job: Optional[int]  # None: a `gpuq lease` command
    name: str
    spool: Optional[str]
    since: float
    host: str

    @property
    def whole(self) -> bool:
        return self.mem_mib is None

    def who(self, viewer_uid: int) -> str:
        """ "bob's job #12", "your job #3 (train)", "bob's `jupyter` (gpuq lease, pid 4242)": another
        user's job names are theirs to show."""
        mine = self.uid == viewer_uid
        owner = "your" if mine else f"{self.user}'s"
        if self.job is None:
            return f"{owner} `{self.name}` (gpuq lease, pid {self.pid})"
        return f"{owner} job #{self.job} ({self.name})" if mine else f"{owner} job #{self.job}"


class Held:
    """A lease this process holds: its lock lives in `fd` until `release()` (or the process's end)."""

    __slots__ = ("lease", "fd", "path")

    def __init__(self, lease: Lease, fd: int, path: str) -> None:
        self.lease, self.path = lease, path
        self.fd: Optional[int] = fd

    def release(self) -> None:
        """Unlink, then close (which drops the lock): in that order, no reader ever sees our file
        unlocked and takes it for a crashed holder's. Idempotent."""
        if self.fd is not None:
            fsutil.unlink_quietly(self.path)  # gone: root, or its owner's other gpuq, cleaned a stale copy
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def default_dir() -> str:
    """$GPUQ_LEASE_DIR if set; else /dev/shm itself (cleared at reboot, as leases must be), else /tmp:
    root's and sticky. Not a directory of gpuq's own in them: every other user's gpuq would rightly
    refuse a sticky directory its maker owns. The real path, as it is checked with lstat (/tmp is a
    link on macOS)."""
    configured = os.environ.get(LEASE_DIR_ENV)
    if configured:
        return configured
    return os.path.realpath("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")


class LeaseDir:
    """The machine-wide lease directory, checked when opened."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[str] = []  # lease files the last live() skipped, one line each

    @classmethod
    def open(cls, path: Optional[Any] = None) -> LeaseDir:
        """The directory (created with mode 1777 when missing), or LeaseDirProblem."""
        path = os.fspath(path) if path is not None else default_dir()
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise LeaseDirProblem(f"cannot create the lease directory {path}: {exc.strerror}; {OFF}") from None
        else:  # mode 1777, set after mkdir (the umask would strip it)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fchmod(fd, 0o1777)
            finally:
                os.close(fd)
        problem = lease_io.directory_problem(path)
        if problem:
            raise LeaseDirProblem(f"{problem}; {OFF}")
        return cls(path)

    def live(self) -> list[Lease]:
        """Every live lease, by (gpu_index, since). Stale ones are skipped (removed when ours, or we
        are root); files that cannot be leases are skipped with a line in `problems`."""
        self.problems = []
        try:
            names = os.listdir(self.path)
        except OSError as exc:
            raise LeaseDirProblem(f"cannot list the lease directory {self.path}: {exc.strerror}; {OFF}") from None
        found = []
        for name in names:  # other programs' files (the directory may be /dev/shm) are never looked at
            if name.startswith(lease_io.TMP_PREFIX):
                self._remove_if_abandoned(name)
            elif name.startswith(PREFIX) and name.endswith(SUFFIX):
                lease = self._read(name)
                if lease is not None:
                    found.append(lease)
        return sorted(found, key=lambda lease: (lease.gpu_index, lease.since, lease.file))

    @contextmanager
    def placing(self, uuids: Iterable[str], timeout: float = PLACING_TIMEOUT) -> Iterator[None]:
        """A context holding the placing locks of these GPUs (taken in the order of their file names, so
        that two parties never wait for each other); LeaseDirProblem when one is held past `timeout` s."""
        deadline = time.monotonic() + timeout
        fds: list[int] = []
        try:
            for uuid in sorted(set(uuids), key=lease_io.safe_name):
                fds.append(self._lock(uuid, deadline, timeout))
            yield
        finally:
            for fd in fds:
                os.close(fd)  # drops the lock

    def _lock(self, uuid: str, deadline: float, timeout: float) -> int:
        """The GPU's placing lock, taken by the returned descriptor. The file may be removed and made
        anew while we wait, and a lock on the old one excludes nobody: then the new one is locked."""
        path = lease_io.lock_path(self.path, uuid)
        while True:
            fd = lease_io.lock_file(self.path, uuid)
            try:
                while not fsutil.try_flock(fd):
                    if time.monotonic() > deadline:
                        raise LeaseDirProblem(
                            f"the placing lock of GPU {display(uuid)} in {self.path} has been held for more "
                            f"than {timeout:g} s (a stuck or hostile process?); {OFF}"
                        )
                    time.sleep(_POLL_SECONDS)
            except BaseException:
                os.close(fd)
                raise
            if fsutil.same_inode(fd, path):  # lstat: a link put there is not it
                return fd
            os.close(fd)
            if time.monotonic() > deadline:
                raise LeaseDirProblem(f"placing lock {display(path)} keeps being replaced; {OFF}")

    def take(
        self,
        gpu_uuid: str,
        gpu_index: int,
        mem_mib: Optional[int],
        *,
        job: Optional[int],
        name: str,
        spool: Optional[str],
        pid: Optional[int] = None,
    ) -> Held:
        """Write a lease of this GPU, locked by this process, under `placing` (`pid`: the holder named)."""
        pid = os.getpid() if pid is None else pid
        uid = os.geteuid()
        n = lease_io.next_number()
        final = os.path.join(self.path, f"{PREFIX}{lease_io.safe_name(gpu_uuid)}.{uid}.{pid}.{n}{SUFFIX}")
        record: dict[str, Any] = {
            "lease_version": lease_io.LEASE_VERSION,
            "gpu_uuid": gpu_uuid,
            "gpu_index": gpu_index,
            "mem_mib": mem_mib,
            "user": lease_io.user_name(uid) or str(uid),
            "uid": uid,
            "pid": pid,
            "pid_start": procs.create_time(pid) or 0.0,
            "job": job,
            "name": name,
            "spool": spool,
            "since": time.time(),
            "host": os.uname().nodename,
        }
        data = (json.dumps(record) + "\n").encode()
        fd = lease_io.write_locked(self.path, f"{lease_io.TMP_PREFIX}{uid}.{pid}.{n}", data, final)
        return Held(Lease(os.path.basename(final), **{k: record[k] for k in Lease._fields[1:]}), fd, final)

    def _read(self, name: str) -> Optional[Lease]:
        """The lease in `name` if it is alive and sound (unsound: a line in `problems`)."""
        path = os.path.join(self.path, name)
        try:
            fd = os.open(path, lease_io.OPEN_READ)
        except FileNotFoundError:  # released since the listing
            return None
        except OSError as exc:
            return self._skip(name, lease_io.link_error(exc))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return self._skip(name, "is not a regular file")
            if not lease_io.locked_by_someone(fd):
                lease_io.remove_if_ours(path, st)
                return None
            data = os.read(fd, lease_io.MAX_LEASE_BYTES + 1)
        finally:
            os.close(fd)
        try:
            lease = Lease(name, **lease_io.parse(data))
        except ValueError as exc:
            return self._skip(name, str(exc))
        if lease.uid != st.st_uid:
            return self._skip(name, f"names uid {lease.uid} but is owned by uid {st.st_uid}")
        return lease._replace(user=lease_io.user_name(lease.uid) or display(lease.user))

    def _skip(self, name: str, why: str) -> Optional[Lease]:
        """None, with a line in `problems` saying why the file is no lease."""
        self.problems.append(f"lease file {os.path.join(self.path, display(name))} {why}: ignored")
        return None

    def _remove_if_abandoned(self, name: str) -> None:
        """A writer's temporary file, left by one that died before renaming it: removed once old
        and unlocked (a live writer locks it as soon as it exists and renames it within ms)."""
        path = os.path.join(self.path, name)
        try:
            fd = os.open(path, lease_io.OPEN_READ)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            old = time.time() - st.st_mtime > STALE_TMP_SECONDS
            if old and stat.S_ISREG(st.st_mode) and not lease_io.locked_by_someone(fd):
                lease_io.remove_if_ours(path, st)
        finally:
            os.close(fd)


_said: set[str] = set()


def say_once(problem: str, write: Callable[[str], None]) -> None:
    """`write(problem)` the first time this process meets this line; later meetings say nothing."""
    if problem not in _said:
        _said.add(problem)
        write(problem)
