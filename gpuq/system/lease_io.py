"""The file-level pieces of the lease protocol (lease_layout.md), kept apart so that
gpuq/system/leases.py reads as the API alone."""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import pwd
import stat
import time
from contextlib import suppress
from typing import Any, Callable, Optional, Sequence

from gpuq.core.job import is_int, is_number
from gpuq.system.fsutil import try_flock, unlink_quietly
from gpuq.system.security import display

LEASE_VERSION = 1
MAX_LEASE_BYTES = 4096  # a lease is one short line; a larger file is not one
OFF = "leases are off, the GPU memory gate alone decides"
LOCK_PREFIX = "gpuq-lock."  # a GPU's placing lock: LOCK_PREFIX<UUID>
TMP_PREFIX = ".gpuq-tmp."  # a file being written: TMP_PREFIX<uid>.<pid>.<n>; the only names ever cleaned up
OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # never a link; a FIFO never blocks
POLL_SECONDS = 0.005  # how often a wait for a lock tries it again
OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# The largest a file's whole numbers (pid, job, GPU index, MiB, GPU count) and its times (seconds
# since the epoch: the year 2286) or GPU-hours may be: larger is no real one, and would overflow the
# system calls and time formatting it reaches (another user's `since: 1e300` stopped every gpuq).
MAX_INT = 2**31 - 1
MAX_REAL = 1e10


class LeaseDirProblem(Exception):
    """The lease directory cannot be trusted or used; str(exc) is the one line to show."""


def link_error(exc: OSError) -> str:
    """What an open without following links says of the file it failed on."""
    return "is a symbolic link" if exc.errno in (errno.ELOOP, errno.EMLINK) else f"cannot be opened: {exc.strerror}"


def tmp_path(directory: str) -> str:
    """A name for a file being written, never used twice by live processes."""
    return os.path.join(directory, f"{TMP_PREFIX}{os.geteuid()}.{os.getpid()}.{next_number()}")


def write_locked(directory: str, data: bytes, final: str) -> int:
    """A new file at `final` holding `data`, readable by all, locked by the returned descriptor
    before the name appears."""
    tmp = tmp_path(directory)
    fd = -1
    try:
        fd = os.open(tmp, OPEN_NEW, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.fchmod(fd, 0o644)  # readable by every user whatever our umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.rename(tmp, final)
    except OSError as exc:
        if fd >= 0:  # else the name may be another writer's
            os.close(fd)
            unlink_quietly(tmp)
        raise LeaseDirProblem(f"cannot write a lease in {directory}: {exc.strerror}; {OFF}") from None
    return fd


def lock_path(directory: str, uuid: str) -> str:
    return os.path.join(directory, f"{LOCK_PREFIX}{safe_name(uuid)}")


def lock_file(directory: str, uuid: str) -> int:
    """A descriptor of the GPU's placing lock file (`gpuq-lock.<UUID>`), created readable by all if
    missing. Read-only is enough for flock, and works on a lock file another user created."""
    path = lock_path(directory, uuid)
    for _ in range(10):  # a lock file created or removed between our two calls: look again
        try:
            return open_lock(path)
        except FileNotFoundError:
            _create_lock_file(directory, path)
    raise LeaseDirProblem(f"placing lock {display(path)} keeps disappearing; {OFF}")


def open_lock(path: str) -> int:
    """A descriptor of the placing lock file at `path`; FileNotFoundError when there is none,
    LeaseDirProblem when it cannot serve (its owner may `chmod 000` it: then no other user can lock it)."""
    try:
        fd = os.open(path, OPEN_READ)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise LeaseDirProblem(f"placing lock {display(path)} {link_error(exc)}; {OFF}") from None
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    raise LeaseDirProblem(f"placing lock {display(path)} is not a regular file; {OFF}")


def _create_lock_file(directory: str, path: str) -> None:
    """Made aside with its mode set, then linked into place, so that no one sees it unreadable."""
    tmp = tmp_path(directory)
    try:
        fd = os.open(tmp, OPEN_NEW, 0o644)
        try:
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        os.link(tmp, path)
    except FileExistsError:  # another party made it first: theirs serves
        pass
    except OSError as exc:
        raise LeaseDirProblem(f"cannot create a placing lock in {directory}: {exc.strerror}; {OFF}") from None
    finally:
        unlink_quietly(tmp)


def remove_if_ours(path: str, st: os.stat_result) -> None:
    """A stale file goes when it is ours (or we are root): the sticky bit lets no one else."""
    if os.geteuid() not in (0, st.st_uid):
        return
    with suppress(OSError):
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):  # still the file found stale
            os.unlink(path)


