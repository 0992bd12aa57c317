"""The worker registry: which workers hold which GPUs, kept by flocks the kernel drops on death."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any, Optional

from gpuq import fsutil
from gpuq.spool.base import SpoolError


class WorkersMixin:
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
