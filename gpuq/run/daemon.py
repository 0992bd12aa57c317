"""Starting a worker: in the foreground (`gpuq run [--watch]`) or as a background daemon."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from contextlib import suppress
from datetime import datetime
from typing import Any, Optional

from gpuq.core.errors import Refused, UsageError
from gpuq.core.words import plural
from gpuq.run import loop
from gpuq.run.launcher import PACKAGE_PARENT, Launcher
from gpuq.run.worker import Settings, Worker
from gpuq.spool import Spool, WorkerBusy
from gpuq.system import gpus as gpu_look

CLI_BOOT = "import sys; sys.path.insert(0, sys.argv.pop(1)); from gpuq.cli import main; sys.exit(main())"
READY_TIMEOUT = 20.0


def _say(text: str) -> None:
    with suppress(OSError):  # the worker's log is on a full disk: the line is lost, the worker goes on
        print(f"[{datetime.now().strftime('%H:%M:%S')}] {text}", flush=True)


def run_foreground(spool: Spool, settings: Settings, watch: bool, ready_fd: Optional[int] = None) -> int:
    gpus = settings.gpus
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "started": time.time(),
        "gpus": gpus,
        "watch": watch,
        "host": socket.gethostname(),
        "log": str(spool.logs.worker_log_path()) if ready_fd is not None else None,
    }
    try:
        lease = spool.workers.register(gpus, info)
    except WorkerBusy as exc:
        if ready_fd is not None:
            _tell(ready_fd, f"error: {exc}")
        raise
    try:
        if ready_fd is not None:
            _tell(ready_fd, f"ok {os.getpid()}")
        worker = Worker(spool, Launcher(spool), settings, say=_say)
        cap = worker.planner.host  # what jobs may reserve of the machine: `add --dry-run` admits as the worker does
        if cap is not None:
            info["host_cap"] = {"mem_mib": cap.mem_mib, "cpus": cap.cpus}
            lease.update(info)
        where = _where(worker)
        _say(f"worker {os.getpid()} started ({where}, spool {spool.home}){'; watching for new jobs' if watch else ''}")
        if settings.recover:
            worker.recover_interrupted()
        return loop.serve(worker, watch=watch, on_drain=lambda: lease.update(dict(info, draining=True)))
    finally:
        lease.release()


def check_gpus(labels: Optional[list[str]]) -> None:
    """Refuse `--gpus` indices that a full look shows do not exist. A look with a GPU unreadable (one
    fallen off the bus) refuses nothing, and without GPUs the labels name slots."""
    if not labels:
        return  # nothing named: no look (NVML's start) in the command that starts the worker
    look = gpu_look.look()
    there = [str(g.index) for g in look.gpus]
    unknown = [label for label in labels if label not in there]
    if there and look.problem is None and unknown:
        raise UsageError(
            f"--gpus: no GPU {','.join(unknown)} here; this machine has {plural(len(there), 'GPU')} ({','.join(there)})"
        )


def _where(worker: Worker) -> str:
    """What the worker runs jobs on, as it first looks at the GPUs (and shows them to `status`)."""
    look, labels = worker.publish_gpus(), worker.settings.gpus
    if look.gpus:
        chosen = [g for g in look.gpus if labels is None or str(g.index) in labels]
        return f"GPUs {','.join(str(g.index) for g in chosen)} of {len(look.gpus)} ({look.source})"
    if look.problem and look.source != "none":
        return f"GPUs unreadable: {look.problem}"
    return f"no GPUs found: slots {','.join(labels)}" if labels else "no GPUs found: one job at a time"


def _tell(fd: int, message: str) -> None:
    os.write(fd, (message + "\n").encode())
    os.close(fd)


def start_background(spool: Spool, run_options: list[str]) -> int:
    """Start `gpuq run --watch RUN_OPTIONS` detached; its pid once it holds its locks, else Refused."""
    read_fd, write_fd = os.pipe()
    log = spool.logs.open_worker_log()
    cmd = [sys.executable, "-c", CLI_BOOT, PACKAGE_PARENT, "run", "--watch", "--ready-fd", str(write_fd), *run_options]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(write_fd,), start_new_session=True, cwd="/"
    )
    os.close(write_fd)
    os.close(log)
    data, deadline = b"", time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        ready, _, _ = select.select([read_fd], [], [], 0.2)
        if ready:
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            data += chunk
        elif proc.poll() is not None:
            break
    os.close(read_fd)
    message = data.decode().strip() or f"error: the worker exited at start (code {proc.poll()}); see the worker log"
    if not message.startswith("ok"):
        raise Refused(message[len("error: ") :] if message.startswith("error: ") else message)
    return proc.pid
