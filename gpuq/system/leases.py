"""GPU leases: who is using which GPU of this machine, in a sticky directory every user's gpuq
reads (the protocol: lease_layout.md). A lease is alive exactly while its holder keeps an flock on
its file, so a crashed holder's lease is stale the moment the kernel drops the lock. Nothing here
trusts the directory's other users: files are opened without following links and must be owned by
the uid they name; what cannot be trusted raises LeaseDirProblem, said once (`say_once`)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from contextlib import contextmanager, suppress
from typing import Any, Callable, Collection, Iterable, Iterator, NamedTuple, Optional, Sequence

from gpuq.system import fsutil, lease_io, procs
from gpuq.system.lease_io import OFF, LeaseDirProblem
from gpuq.system.security import display

LEASE_DIR_ENV = "GPUQ_LEASE_DIR"
PLACING_TIMEOUT = 2.0  # seconds: a placement takes milliseconds; a lock held longer is stuck or hostile
PREFIX, SUFFIX = "gpuq-lease.", ".lease"  # a lease's name: PREFIX<UUID>.<uid>.<pid>.<n>SUFFIX
TICKET_PREFIX, TICKET_SUFFIX = "gpuq-ticket.", ".ticket"  # TICKET_PREFIX<uid>.<pid>.<n>TICKET_SUFFIX
USAGE_PREFIX = "gpuq-usage."  # a user's recent GPU-hours: USAGE_PREFIX<uid>
USAGE_FIELDS = ("uid", "gpu_hours", "at")
HALF_LIFE_SECONDS = 7 * 86400.0  # recent usage halves every week unless the machine's policy says otherwise
STALE_TMP_SECONDS = 60.0  # a writer's temporary file older than this, unlocked, was left by a crash


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
    name: str  # a `gpuq lease` command's first word; "" for a job (its name is its owner's)
    spool: Optional[str]  # the job's spool_id
    since: float
    host: str

    @property
    def whole(self) -> bool:
        return self.mem_mib is None

    def who(self, viewer_uid: int, viewer_spool: Collection[str] = ()) -> str:
        """ "bob's job #12", "your job #3", "bob's `jupyter` (gpuq lease, pid 4242)". A job of yours in
        another spool than the viewer's (its `spool_ids`; none: the viewer is in none) says so: its #3
        is not the viewer's."""
        mine = self.uid == viewer_uid
        owner = "your" if mine else f"{self.user}'s"
        if self.job is None:
            return f"{owner} `{self.name}` (gpuq lease, pid {self.pid})"
        return f"{owner} job #{self.job}{elsewhere(self.spool, viewer_spool) if mine else ''}"


class Ticket(NamedTuple):
    """One live waiting ticket: a job that waits for GPUs another user holds (lease_layout.md section 7)."""

    file: str
    user: str
    uid: int
    pid: int
    job: Optional[int]
    spool: Optional[str]  # the job's spool_id
    gpus: int  # how many GPUs it needs
    mem_mib: Optional[int]  # None: whole GPUs
    gpu_uuids: Optional[tuple[str, ...]]  # the GPUs it may use (None: any)
    since: float
    host: str

    def wants(self, gpu_uuid: str) -> bool:
        return self.gpu_uuids is None or gpu_uuid in self.gpu_uuids

    def who(self, viewer_uid: int, viewer_spool: Collection[str] = ()) -> str:
        """ "bob's job #3", "your job #7", "your job #7 in another queue": whose job waits."""
        mine = self.uid == viewer_uid
        owner = "your" if mine else f"{self.user}'s"
        if self.job is None:
            return f"{owner} `gpuq lease`"
        return f"{owner} job #{self.job}{elsewhere(self.spool, viewer_spool) if mine else ''}"


def elsewhere(spool: Optional[str], viewer_spool: Collection[str]) -> str:
    """' in another queue' for a job of the viewer's in a spool other than theirs (spool_ids), else ''."""
    return "" if spool is not None and spool in viewer_spool else " in another queue"


def spool_id(spool: Optional[str]) -> Optional[str]:
    """How a lease or ticket names a spool: its random id (spool/leaseid.py) is kept, as is None; a path
    (an earlier gpuq's lease) is hashed as an earlier gpuq named it, by its real path."""
    if spool is None or not spool.startswith("/"):
        return spool
    return hashlib.sha256(os.path.realpath(spool).encode()).hexdigest()[:16]


def spool_ids(home: str, own: Optional[str]) -> tuple[str, ...]:
    """Every id by which leases name the spool at `home`: its own (`own`; None while none is made) and
    the hash of its real path, by which an earlier gpuq named it (its jobs may run on)."""
    legacy = spool_id(os.path.abspath(home)) or ""
    return (own, legacy) if own else (legacy,)


class Held:
    """A lease this process holds: its lock lives in `fd` until `release()` (or the process's end)."""

    __slots__ = ("lease", "fd", "path", "share")

    def __init__(self, lease: Lease, fd: int, path: str) -> None:
        self.lease, self.path = lease, path
        self.fd: Optional[int] = fd
        self.share = 1.0  # the part of its GPU it holds: a --gpu-mem share's MiB over the GPU's memory

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


