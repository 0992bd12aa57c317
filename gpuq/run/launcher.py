"""Handing a claimed job to its supervisor, as fast as Python allows.

Every supervisor is a spare first: a process waiting on one end of a socket pair for its start
order (run/supervisor/main.py). A job and its claim's descriptor go to it over the socket
(SCM_RIGHTS); the worker keeps its end, which is its line to that supervisor (the jobs to follow
in the slot: run/successor.py) and, at end of file, the supervisor's exit. While jobs are queued or
running the launcher keeps one spare ready, so a job does not wait for a process to start.

Spares come from the zygote (run/zygote.py): a process that has imported the supervisor once and
forks a spare on request, which costs a `fork` instead of an interpreter. The launcher starts it when
it first needs a spare (it exits again after a few idle seconds). A job that finds no spare ready,
and every spare while no zygote can be had, gets a new interpreter (`python -S`, with the worker's
import path passed in: `site` and its .pth files were the largest single cost of a start): the
same spare, waiting on the same kind of socket, that the job's order is already waiting in.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional

from gpuq.run import successor
from gpuq.run.supervisor.order import StartOrder
from gpuq.spool import Claim, Spool

PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent.parent)
# argv: N, N path entries, then the supervisor's own arguments.
BOOT = (
    "import sys; n = int(sys.argv[1]); sys.path[:0] = sys.argv[2 : 2 + n]; del sys.argv[1 : 2 + n]; "
    "from gpuq.run.{} import main; sys.exit(main())"
)
SUPERVISOR_BOOT = BOOT.format("supervisor.main")
ZYGOTE_BOOT = BOOT.format("zygote")
ZYGOTE_MAX_FAILURES = 3  # zygotes that exited with an error before the launcher stops starting them
FORK_REQUEST = b"spare"  # what the zygote is sent with a socket end to fork a spare on


def supervisor_path() -> list[str]:
    """This package's parent, then the worker's own import path (blank entries mean "the current
    directory", which the supervisor must not search)."""
    return [PACKAGE_PARENT] + [p for p in sys.path if p and p != PACKAGE_PARENT]


class Supervisor:
    """A supervisor (a spare until it gets its job), seen through the worker's end of its socket:
    the socket's end of file is its exit (Popen's `poll()`, without an exit code: 0 once gone). One
    started as a new interpreter is the worker's child, and is also reaped here."""

    def __init__(self, sock: socket.socket, process: Optional[subprocess.Popen] = None):
        self.sock: Optional[socket.socket] = sock
        self.process = process

    def poll(self) -> Optional[int]:
        if self.sock is not None:
            try:
                if not select.select([self.sock], [], [], 0)[0] or self.sock.recv(1, socket.MSG_PEEK):
                    return None
            except (OSError, ValueError):  # reset, or ours was closed: the other end is gone too
                pass
            self.sock.close()  # end of file: the other end is closed
            self.sock = None
        return self.process.poll() if self.process is not None else 0

    def close(self) -> None:
        """Close our end: a spare without a job exits; a supervisor with one hands nothing on."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class Launcher:
    def __init__(self, spool: Spool):
        self.spool = spool
        self.spare: Optional[Supervisor] = None
        self.zygote: Optional[subprocess.Popen] = None
        self.zygote_sock: Optional[socket.socket] = None
        self.zygote_failures = 0

    def launch(self, claim: Claim, order: StartOrder) -> Supervisor:
        """Hand the claimed job to a supervisor with its start order; afterwards the supervisor
        owns the claim. The spare kept ready if it is still there, else a new interpreter.
        OSError if none could be started (the claim is then still ours)."""
        supervisor, self.spare = self.spare, None
        if supervisor is None or not self._hand_over(supervisor, claim, order):
            if supervisor is not None:
                supervisor.close()
            supervisor = self._new_interpreter()
            if not self._hand_over(supervisor, claim, order):
                supervisor.close()
                raise OSError("the supervisor started for the job could not be reached")
        claim.detach()
        return supervisor

    @staticmethod
    def can_tell(supervisor: Supervisor) -> bool:
        """Whether we still have a line to `supervisor`."""
        return supervisor.sock is not None

    @staticmethod
    def tell(supervisor: Supervisor, line: bytes) -> bool:
        """Send a line to a supervisor we handed a job to (run/successor.py); False if it is gone."""
        return successor.send(supervisor.sock, line)

    def keep_a_spare(self, beside_starts: bool = False) -> bool:
        """Have a supervisor ready ahead of time, so the next job does not wait for one to start:
        forked by the zygote, or (no zygote could be reached) a new interpreter. `beside_starts`
        (jobs were just handed over): no new zygote or interpreter is started, as its start (an
        interpreter importing the supervisor) would take the CPU theirs need; False then, for the
        caller to ask again a moment later."""
        self.reap_zygote()
        if self.spare is not None and self.spare.poll() is None:
            return True
        if beside_starts and not self.zygote_ready():
            return False
        mine, theirs = socket.socketpair()
        try:
            if self._ask_zygote(theirs):
                self.spare = Supervisor(mine)
                return True
        finally:
            theirs.close()
        mine.close()
        try:
            self.spare = self._new_interpreter()
        except OSError:
            pass  # jobs then start the slower way
        return True

    def _new_interpreter(self) -> Supervisor:
        """A spare started as a new `python -S`; OSError if it could not be."""
        mine, theirs = socket.socketpair()
        try:
            log = self.spool.logs.open_worker_log()
            process = self._start_process(("--spare-fd", str(theirs.fileno())), log, theirs)
        except OSError:
            mine.close()
            raise
        finally:
            theirs.close()
        return Supervisor(mine, process)

    def _ask_zygote(self, theirs: socket.socket) -> bool:
        """Ask the zygote to fork a spare on `theirs`. A zygote that is gone (idle, or killed) is
        replaced; the request waits in the new one's socket until it has started. False if no
        zygote can be had: the spare is then a new interpreter."""
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
            return False  # it keeps failing (see the worker's log): spares are new interpreters
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

    def zygote_ready(self) -> bool:
        """Whether a zygote runs to fork the next spare (else keep_a_spare starts an interpreter)."""
        self.reap_zygote()
        return self.zygote is not None and self.zygote_sock is not None

    def reap_zygote(self) -> None:
        """A zygote that exited (idle, or killed) is the worker's child: collect it."""
        if self.zygote is not None and self.zygote.poll() is not None:
            if self.zygote.returncode > 0:  # an error, not an idle exit or a signal
                self.zygote_failures += 1
            self.zygote = None

    def close_spare(self) -> None:
        """The spare exits when its socket closes (also when the worker dies); so does the zygote."""
        if self.spare is not None:
            self.spare.close()
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

    @staticmethod
    def _hand_over(supervisor: Supervisor, claim: Claim, order: StartOrder) -> bool:
        """Give a job and its claim to a spare; False if it is gone."""
        try:
            if supervisor.poll() is not None:
                return False
            socket.send_fds(supervisor.sock, [order.encode()], [claim.fd])
            return True
        except OSError:
            return False
