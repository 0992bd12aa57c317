"""Claims: who may change a job (spool_layout.md, section 5). A claim is locks/NNNNNN.lock, created
in tmp/, flocked, then renamed into place without clobbering, so a visible lock file is locked by a
live owner or by nobody: the kernel drops the flock when its owner dies.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from typing import Optional

from gpuq.spool.errors import full_or
from gpuq.spool.files import Files, read_small
from gpuq.spool.layout import Layout
from gpuq.system import fsutil

LOCK_NOTE_BYTES = 1024  # within the first block every lock file has


class Claim:
    """An owned claim lock: the flock lives on `fd` until release() or process death."""

    def __init__(self, job_id: int, fd: int, path: str):
        self.job_id, self.fd, self.path = job_id, fd, path

    def release(self) -> None:
        """Remove the lock file (it is still ours: nobody can create that name while it exists)."""
        if self.fd < 0:
            return
        if fsutil.same_inode(self.fd, self.path):
            os.unlink(self.path)
        os.close(self.fd)
        self.fd = -1

    def note(self, info: dict) -> None:
        """Write `info` into the lock file itself, in place: the lock file already has its block,
        so this needs no new room (how a job ended, while the disk is too full to record it)."""
        data = json.dumps(info).encode()[:LOCK_NOTE_BYTES]
        os.pwrite(self.fd, data.ljust(LOCK_NOTE_BYTES), 0)
        os.fsync(self.fd)

    def detach(self) -> None:
        """Forget the claim without removing it (another process now holds the descriptor)."""
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


class Claims:
    def __init__(self, layout: Layout, files: Files):
        self.layout, self.files = layout, files

    def claim(self, job_id: int, noting: bool = True) -> Optional[Claim]:
        """Take the claim on a job, or None if someone else holds it. `noting=False`: an empty
        lock file, which needs no block of the disk but cannot take a note (see take_over)."""
        tmp = self.files.tmp_path("claim")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        owner = json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "at": time.time()}).encode()
        try:
            if noting:  # padded: its block is then there for a later note, even on a full disk
                os.write(fd, owner.ljust(LOCK_NOTE_BYTES))
        except OSError as exc:
            os.close(fd)
            os.unlink(tmp)
            raise full_or(self.layout.home, exc) from None
        try:
            fsutil.rename_noreplace(tmp, self.layout.lock_path(job_id))
        except FileExistsError:
            os.unlink(tmp)
            os.close(fd)
            return None
        return Claim(job_id, fd, self.layout.lock_path(job_id))

    def ready(self) -> None:
        """Load what taking a claim needs (the no-clobber rename's C binding) now, not at the claim:
        a supervisor calls it while its job runs, so that starting the next job does not wait."""
        fsutil.rename_binding()

    def adopt_descriptor(self, job_id: int, fd: int) -> Claim:
        """The claim whose locked descriptor another process handed us (the worker to a supervisor)."""
        return Claim(job_id, fd, self.layout.lock_path(job_id))

    def held(self, job_id: int) -> Optional[bool]:
        """True if a live owner holds the job's claim, False if the lock is stale, None if absent."""
        fd = fsutil.open_existing(self.layout.lock_path(job_id))
        if fd is None:
            return None
        try:
            return not fsutil.try_flock(fd, exclusive=False)
        finally:
            os.close(fd)

    def take_over(self, job_id: int, noting: bool = True) -> Optional[Claim]:
        """Own the job's claim: a fresh one if there is no lock, the stale one if its owner died
        (of two at once only one gets the flock; the other finds the path gone or another inode).
        `noting=False` (`gpuq clear`, which only deletes): a fresh lock is empty, needing no room."""
        path = self.layout.lock_path(job_id)
        fd = fsutil.open_existing(path, os.O_RDWR)
        if fd is None:
            if not noting:
                return self.claim(job_id, noting=False)
            return self.files.with_room(lambda: self.claim(job_id))  # a person's action works on a full disk too
        if fsutil.try_flock(fd) and fsutil.same_inode(fd, path):
            return Claim(job_id, fd, path)
        os.close(fd)
        return None

    def noted(self, job_id: int) -> Optional[dict]:
        """What the claim's owner noted in the lock file (see Claim.note), or None."""
        data = read_small(self.layout.lock_path(job_id), LOCK_NOTE_BYTES)
        try:
            info = json.loads(data.rstrip(b" \0")) if data else None
        except ValueError:
            return None
        return info if isinstance(info, dict) else None

    def ids(self) -> list[int]:
        names = os.listdir(self.layout.internal_dir("locks"))
        return [int(name[:-5]) for name in names if name.endswith(".lock") and name[:-5].isdigit()]