class HeldTicket(Held):
    """A waiting ticket this process holds alive until `release()`."""

    __slots__ = ("ticket",)

    def __init__(self, ticket: Ticket, fd: int, path: str) -> None:
        self.ticket, self.path = ticket, path
        self.fd = fd


def decayed(gpu_hours: float, at: float, now: float, half_life: float) -> float:
    """GPU-hours recorded at `at`, as they count at `now`: halved every `half_life` seconds."""
    return gpu_hours * 0.5 ** (max(0.0, now - at) / half_life) if half_life > 0 else gpu_hours


def default_dir() -> str:
    """$GPUQ_LEASE_DIR if set; else /dev/shm itself, else /tmp, by its real path (lease_layout.md
    section 1 says why no directory of gpuq's own)."""
    return os.environ.get(LEASE_DIR_ENV) or os.path.realpath("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")


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
        are root); files that cannot be leases, and placing locks we cannot open (no lease of ours
        can be taken there), are skipped with a line in `problems`."""
        self.problems = []
        found = []
        for name in self._names():  # other programs' files (the directory may be /dev/shm) are never looked at
            if name.startswith(lease_io.TMP_PREFIX):
                self._remove_if_abandoned(name)
            elif name.startswith(lease_io.LOCK_PREFIX):
                try:
                    os.close(lease_io.open_lock(os.path.join(self.path, name)))
                except FileNotFoundError:  # removed since the listing
                    pass
                except LeaseDirProblem as exc:
                    self.problems.append(str(exc))
            elif name.startswith(PREFIX) and name.endswith(SUFFIX):
                fields = self._record(name, "lease", Lease._fields[1:])
                if fields is not None:
                    found.append(Lease(name, **fields))
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
                if not lease_io.wait_flock(fd, deadline):
                    raise LeaseDirProblem(
                        f"the placing lock of GPU {display(uuid)} in {self.path} has been held for more "
                        f"than {timeout:g} s (a stuck or hostile process?); {OFF}"
                    )
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
        """Write a lease of this GPU, locked by this process, under `placing`: a job's by its id and
        spool_id, as its name and spool's path are its owner's. `pid`: the process whose tree uses
        the GPU when it is not this one's (an adopted job's, lease_layout.md)."""
        me, uid, n = os.getpid(), os.geteuid(), lease_io.next_number()
        pid = me if pid is None else pid
        lease = Lease(
            file=f"{PREFIX}{lease_io.safe_name(gpu_uuid)}.{uid}.{me}.{n}{SUFFIX}",
            gpu_uuid=gpu_uuid,
            gpu_index=gpu_index,
            mem_mib=mem_mib,
            user=lease_io.user_name(uid) or str(uid),
            uid=uid,
            pid=pid,
            pid_start=procs.create_time(pid) or 0.0,
            job=job,
            name=name if job is None else "",
            spool=spool_id(spool),
            since=time.time(),
            host=os.uname().nodename,
        )
        return Held(lease, *self._write(lease, "lease"))

    def post_ticket(
        self,
        *,
        job: Optional[int],
        spool: Optional[str],
        gpus: int,
        mem_mib: Optional[int],
        gpu_uuids: Optional[Iterable[str]],
        since: Optional[float] = None,
    ) -> HeldTicket:
        """A waiting ticket, alive while this process holds it (no placing lock: it decides nothing)."""
        pid, uid, n = os.getpid(), os.geteuid(), lease_io.next_number()
        ticket = Ticket(
            file=f"{TICKET_PREFIX}{uid}.{pid}.{n}{TICKET_SUFFIX}",
            user=lease_io.user_name(uid) or str(uid),
            uid=uid,
            pid=pid,
            job=job,
            spool=spool_id(spool),
            gpus=gpus,
            mem_mib=mem_mib,
            gpu_uuids=None if gpu_uuids is None else tuple(sorted(gpu_uuids)),
            since=time.time() if since is None else since,
            host=os.uname().nodename,
        )
        return HeldTicket(ticket, *self._write(ticket, "ticket"))

    def _write(self, record: Any, kind: str) -> tuple[int, str]:
        """A Lease's or a Ticket's line written to its file: the descriptor that locks it, and its path."""
        line = {f"{kind}_version": lease_io.LEASE_VERSION, **record._asdict()}
        del line["file"]
        final = os.path.join(self.path, record.file)
        return lease_io.write_locked(self.path, (json.dumps(line) + "\n").encode(), final), final

    def tickets(self) -> list[Ticket]:
        """Every live waiting ticket, oldest first; unsound ones are skipped with a line in `problems`
        (which this call adds to, after `live()`'s), and those whose holder is stopped (Ctrl-Z,
        SIGSTOP), which takes no turn, are passed over."""
        found = []
        for name in self._names():
            if name.startswith(TICKET_PREFIX) and name.endswith(TICKET_SUFFIX):
                fields = self._record(name, "ticket", Ticket._fields[1:])
                if fields is not None and not procs.stopped(fields["pid"]):
                    found.append(Ticket(name, **fields))
        return sorted(found, key=lambda t: (t.since, t.file))

    def usage(
        self, uids: Iterable[int], now: Optional[float] = None, half_life: float = HALF_LIFE_SECONDS
    ) -> dict[int, float]:
        """Each user's recent GPU-hours on this machine, decayed to `now` (0 for one without a sound record)."""
        now = time.time() if now is None else now
        out = {}
        for uid in set(uids):
            record = self._record(f"{USAGE_PREFIX}{uid}", "usage", USAGE_FIELDS, uid)
            out[uid] = 0.0 if record is None else decayed(record["gpu_hours"], record["at"], now, half_life)
        return out

    def add_usage(self, gpu_hours: float, now: Optional[float] = None, half_life: float = HALF_LIFE_SECONDS) -> None:
        """Add GPU-hours to this user's record (decayed to `now`). Its writers take turns on its flock,
        and each replaces it whole, so a reader never sees half of one."""
        now = time.time() if now is None else now
        uid = os.geteuid()
        path = os.path.join(self.path, f"{USAGE_PREFIX}{uid}")
        deadline = time.monotonic() + PLACING_TIMEOUT
        while True:
            try:
                fd = os.open(path, lease_io.OPEN_READ)
            except FileNotFoundError:
                fd = -1
            except OSError as exc:
                raise LeaseDirProblem(f"usage record {display(path)} {lease_io.link_error(exc)}") from None
            try:
                if fd >= 0 and not self._lock_usage(fd, path, uid, deadline):
                    continue  # replaced while we waited: the new one is locked instead
                old = 0.0
                with suppress(ValueError):  # a record we cannot read starts again from nothing
                    if fd >= 0:
                        record = lease_io.parse(os.read(fd, lease_io.MAX_LEASE_BYTES + 1), "usage", USAGE_FIELDS)
                        old = decayed(record["gpu_hours"], record["at"], now, half_life)
                line = {"usage_version": lease_io.LEASE_VERSION, "uid": uid, "gpu_hours": old + gpu_hours, "at": now}
                os.close(lease_io.write_locked(self.path, (json.dumps(line) + "\n").encode(), path))
                return
            finally:
                if fd >= 0:
                    os.close(fd)

    def _lock_usage(self, fd: int, path: str, uid: int, deadline: float) -> bool:
        """Whether the record open on `fd` is ours, locked, and still the one at `path`."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            raise LeaseDirProblem(f"usage record {display(path)} is not a regular file of uid {uid}")
        if not lease_io.wait_flock(fd, deadline):
            raise LeaseDirProblem(f"usage record {display(path)} has been locked too long")
        return fsutil.same_inode(fd, path)

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.path)
        except OSError as exc:
            raise LeaseDirProblem(f"cannot list the lease directory {self.path}: {exc.strerror}; {OFF}") from None

    def _record(
        self, name: str, kind: str, fields: Sequence[str], uid: Optional[int] = None
    ) -> Optional[dict[str, Any]]:
        """The fields of a live, sound lease or ticket in `name`, or (`uid` given) of that user's usage
        record, which no lock keeps alive; None for a stale or gone file, and for an unsound one with
        a line in `problems`."""
        found = self._alive(name, locked=uid is None, kind=kind)
        if found is None:
            return None
        data, owner = found
        try:
            record = lease_io.parse(data, kind, fields)
        except ValueError as exc:
            self._skip(name, str(exc), kind)
            return None
        if record["uid"] != owner or (uid is not None and owner != uid):
            self._skip(name, f"names uid {record['uid']} but is owned by uid {owner}", kind)
            return None
        if "user" in record:
            record["user"] = lease_io.user_name(record["uid"]) or display(record["user"])
        if "spool" in record:  # an earlier gpuq wrote the path; another user's spool is never ours
            record["spool"] = spool_id(record["spool"]) if owner == os.geteuid() else None
        return record

    def _alive(self, name: str, locked: bool, kind: str) -> Optional[tuple[bytes, int]]:
        """The content of the file `name` and its owner, if it is a regular file and (`locked`) held
        alive by its writer's lock; a stale one is removed when ours (or we are root)."""
        path = os.path.join(self.path, name)
        try:
            fd = os.open(path, lease_io.OPEN_READ)
        except FileNotFoundError:  # released since the listing
            return None
        except OSError as exc:
            self._skip(name, lease_io.link_error(exc), kind)
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._skip(name, "is not a regular file", kind)
                return None
            if locked and not lease_io.locked_by_someone(fd):
                lease_io.remove_if_ours(path, st)
                return None
            return os.read(fd, lease_io.MAX_LEASE_BYTES + 1), st.st_uid
        finally:
            os.close(fd)

    def _skip(self, name: str, why: str, kind: str) -> None:
        """A line in `problems` saying why the file is no lease (ticket, usage record)."""
        self.problems.append(f"{kind} file {os.path.join(self.path, display(name))} {why}: ignored")

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
