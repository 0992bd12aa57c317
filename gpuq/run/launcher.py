"""Handing a claimed job to its supervisor: its order and the claim's descriptor go over a socket
pair (SCM_RIGHTS), whose worker end stays the line to it (run/successor.py). One spare supervisor
is kept ready, so that a job does not wait for an interpreter to start (ARCHITECTURE.md).
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
from typing import Optional

from gpuq.run import successor
from gpuq.run.supervisor.order import StartOrder
from gpuq.spool import Claim, Spool

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
# argv: N, N path entries (site and its .pth files were the largest cost of a start), then the
# supervisor's own arguments.
BOOT = (
    "import sys; n = int(sys.argv[1]); sys.path[:0] = sys.argv[2 : 2 + n]; del sys.argv[1 : 2 + n]; "
    "from gpuq.run.supervisor.main import main; sys.exit(main())"
)


class Supervisor:
    def __init__(self, sock: socket.socket, process: subprocess.Popen):
        self.sock: Optional[socket.socket] = sock
        self.process = process

    def poll(self) -> Optional[int]:
        if self.sock is not None:
            try:
                if not select.select([self.sock], [], [], 0)[0] or self.sock.recv(1, socket.MSG_PEEK):
                    return None
            except (OSError, ValueError):  # reset, or ours was closed: the other end is gone too
                pass
            self.close()
        return self.process.poll()

    def tell(self, line: bytes) -> bool:
        if successor.send(self.sock, line):
            return True
        self.close()
        return False

    @property
    def listening(self) -> bool:
        return self.sock is not None

    @property
    def pid(self) -> int:
        return self.process.pid

    def close(self) -> None:
        # a spare without a job exits; a supervisor with one hands nothing on
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class Launcher:
    def __init__(self, spool: Spool):
        self.spool = spool
        self.spare: Optional[Supervisor] = None
        self.children: list[subprocess.Popen] = []  # reaped once they exit

    def launch(self, claim: Claim, order: StartOrder) -> Supervisor:
        """Hand the claimed job to the spare (else a new supervisor); OSError if none could be reached."""
        supervisor, self.spare = self.spare, None
        if supervisor is None or not _hand_over(supervisor, claim, order):
            if supervisor is not None:
                supervisor.close()
            supervisor = self._start()
            if not _hand_over(supervisor, claim, order):
                supervisor.close()
                raise OSError("the supervisor started for the job could not be reached")
        claim.detach()
        return supervisor

    def tend(self, spare: bool) -> None:
        self.children = [child for child in self.children if child.poll() is None]
        if spare and (self.spare is None or self.spare.poll() is not None):
            try:
                self.spare = self._start()
            except OSError:
                self.spare = None  # jobs then start the slower way

    def close(self) -> None:
        # the spare exits when its socket closes (also when the worker dies)
        if self.spare is not None:
            self.spare.close()
            self.spare = None

    def _start(self) -> Supervisor:
        mine, theirs = socket.socketpair()
        # this package's parent, then the worker's path (not the current directory, a blank entry)
        path = [PACKAGE_PARENT] + [p for p in sys.path if p and p != PACKAGE_PARENT]
        cmd = [sys.executable, "-S", "-c", BOOT, str(len(path)), *path, "--home", str(self.spool.home)]
        try:
            log = self.spool.logs.open_worker_log()
            try:
                process = subprocess.Popen(
                    [*cmd, "--spare-fd", str(theirs.fileno())],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,
                )
            finally:
                os.close(log)
        except OSError:
            mine.close()
            raise
        finally:
            theirs.close()
        self.children.append(process)
        return Supervisor(mine, process)


def _hand_over(supervisor: Supervisor, claim: Claim, order: StartOrder) -> bool:
    try:
        if supervisor.poll() is not None or supervisor.sock is None:
            return False
        socket.send_fds(supervisor.sock, [order.encode()], [claim.fd])
        return True
    except OSError:
        return False
