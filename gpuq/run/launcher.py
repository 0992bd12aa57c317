"""Handing a claimed job to its supervisor, as fast as Python allows.

A supervisor is a fresh interpreter (`python -S`, with the worker's import path passed in: `site`
and its .pth files were the largest single cost between the worker's decision and the job's first
instruction). While jobs are queued or running the launcher keeps one supervisor started ahead of
time (a "spare", waiting on a socket pair); a job and its claim's descriptor go to it over the
socket (SCM_RIGHTS), so the job does not wait for an interpreter to start. Without a spare the
supervisor is started for the job directly.

Spares come from the zygote (run/zygote.py) when there is one: a process that has imported the
supervisor once and forks a spare on request, which costs a `fork` instead of an interpreter. The
launcher starts it when it first needs a spare (it exits again after a few idle seconds); if it is
missing or dies, the spare is started the old way and a new zygote is started for the next one.
A spare the zygote forked is not the worker's child: the worker keeps its end of the spare's socket
after the hand-over and learns of the supervisor's exit from that socket's end of file.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from gpuq.run import successor
from gpuq.spool import Claim, Spool

PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent.parent)
# argv: N, N path entries, then the supervisor's own arguments.
BOOT = (
    "import sys; n = int(sys.argv[1]); sys.path[:0] = sys.argv[2 : 2 + n]; del sys.argv[1 : 2 + n]; "
    "from gpuq.run.{} import main; sys.exit(main())"
)
SUPERVISOR_BOOT = BOOT.format("supervisor")
ZYGOTE_BOOT = BOOT.format("zygote")
ZYGOTE_MAX_FAILURES = 3  # zygotes that exited with an error before the launcher stops starting them
FORK_REQUEST = b"spare"  # zygote.FORK_REQUEST (not imported: the zygote module imports psutil)


def supervisor_path() -> list[str]:
    """This package's parent, then the worker's own import path (blank entries mean "the current
    directory", which the supervisor must not search)."""
    return [PACKAGE_PARENT] + [p for p in sys.path if p and p != PACKAGE_PARENT]


class Forked:
    """A supervisor the zygote forked, seen through the worker's end of its socket: the socket's
    end of file is its exit (Popen's `poll()`, without an exit code: 0 once gone)."""

    def __init__(self, sock: socket.socket):
        self.sock: Optional[socket.socket] = sock

    def poll(self) -> Optional[int]:
        if self.sock is None:
            return 0
        try:
            if select.select([self.sock], [], [], 0)[0] and not self.sock.recv(1, socket.MSG_PEEK):
                raise ConnectionResetError
        except (OSError, ValueError):  # end of file, or reset: the other end is closed (or ours was)
            self.sock.close()
            self.sock = None
            return 0
        return None


Process = Union[subprocess.Popen, Forked]


@dataclass
class Spare:
    process: Process
    sock: Any  # our end of the socket pair; the spare waits for a job on the other


def placed(slot: Optional[str], gpus: Optional[tuple[int, ...]], settings: dict[str, Any]) -> dict[str, Any]:
    """Where a job runs and the worker's settings for it, as a supervisor is told them (with a job
    handed over, and with the jobs named to follow it: run/successor.py)."""
    return {"slot": slot, "gpus": list(gpus) if gpus is not None else None, **settings}


class Launcher:
    def __init__(self, spool: Spool):
        self.spool = spool
        self.spare: Optional[Spare] = None
        self.zygote: Optional[subprocess.Popen] = None
        self.zygote_sock: Optional[socket.socket] = None
        self.zygote_failures = 0

    def launch(
        self, claim: Claim, slot: Optional[str], gpus: Optional[tuple[int, ...]], settings: dict[str, Any]
    ) -> Process:
        """Hand the claimed job to a supervisor, with where it runs (`slot`: its
        CUDA_VISIBLE_DEVICES, `gpus`: the GPUs it holds) and the worker's `settings` for it (its
        hooks, the log cap); afterwards the supervisor owns the claim. OSError if none could be
        started (the claim is then still ours)."""
        where = {"id": claim.job_id, **placed(slot, gpus, settings)}
        spare, self.spare = self.spare, None
        process = self._hand_over(spare, claim, where) if spare else None
        if process is None:
            process = self._start_for(claim, where)
        claim.detach()
        return process

    @staticmethod
    def can_tell(process: Process) -> bool:
        """Whether `process` is a supervisor we still have a line to (a spare the zygote forked)."""
        return isinstance(process, Forked) and process.sock is not None

    @staticmethod
    def tell(process: Process, line: bytes) -> bool:
        """Send a line to a supervisor we handed a job to (run/successor.py); False if it is gone."""
        return isinstance(process, Forked) and successor.send(process.sock, line)

    def keep_a_spare(self) -> None:
        """Have a supervisor ready ahead of time, so the next job does not wait for one to start:
        forked by the zygote, or (no zygote could be reached) a new interpreter."""
        self.reap_zygote()
        if self.spare is not None and self.spare.process.poll() is None:
            return
        mine, theirs = socket.socketpair()
        try:
            if self._ask_zygote(theirs):
                self.spare = Spare(Forked(mine), mine)
                return
            log = self.spool.logs.open_worker_log()
            process = self._start_process(("--spare-fd", str(theirs.fileno())), log, theirs)
        except OSError:
            mine.close()
            return  # jobs then start the slower way
        finally:
            theirs.close()
        self.spare = Spare(process, mine)

    def _ask_zygote(self, theirs: socket.socket) -> bool:
        """Ask the zygote to fork a spare on `theirs`. A zygote that is gone (idle, or killed) is
        replaced; the request waits in the new one's socket until it has started. False if no
        zygote can be had: the spare is then started the old way."""
        for _attempt in range(2):
            if self.zygote_sock is None and not self._start_zygote():
                return False
            assert self.zygote_sock is not None
            try:
                socket.send_fds(self.zygote_sock, [FORK_REQUEST], [theirs.fileno()])
                return True
            except OSError:
                self.zygote_sock.close()
                self.zygote_sock = None
        return False

    def _start_zygote(self) -> bool:
        self.reap_zygote()
        if self.zygote_failures >= ZYGOTE_MAX_FAILURES:
            return False  # it keeps failing (see the worker's log): spares start the old way
        mine, theirs = socket.socketpair()
        try:
            self.zygote = self._start_process(
                ("--zygote-fd", str(theirs.fileno())), self.spool.logs.open_worker_log(), theirs, ZYGOTE_BOOT
            )
        except OSError:
            mine.close()
            return False
        finally:
            theirs.close()
        self.zygote_sock = mine
        return True

    def reap_zygote(self) -> None:
        """A zygote that exited (idle, or killed) is the worker's child: collect it."""
        if self.zygote is not None and self.zygote.poll() is not None:
            if self.zygote.returncode > 0:  # an error, not an idle exit or a signal
                self.zygote_failures += 1
            self.zygote = None

    def close_spare(self) -> None:
        """The spare exits when its socket closes (also when the worker dies); so does the zygote."""
        if self.spare is not None:
            self.spare.sock.close()
            self.spare = None
        if self.zygote_sock is not None:
            self.zygote_sock.close()
            self.zygote_sock = None

    def _start_process(
        self, args: tuple[str, ...], log: int, passed: socket.socket, boot: str = SUPERVISOR_BOOT
    ) -> subprocess.Popen:
        """A new interpreter running `boot` in its own session, output to `log` (closed here)."""
        try:
            return subprocess.Popen(
                self._supervisor_cmd(*args, boot=boot),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(passed.fileno(),),
                start_new_session=True,
            )
        finally:
            os.close(log)

    def _supervisor_cmd(self, *args: str, boot: str = SUPERVISOR_BOOT) -> list[str]:
        path = supervisor_path()
        return [sys.executable, "-S", "-c", boot, str(len(path)), *path, "--home", str(self.spool.home), *args]

    def _start_for(self, claim: Claim, where: dict[str, Any]) -> subprocess.Popen:
        args = ["--job", str(claim.job_id), "--lock-fd", str(claim.fd), "--where", json.dumps(where)]
        log = self.spool.logs.open_job_log(claim.job_id)
        try:
            return subprocess.Popen(
                self._supervisor_cmd(*args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(claim.fd,),
                start_new_session=True,
            )
        finally:
            os.close(log)

    @staticmethod
    def _hand_over(spare: Spare, claim: Claim, where: dict[str, Any]) -> Optional[Process]:
        """Give a job and its claim to the spare supervisor; None if the spare is gone. A forked
        spare's socket stays open: it tells when that supervisor exits."""
        keep = False
        try:
            if spare.process.poll() is not None:
                return None
            socket.send_fds(spare.sock, [json.dumps(where).encode() + b"\n"], [claim.fd])
            keep = isinstance(spare.process, Forked)
            return spare.process
        except OSError:
            return None
        finally:
            if not keep:
                spare.sock.close()
