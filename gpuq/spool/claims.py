"""Claims (who may change a job) and control requests for running jobs' supervisors."""

from __future__ import annotations

import fcntl
import json
import os
import time
from typing import Optional

from gpuq import fsutil
from gpuq.spool.base import Claim


class ClaimsMixin:
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