def directory_problem(path: str) -> Optional[str]:
    """Why the lease directory cannot be trusted, or None. lstat: a link is never followed."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"lease directory {path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return (
            f"lease directory {path} is a symbolic link (to {display(os.path.realpath(path))}); gpuq does not follow it"
        )
    if not stat.S_ISDIR(st.st_mode):
        return f"lease directory {path} is not a directory"
    me = os.geteuid()
    if st.st_uid not in (0, me):
        owner = user_name(st.st_uid) or f"uid {st.st_uid}"
        return f"lease directory {path} is owned by {owner}, not by root or you: its owner could remove your leases"
    if not st.st_mode & stat.S_ISVTX:
        mode = stat.S_IMODE(st.st_mode)
        return f"lease directory {path} is not sticky (mode {mode:04o}): other users could remove your leases"
    return None


def _whole(value: Any, low: int) -> bool:
    return is_int(value) and low <= value <= MAX_INT


def _real(value: Any) -> bool:
    return is_number(value) and 0 <= value <= MAX_REAL


# Each field's check, for a lease, a ticket and a usage record alike (lease_layout.md sections 3, 7, 8).
CHECKS: dict[str, Callable[[Any], bool]] = {
    "gpu_uuid": lambda v: isinstance(v, str) and v != "",
    "gpu_index": lambda v: _whole(v, 0),
    "mem_mib": lambda v: v is None or _whole(v, 1),  # None: the whole GPU
    "user": lambda v: isinstance(v, str),
    "uid": lambda v: is_int(v) and v >= 0,
    "pid": lambda v: _whole(v, 1),
    "pid_start": _real,
    "job": lambda v: v is None or _whole(v, 1),
    "name": lambda v: isinstance(v, str),
    "spool": lambda v: v is None or isinstance(v, str),
    "gpus": lambda v: _whole(v, 1),
    "gpu_uuids": lambda v: v is None or isinstance(v, list) and all(isinstance(u, str) for u in v),
    "since": _real,
    "host": lambda v: isinstance(v, str),
    "gpu_hours": _real,
    "at": _real,
}


def parse(data: bytes, kind: str, fields: Sequence[str]) -> dict[str, Any]:
    """The `fields` of a line of this `kind` ("lease", "ticket", "usage"); ValueError naming what is wrong."""
    version_key = f"{kind}_version"
    if len(data) > MAX_LEASE_BYTES:
        raise ValueError(f"is larger than {MAX_LEASE_BYTES} bytes")
    try:
        obj = json.loads(data)
    except ValueError:  # json.JSONDecodeError, and undecodable bytes
        raise ValueError("is not JSON") from None
    if not isinstance(obj, dict):
        raise ValueError("is not a JSON object")
    if obj.get(version_key) != LEASE_VERSION:
        raise ValueError(f"has {version_key} {display(repr(obj.get(version_key)))}, not {LEASE_VERSION}")
    for key in fields:
        if key not in obj:
            raise ValueError(f"lacks {key}")
        if not CHECKS[key](obj[key]):
            raise ValueError(f"has a bad {key}")
    values = {key: obj[key] for key in fields}
    if "name" in values:
        values["name"] = display(values["name"])  # another user's text, printed in our reasons
    if values.get("gpu_uuids") is not None:
        values["gpu_uuids"] = tuple(values["gpu_uuids"])
    return values


def wait_flock(fd: int, deadline: float) -> bool:
    """Take `flock(LOCK_EX)` on `fd`, polling until `deadline` (time.monotonic()); False when it passed."""
    while not try_flock(fd):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True


def locked_by_someone(fd: int) -> bool:
    """Whether another open file holds an exclusive lock on this file (its holder is alive)."""
    if try_flock(fd, exclusive=False):
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    return True


def safe_name(uuid: str) -> str:
    """A GPU's UUID as a file name part: letters, digits and dashes kept, anything else `_`."""
    return "".join(c if c.isascii() and (c.isalnum() or c == "-") else "_" for c in uuid)


next_number = itertools.count(1).__next__  # tells apart the files one process writes


_user_names: dict[int, tuple[Optional[str], float]] = {}  # uid -> (name, when asked)
USER_NAME_KEPT = 60.0  # seconds: a worker lives for months, and a deleted user's uid is given out again


def user_name(uid: int) -> Optional[str]:
    """The account name of `uid` as this machine knows it (asked at most once a minute per uid:
    NSS may be LDAP)."""
    kept = _user_names.get(uid)
    now = time.monotonic()
    if kept is None or now - kept[1] > USER_NAME_KEPT:
        try:
            kept = (pwd.getpwuid(uid).pw_name, now)
        except KeyError:
            kept = (None, now)
        _user_names[uid] = kept
    return kept[0]
