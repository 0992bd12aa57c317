"""The supervisor zygote: a process that forks spare supervisors, so a job costs a `fork`, not an
interpreter.

A supervisor started as a fresh `python -S` spends some 70-150 ms of CPU importing what it needs,
most of what a short job costs on two CPUs. The zygote imports all of that once and then, each time
the worker asks (a socket end sent over its socket with SCM_RIGHTS), forks a child that becomes a
spare supervisor waiting on that end (run/supervisor/main.py, `serve_spare`), exactly as a spare
the worker started as a new interpreter would.

Why not fork from the worker: the worker runs threads (the file watcher), and a fork of a threaded
process may copy a lock some other thread held. The zygote never starts a thread.

Its children are supervisors in every way: each calls setsid(), so it is a session of its own and
outlives the zygote and the worker; the zygote's socket is closed in the child, so only the worker
and the zygote hold that connection; SIGCHLD is ignored in the zygote (the kernel reaps its
children, nothing waits for them) and set back to the default in the child (a supervisor waits
for its job). The zygote exits when the worker goes (end of file on its socket) or after
IDLE_SECONDS without a request (the worker starts a new one when it needs one), never touching
its children. In `ps` it is named `gpuq-zygote`, its children `gpuq-spare` then `gpuq-supervisor`.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import socket
import sys
import traceback
from typing import Optional

# Loaded here, before any fork, so that a spare has nothing left to import: the supervisor, what its
# spare imports while it waits (psutil, for the job's identity), and the parts of the spool a run
# uses (Spool imports each on first use: in every child, otherwise).
import psutil  # noqa: F401

from gpuq.run.launcher import FORK_REQUEST
from gpuq.run.supervisor.main import name_process, serve_spare
from gpuq.spool import control, logs, reports  # noqa: F401
from gpuq.system import fsutil
from gpuq.system.gpu_presence import may_have_gpus

if may_have_gpus():  # a GPU job's supervisor leases its GPUs (run/supervisor/lease.py): loaded once, here
    from gpuq.engine.schedule import leasing  # noqa: F401

IDLE_SECONDS = 5.0  # no request for this long: exit (an idle queue keeps no extra process)


def serve(listener: socket.socket, home: str, idle_seconds: float = IDLE_SECONDS) -> int:
    """Fork a spare for each socket end the worker sends; return on end of file or when idle."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    fsutil.preload()  # every supervisor renames job files: load ctypes once, here
    gc.freeze()  # what is loaded now stays out of the collector: fewer pages copied by each child
    while True:
        if not select.select([listener], [], [], idle_seconds)[0]:
            return 0
        try:
            message, fds, _flags, _addr = socket.recv_fds(listener, 64, 1)
        except OSError:
            return 0
        if not message and not fds:
            return 0  # the worker has gone
        for fd in fds:
            if message == FORK_REQUEST:
                _fork_spare(listener, fd, home)
            os.close(fd)


def _fork_spare(listener: socket.socket, spare_fd: int, home: str) -> None:
    if os.fork():
        return
    code = 1
    try:
        listener.close()  # the child must not keep the worker's connection to the zygote open
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        code = serve_spare(home, spare_fd)
    except BaseException:  # noqa: BLE001 - a child never returns into the zygote's loop
        traceback.print_exc()
    finally:
        _flush()
        os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def main(argv: Optional[list[str]] = None) -> int:
    """`--home H --zygote-fd F`, as the worker's launcher starts it (run/launcher.py)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or args[0] != "--home" or args[2] != "--zygote-fd" or not args[3].isdigit():
        raise SystemExit(f"gpuq-zygote: internal use only; expected --home H --zygote-fd F, got {args}")
    os.umask(0o077)
    name_process("gpuq-zygote")
    return serve(socket.socket(fileno=int(args[3])), args[1])


if __name__ == "__main__":
    sys.exit(main())
