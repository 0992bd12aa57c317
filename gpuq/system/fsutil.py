"""Low-level file primitives the spool is built from (fsync, no-clobber rename, flock probes), kept
apart so that gpuq.spool reads as the protocol, not as system calls."""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from contextlib import suppress
from functools import cache
from typing import Any, Optional, Union

StrPath = Union[str, os.PathLike[str]]  # a path: the spool's are strings (spool/layout.py)


@cache
def rename_binding() -> tuple[Any, Any]:
    """(ctypes, the C library) for no-clobber renames, loaded at the first call: the reading
    commands never need it. A supervisor loads it while its job runs (Claims.ready), so that
    handing the slot on, whose claim is a rename, does not wait for the import."""
    import ctypes  # the C library's binding, at the first rename or a supervisor's start

    return ctypes, ctypes.CDLL(None, use_errno=True)


def fsync_dir(path: StrPath) -> None:
    """Make a directory entry change (create, rename, unlink) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new_file(path: StrPath, data: bytes, durable: bool = True) -> os.stat_result:
    """Create `path` (must not exist), write `data` fully and (if `durable`) fsync it; the stat of
    the file as written (a rename keeps its inode, mtime and size). On ENOSPC or any other error
    the partial file is removed, so nothing half-written remains."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        return _write_whole(fd, data, durable)
    except BaseException:
        unlink_quietly(path)
        raise
    finally:
        os.close(fd)


def _write_whole(fd: int, data: bytes, durable: bool) -> os.stat_result:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    if durable:
        os.fsync(fd)
    return os.fstat(fd)


# Linux can give a new file its name without a second name at any moment, and without ctypes (which
# the no-clobber rename needs); cleared at the first refusal, so a filesystem without it costs one try.
_unnamed_files = sys.platform.startswith("linux") and hasattr(os, "O_TMPFILE")


def create_unnamed_first(path: str, data: bytes) -> Optional[os.stat_result]:
    """Create `path` with `data`, durably; FileExistsError if it exists. An unnamed file (O_TMPFILE)
    in its directory, written and fsynced, then named by linkat of /proc/self/fd/N: nobody sees it
    half-written or with two links (security.py refuses a job file with two), and a crash leaves
    no name behind. None where this cannot be done here: the caller renames a tmp/ file instead."""
    global _unnamed_files
    if not _unnamed_files:
        return None
    try:
        fd = os.open(os.path.dirname(path) or ".", os.O_TMPFILE | os.O_WRONLY, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
        _unnamed_files = False
        return None
    try:
        written = _write_whole(fd, data, durable=True)
        if not _link_unnamed(fd, path):
            _unnamed_files = False
            return None
    finally:
        os.close(fd)  # an unnamed file that got no name is freed here
    return written


def _link_unnamed(fd: int, path: str) -> bool:
    """linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/FD to `path` (os.link uses linkat only when given
    a directory descriptor). False where refused (no /proc, a kernel or filesystem that will not)."""
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.link(f"/proc/self/fd/{fd}", os.path.basename(path), dst_dir_fd=directory)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOSPC, errno.EDQUOT):
            raise
        return False
    finally:
        os.close(directory)
    return True


def unlink_quietly(path: StrPath) -> None:
    with suppress(OSError):
        os.unlink(path)


def rename_noreplace(src: StrPath, dst: StrPath) -> None:
    """Atomically rename src to dst; FileExistsError if dst exists (os.rename would replace it).
    renameat2(RENAME_NOREPLACE) on Linux, renamex_np(RENAME_EXCL) on macOS; else (old kernels, some
    network filesystems) link + unlink, also no-clobber but briefly showing two links."""
    ctypes, libc = rename_binding()
    renameat2 = getattr(libc, "renameat2", None) if sys.platform.startswith("linux") else None
    if renameat2 is not None or sys.platform == "darwin":
        if renameat2 is not None:
            at_fdcwd, noreplace = -100, 1
            failed = renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), noreplace) != 0
        else:
            rename_excl = 0x4
            failed = libc.renamex_np(os.fsencode(src), os.fsencode(dst), rename_excl) != 0
        if not failed:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), str(dst))
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(src))
    os.link(src, dst)
    os.unlink(src)


def try_flock(fd: int, exclusive: bool = True) -> bool:
    """Take an flock without blocking; False if another open file description holds it."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def open_existing(path: StrPath, flags: int = os.O_RDONLY) -> Optional[int]:
    """Open a file without following symlinks; None if it does not exist."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None


def same_inode(fd: int, path: StrPath) -> bool:
    """True while `path` still names the file open on `fd` (nobody replaced or removed it)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    fst = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (fst.st_ino, fst.st_dev)


# Filesystems whose files other machines share: flocks and renames there are only as good as the
# server's locking, and two hosts' claims may not exclude each other.
NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "glusterfs", "fuse.glusterfs", "ceph"}
    | {"fuse.ceph", "fuse.sshfs", "afs", "pvfs2", "orangefs", "gfs2", "ocfs2", "9p", "fuse.beegfs"}
)


def mounts(mountinfo: Optional[str] = None) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of each mount in /proc/self/mountinfo (or the text
    `mountinfo`), the visible one of equal mount points last; [] where there is none (macOS)."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
                mountinfo = f.read()
        except OSError:
            return []
    out = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if sep and len(fields) >= 5 and tail.split():
            out.append((_unescape_mount(fields[4]), tail.split()[0]))
    return out


def network_filesystem(path: StrPath, mountinfo: Optional[str] = None) -> Optional[str]:
    """The type of the network filesystem `path` lives on (`nfs4`, `lustre`...), or None for a local
    one or where that cannot be told (macOS)."""
    target = os.path.realpath(path)
    best, fstype = "", None
    for point, kind in mounts(mountinfo):
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, kind
    return fstype if fstype in NETWORK_FILESYSTEMS else None


def _unescape_mount(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (`\\040`)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text
