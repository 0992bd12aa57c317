"""How the spool writes and reads files: one way to write atomically, safe reads, tails.

Every file gpuq writes in the spool is written complete in tmp/ first and then renamed into place,
so a reader never sees half a file and a crash never leaves one where it counts. A temporary file is
removed on any error, and a write that fails for lack of space raises SpoolFull.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path
from typing import Optional

from gpuq.core.schema import InvalidJob
from gpuq.spool.errors import SpoolFull
from gpuq.spool.layout import Layout
from gpuq.system import fsutil, procs, security

STALE_TMP_SECONDS = 600.0


class Files:
    """Atomic writes into one spool. `durable=False` skips the fsyncs, for derived data that is
    cheaper to rebuild than to sync (caches, progress samples)."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self._counter = 0

    def tmp_path(self, kind: str) -> Path:
        """A fresh hidden name in tmp/ that says who wrote it (for clean_tmp) and what it is."""
        self._counter += 1
        return self.layout.tmp_dir() / f".{kind}-{os.getpid()}-{self._counter}-{os.urandom(4).hex()}"

    def write_tmp(self, data: bytes, kind: str, durable: bool = True) -> Path:
        """A complete file in tmp/; SpoolFull (the partial file removed) if there is no room."""
        path = self.tmp_path(kind)
        try:
            fsutil.write_new_file(path, data, durable=durable)
        except OSError as exc:
            if exc.errno in security.FULL_ERRNOS:
                raise SpoolFull(self.layout.home, exc) from None
            raise
        return path

    def replace(self, target: Path, data: bytes, kind: str, durable: bool = True) -> None:
        """Atomically make `target` hold `data`, replacing what was there."""
        tmp = self.write_tmp(data, kind, durable)
        _rename_or_drop(tmp, target, replace=True)
        if durable:
            fsutil.fsync_dir(target.parent)

    def place_new(self, target: Path, data: bytes, kind: str) -> None:
        """Atomically create `target` with `data`, durably; FileExistsError if it exists."""
        tmp = self.write_tmp(data, kind)
        _rename_or_drop(tmp, target, replace=False)
        fsutil.fsync_dir(target.parent)

    def clean_tmp(self, now: Optional[float] = None) -> int:
        """Remove tmp files left by writers that died (or that are implausibly old)."""
        now = time.time() if now is None else now
        removed = 0
        for name in os.listdir(self.layout.tmp_dir()):
            parts = name.split("-")
            path = self.layout.tmp_dir() / name
            try:
                age = now - os.stat(path, follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            writer = int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else -1
            if age > STALE_TMP_SECONDS or not procs.pid_alive(writer):
                if unlink_quietly(path):
                    removed += 1
        return removed


def _rename_or_drop(tmp: Path, target: Path, replace: bool) -> None:
    try:
        if replace:
            os.replace(tmp, target)
        else:
            fsutil.rename_noreplace(tmp, target)
    except BaseException:
        unlink_quietly(tmp)
        raise


def unlink_quietly(path: Path) -> bool:
    """Remove a file; False if it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def open_regular(path: Path) -> Optional[int]:
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


def read_small(path: Path, cap: int = 1 << 20, mine: bool = False) -> Optional[bytes]:
    """The content of a small regular file (at most `cap` bytes read; `mine`: owned by us too),
    or None if it is missing or not such a file."""
    fd = open_regular(path)
    if fd is None:
        return None
    try:
        if mine and os.fstat(fd).st_uid != os.geteuid():
            return None
        chunks, total = [], 0
        while total < cap:
            chunk = os.read(fd, min(1 << 20, cap - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def tail(path: Path, limit: int) -> tuple[bytes, float]:
    """The last `limit` bytes of a regular file and its mtime; (b"", 0.0) if there is none. The
    cost does not grow with the file: a 1 GB log costs what a 1 KB one does."""
    fd = open_regular(path)
    if fd is None:
        return b"", 0.0
    try:
        st = os.fstat(fd)
        return os.pread(fd, min(limit, st.st_size), max(0, st.st_size - limit)), st.st_mtime
    finally:
        os.close(fd)


def read_from(path: Path, offset: int, limit: int = 1 << 20) -> bytes:
    """Up to `limit` bytes of a regular file from `offset` on (b"" if none)."""
    fd = open_regular(path)
    if fd is None:
        return b""
    try:
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)


def read_job_file(path: Path, cap: int) -> bytes:
    """Read a job file safely: no symlinks, regular, ours, one link, size-capped, checked on the
    open descriptor so it cannot be swapped in between. FileNotFoundError if it vanished;
    InvalidJob (with the reason) for anything refused; other OSErrors are not about the file."""
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
        problem = security.job_file_problem(os.fstat(fd), cap)
        if problem:
            raise InvalidJob(problem)
        chunks, total = [], 0
        while total <= cap:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > cap:
            raise InvalidJob(f"grew past the limit of {cap} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)
