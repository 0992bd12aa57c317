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

from gpuq.spool import Spool, WorkerBusy

CLI_BOOT = "import sys; sys.path.insert(0, sys.argv.pop(1)); from gpuq.cli import main; sys.exit(main())"
READY_TIMEOUT = 20.0


def _say(text: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {text}", flush=True)


def run_foreground(spool: Spool, gpus: Optional[list[str]], watch: bool, ready_fd: Optional[int] = None) -> int:
    from gpuq.worker import PACKAGE_PARENT, Worker  # imports watchdog lazily, only for workers

    del PACKAGE_PARENT
    info = {
        "pid": os.getpid(),
        "started": time.time(),
        "gpus": gpus,
        "watch": watch,
        "host": socket.gethostname(),
        "log": str(spool.worker_log_path()) if ready_fd is not None else None,
    }
    try:
        lease = spool.register_worker(gpus, info)
    except WorkerBusy as exc:
        if ready_fd is not None:
            _tell(ready_fd, f"error: {exc}")
        raise
    try:
        if ready_fd is not None:
            _tell(ready_fd, f"ok {os.getpid()}")
        where = f"GPUs {','.join(gpus)}" if gpus else "one job at a time"
        _say(f"worker {os.getpid()} started ({where}, spool {spool.home}){'; watching for new jobs' if watch else ''}")
        return Worker(spool, gpus, say=_say).serve(watch=watch)
    finally:
        lease.release()


def _tell(fd: int, message: str) -> None:
    os.write(fd, (message + "\n").encode())
    os.close(fd)


def start_background(spool: Spool, gpus: Optional[list[str]]) -> int:
    """Start `gpuq run --watch` detached from this terminal; return once it holds its locks."""
    from gpuq.worker import PACKAGE_PARENT

    read_fd, write_fd = os.pipe()
    log_path = spool.worker_log_path()
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    cmd = [sys.executable, "-c", CLI_BOOT, PACKAGE_PARENT, "run", "--watch", "--ready-fd", str(write_fd)]
    if gpus:
        cmd += ["--gpus", ",".join(gpus)]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(write_fd,), start_new_session=True, cwd="/"
    )
    os.close(write_fd)
    os.close(log)
    message = _read_ready(read_fd, proc)
    if message.startswith("ok"):
        print(f"[+] worker started in the background: pid {proc.pid}, log {log_path}")
        print("    `gpuq status` shows the queue, `gpuq stop` stops the worker (jobs keep running).")
        return 0
    print(f"gpuq: {message.removeprefix('error: ') if hasattr(message, 'removeprefix') else message}", file=sys.stderr)
    return 1


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
