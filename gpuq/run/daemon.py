"""Starting a worker: in the foreground (`gpuq run [--watch]`) or as a background daemon."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from datetime import datetime
from typing import Optional

from gpuq.core.errors import Refused
from gpuq.run import loop
from gpuq.run.launcher import PACKAGE_PARENT
from gpuq.run.worker import Worker
from gpuq.spool import Spool, WorkerBusy

CLI_BOOT = "import sys; sys.path.insert(0, sys.argv.pop(1)); from gpuq.cli import main; sys.exit(main())"
READY_TIMEOUT = 20.0


def _say(text: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {text}", flush=True)


def run_foreground(spool: Spool, gpus: Optional[list[str]], watch: bool, ready_fd: Optional[int] = None) -> int:
    info = {
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
        where = f"GPUs {','.join(gpus)}" if gpus else "one job at a time"
        _say(f"worker {os.getpid()} started ({where}, spool {spool.home}){'; watching for new jobs' if watch else ''}")
        return loop.serve(Worker(spool, gpus, say=_say), watch=watch)
    finally:
        lease.release()


def _tell(fd: int, message: str) -> None:
    os.write(fd, (message + "\n").encode())
    os.close(fd)


def start_background(spool: Spool, gpus: Optional[list[str]]) -> int:
    """Start `gpuq run --watch` detached from this terminal; return its pid once it holds its
    locks. Refused (with the worker's own reason) if it could not start."""
    read_fd, write_fd = os.pipe()
    log = spool.logs.open_worker_log()
    cmd = [sys.executable, "-c", CLI_BOOT, PACKAGE_PARENT, "run", "--watch", "--ready-fd", str(write_fd)]
    if gpus:
        cmd += ["--gpus", ",".join(gpus)]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(write_fd,), start_new_session=True, cwd="/"
    )
    os.close(write_fd)
    os.close(log)
    message = _read_ready(read_fd, proc)
    if not message.startswith("ok"):
        raise Refused(message[len("error: ") :] if message.startswith("error: ") else message)
    return proc.pid


def _read_ready(read_fd: int, proc: subprocess.Popen) -> str:
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
    return data.decode().strip() or f"error: the worker exited at start (code {proc.poll()}); see the worker log"
