"""How the spool writes and reads files. Every file is written complete in tmp/ and then renamed
into place, so a reader never sees half a file; a write that fails for lack of space raises
SpoolFull, its temporary file removed.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from contextlib import suppress
from typing import Any, Callable, Optional, TypeVar, Union

from gpuq.core.schema import InvalidJob
from gpuq.spool.errors import SpoolFull, full_or
from gpuq.spool.layout import Layout
from gpuq.system import fsutil, procs, security

T = TypeVar("T")
StrPath = Union[str, os.PathLike[str]]

STALE_TMP_SECONDS = 600.0
MIN_FREE_TO_START = 1 << 20  # bytes the spool's filesystem needs before a job is started
RESERVE_BYTES = 256 * 1024  # the spool's emergency room: given up so a write can go through on a full disk
RESERVE_FLOOR = 32 * 1024  # the least emergency room worth keeping: a claim and a job file, with blocks to spare


class Files:
    """Atomic writes into one spool. `durable=False` skips the fsyncs, for derived data that is
    cheaper to rebuild than to sync (caches, progress samples)."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self._counter = 0

    def tmp_path(self, kind: str) -> StrPath:
        """A fresh hidden name in tmp/ that says who wrote it (for clean_tmp)."""
        self._counter += 1
        return os.path.join(self.layout.tmp_dir(), f".{kind}-{os.getpid()}-{self._counter}-{os.urandom(4).hex()}")

    def _write_tmp(self, data: bytes, kind: str, durable: bool = True) -> StrPath:
        path = self.tmp_path(kind)
        try:
            fsutil.write_new_file(path, data, durable=durable)
        except OSError as exc:
            raise full_or(self.layout.home, exc) from None
        return path

    def keep_emergency_room(self) -> None:
        """Keep the spool's emergency room (the file `reserve`), as big as emergency_room_size
        allows; one stat while it is full size (`gpuq add` calls it every time)."""
        path = self.layout.top_file("reserve")
        try:
            have = os.stat(path, follow_symlinks=False).st_size
        except OSError:
            have = 0
        if have >= RESERVE_BYTES:
            return
        size = emergency_room_size(free_bytes(self.layout.home))
        if size == 0 or (size < RESERVE_BYTES and size < 2 * have):
            return  # none fits, or too little more than there is to be worth rewriting
        with suppress(OSError):  # the disk filled up meanwhile: next time
            self.replace(path, bytes(size), "reserve")

    def with_room(self, write: Callable[[], T]) -> T:
        """Run `write`; on a full disk, give up the emergency room and run it once more. For what a
        person needs on a full disk (cancel, kill, retry) and how jobs ended: never for new jobs,
        which would only fill the room up."""
        try:
            return write()
        except SpoolFull:
            if not self.give_up_emergency_room():
                raise
            written = write()
            self.keep_emergency_room()  # the next person's action on this full disk needs room too
            return written

    def give_up_emergency_room(self) -> bool:
        return unlink_quietly(self.layout.top_file("reserve"))

    def replace(self, target: StrPath, data: bytes, kind: str, durable: bool = True, sync_dir: bool = True) -> None:
        """Atomically make `target` hold `data`. `sync_dir=False`: the directory is not fsynced, so
        after a power cut `target` holds the new data or the old, for a caller with another synced
        copy (ids.py)."""
        _rename_or_drop(self._write_tmp(data, kind, durable), target, replace=True)
        if durable and sync_dir:
            fsutil.fsync_dir(os.path.dirname(target))

    def place_new(self, target: StrPath, data: bytes, kind: str) -> None:
        """Atomically create `target` with `data`, durably; FileExistsError if it exists."""
        try:
            written = fsutil.create_unnamed_first(str(target), data)
        except OSError as exc:
            raise full_or(self.layout.home, exc) from None
        if written is None:
            _rename_or_drop(self._write_tmp(data, kind), target, replace=False)
        fsutil.fsync_dir(os.path.dirname(target))

    def clean_tmp(self, now: Optional[float] = None) -> int:
        """Remove the tmp files whose writer is gone: its pid (in the name) is dead, or it has been
        stuck on the file for STALE_TMP_SECONDS (a writer stuck that long is not coming back to it)."""
        now = time.time() if now is None else now
        removed = 0
        for name in os.listdir(self.layout.tmp_dir()):
            parts = name.split("-")
            path = os.path.join(self.layout.tmp_dir(), name)
            try:
                age = now - os.stat(path, follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            writer = int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else -1
            if (not procs.pid_alive(writer) or age > STALE_TMP_SECONDS) and unlink_quietly(path):
                removed += 1
        return removed


def _rename_or_drop(tmp: StrPath, target: StrPath, replace: bool) -> None:
    try:
        if replace:
            os.replace(tmp, target)
        else:
            fsutil.rename_noreplace(tmp, target)
    except BaseException:
        unlink_quietly(tmp)
        raise


def emergency_room_size(free: int) -> int:
    """RESERVE_BYTES with four times that free, else a quarter of what is free (whole 4 KiB
    blocks), so that a small filesystem has a room too; 0 below RESERVE_FLOOR."""
    if free >= 4 * RESERVE_BYTES:
        return RESERVE_BYTES
    size = free // 4 & ~4095
    return size if size >= RESERVE_FLOOR else 0


def free_bytes(path: StrPath) -> int:
    return disk_space(path)[1]


def disk_space(path: StrPath) -> tuple[int, int]:
    """(total, free) bytes of the filesystem of `path` (zeros if it cannot be told)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 0, 0
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def remove_counting(path: StrPath) -> int:
    """Remove a file (never through a link); the bytes of disk that frees (0 if it was not there)."""
    try:
        size = os.lstat(path).st_blocks * 512
        os.unlink(path)
    except FileNotFoundError:
        return 0
    return size


def unlink_quietly(path: StrPath) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def open_regular(path: StrPath) -> Optional[int]:
    """A read descriptor on `path` if it is a regular file (never through a link, never blocking
    on a FIFO); None otherwise. The caller closes it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def read_small(path: StrPath, cap: int = 1 << 20, mine: bool = False) -> Optional[bytes]:
    """The content of a small regular file (at most `cap` bytes read; `mine`: owned by us too),
    or None if it is missing or not such a file."""
    fd = open_regular(path)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        return None if mine and st.st_uid != os.geteuid() else _read_upto(fd, st.st_size, cap)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_span(
    path: StrPath, start: int, stop: Optional[int] = None, mine: bool = False
) -> Optional[tuple[bytes, tuple[int, int, int, int]]]:
    """Bytes `start` to `stop` (default: the end) of a regular file (`mine`: owned by us too), and
    the file's identity (device, inode, size, mtime): a caller that reads a file in parts tells by
    it whether the parts are of one version. None if it is missing or not such a file."""
    fd = open_regular(path)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        if mine and st.st_uid != os.geteuid():
            return None
        end = st.st_size if stop is None else min(stop, st.st_size)
        chunks, at = [], start
        while at < end:
            chunk = os.pread(fd, end - at, at)
            if not chunk:
                break
            chunks.append(chunk)
            at += len(chunk)
        return b"".join(chunks), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_upto(fd: int, size: int, cap: int) -> bytes:
    """What is left of an open file, up to `cap` bytes: usually one read of its size and one byte more."""
    chunks, total = [], 0
    while total < cap:
        chunk = os.read(fd, min(cap - total, max(size + 1, 1 << 16)))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def read_object(path: StrPath, mine: bool = False) -> Optional[dict[str, Any]]:
    """A small JSON object file; None when it is missing, unreadable or not an object."""
    data = read_small(path, mine=mine)
    try:
        found = json.loads(data) if data else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def read_job_file(path: StrPath, cap: int) -> tuple[bytes, int]:
    """A job file's bytes and inode (what the finished index keys a row on), read safely: no
    symlinks, regular, ours, one link, size-capped, checked on the open descriptor so it cannot be
    swapped in between. FileNotFoundError if it vanished; InvalidJob (with the reason) for anything
    refused; other OSErrors are not about the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO must not hang us
    except FileNotFoundError:
        raise
    except OSError as exc:
        reason = security.open_error_reason(exc)
        if reason is None and os.path.islink(path):  # a platform with another errno for links
            reason = security.open_error_reason(OSError(errno.ELOOP, "link"))
        if reason is None:
            raise  # not about the file (out of descriptors...): it stays for the next look
        raise InvalidJob(reason) from None
    try:
        st = os.fstat(fd)
        problem = security.job_file_problem(st, cap)
        if problem:
            raise InvalidJob(problem)
        data = _read_upto(fd, st.st_size, cap + 1)
        if len(data) > cap:
            raise InvalidJob(f"grew past the limit of {cap} bytes")
        return data, st.st_ino
    finally:
        os.close(fd)
