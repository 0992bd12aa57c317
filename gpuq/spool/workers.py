"""The worker registry: which workers hold which GPUs, kept by flocks the kernel drops on death.
A whole-machine worker holds workers/machine.lock exclusively; a --gpus worker holds it shared and
workers/gpu-N.lock for each GPU. workers/worker-PID.json stays flocked while its worker lives.
"""

from __future__ import annotations

import fcntl
import json
import os
from typing import Any, Optional

from gpuq.spool.errors import SpoolError
from gpuq.spool.files import Files, read_object, unlink_quietly
from gpuq.spool.layout import Layout
from gpuq.system import fsutil


class WorkerBusy(SpoolError):
    def __init__(self, holders: list[dict[str, Any]]):
        self.holders = holders
        who = ", ".join(f"pid {w.get('pid')} (gpus {','.join(w['gpus']) if w.get('gpus') else 'all'})" for w in holders)
        super().__init__(
            f"another worker is running for this spool: {who or 'unknown pid'}; "
            "stop it with `gpuq stop`, or give each worker its own --gpus"
        )


class WorkerLease:
    """The locks a running worker holds; release() gives them up (death does too)."""

    def __init__(self, fds: list[int], info_path: str):
        self.fds, self.info_path = fds, info_path

    def update(self, info: dict[str, Any]) -> None:
        """Rewrite the worker's registry entry in place (its file stays flocked)."""
        fd = self.fds[-1]  # the info file's descriptor, taken last by register()
        data = json.dumps(info).encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))

    def release(self) -> None:
        for path in (self.info_path, os.path.join(os.path.dirname(self.info_path), f"gpus-{os.getpid()}.json")):
            unlink_quietly(path)
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class WorkerRegistry:
    def __init__(self, layout: Layout, files: Files):
        self.layout, self.files = layout, files

    def register(self, gpus: Optional[list[str]], info: dict[str, Any]) -> WorkerLease:
        """Take the worker locks for `gpus` (None: the whole machine) or raise WorkerBusy."""
        self.live()  # removes the info files of workers that died: the new one starts clean
        fds = []
        try:
            machine = self._open_lock("machine")
            fds.append(machine)
            if not fsutil.try_flock(machine, exclusive=gpus is None):
                raise WorkerBusy(self.live())
            for gpu in gpus or []:
                fd = self._open_lock(f"gpu-{gpu}")
                fds.append(fd)
                if not fsutil.try_flock(fd):
                    raise WorkerBusy([w for w in self.live() if gpu in (w.get("gpus") or [gpu])])
            tmp = self.files.tmp_path("worker")
            info_fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            fds.append(info_fd)
            fcntl.flock(info_fd, fcntl.LOCK_EX)  # locked before it is visible, like a claim
            os.write(info_fd, json.dumps(info).encode())
            info_path = self.layout.worker_info_path(os.getpid())
            os.replace(tmp, info_path)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return WorkerLease(fds, info_path)

    def _open_lock(self, name: str) -> int:
        return os.open(self.layout.worker_lock_path(name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)

    def write_gpu_view(self, view: dict[str, Any]) -> None:
        """This worker's last view of the GPUs (not fsynced: it is only shown, never trusted)."""
        data = json.dumps(view).encode()
        self.files.replace(self.layout.worker_gpus_path(os.getpid()), data, "gpus", durable=False)

    def gpu_views(self, tidy: bool = True) -> list[dict[str, Any]]:
        """The GPU views of live workers; those of dead workers are removed (unless not `tidy`:
        a look that writes nothing)."""
        alive = {w.get("pid") for w in self.live(tidy)}
        out = []
        directory = self.layout.internal_dir("workers")
        for name in os.listdir(directory):
            if not (name.startswith("gpus-") and name.endswith(".json") and name[5:-5].isdigit()):
                continue
            if int(name[5:-5]) not in alive:
                if tidy:
                    unlink_quietly(os.path.join(directory, name))
                continue
            view = read_object(os.path.join(directory, name), mine=True)
            if view is not None:
                out.append(view)
        return out

    def recorded(self) -> list[dict[str, Any]]:
        """Every worker info file as it is, without the liveness test of `live()` (whose flock
        probe tells nothing about a worker on another host where flocks do not reach across)."""
        directory = self.layout.internal_dir("workers")
        names = [n for n in sorted(os.listdir(directory)) if n.startswith("worker-") and n.endswith(".json")]
        found = [read_object(os.path.join(directory, name), mine=True) for name in names]
        return [info for info in found if info is not None]

    def live(self, tidy: bool = True) -> list[dict[str, Any]]:
        """Info of every worker alive now (its info file is flocked); stale files are removed
        (unless not `tidy`: a look that writes nothing)."""
        out = []
        directory = self.layout.internal_dir("workers")
        for name in sorted(os.listdir(directory)):
            if not (name.startswith("worker-") and name.endswith(".json")):
                continue
            path = os.path.join(directory, name)
            fd = fsutil.open_existing(path)
            if fd is None:
                continue
            try:
                if fsutil.try_flock(fd, exclusive=False):
                    if tidy and fsutil.same_inode(fd, path):
                        os.unlink(path)  # its worker died without cleaning up
                    continue
                try:
                    out.append(json.loads(os.read(fd, 65536)))
                except ValueError:
                    continue
            finally:
                os.close(fd)
        return out
