"""Handing a claimed job to its supervisor, as fast as Python allows.

A supervisor is a fresh interpreter (`python -S`, with the worker's import path passed in: `site`
and its .pth files were the largest single cost between the worker's decision and the job's first
instruction). While jobs are queued or running the launcher keeps one supervisor started ahead of
time (a "spare", waiting on a socket pair); a job and its claim's descriptor go to it over the
socket (SCM_RIGHTS), so the job does not wait for an interpreter to start. Without a spare the
supervisor is started for the job directly.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from gpuq.spool import Claim, Spool

PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent.parent)
# argv: N, N path entries, then the supervisor's own arguments.
SUPERVISOR_BOOT = (
    "import sys; n = int(sys.argv[1]); sys.path[:0] = sys.argv[2 : 2 + n]; del sys.argv[1 : 2 + n]; "
    "from gpuq.run.supervisor import main; sys.exit(main())"
)


def supervisor_path() -> list[str]:
    """This package's parent, then the worker's own import path (blank entries mean "the current
    directory", which the supervisor must not search)."""
    return [PACKAGE_PARENT] + [p for p in sys.path if p and p != PACKAGE_PARENT]


@dataclass
class Spare:
    process: subprocess.Popen
    sock: Any  # our end of the socket pair; the spare waits for a job on the other


class Launcher:
    def __init__(self, spool: Spool):
        self.spool = spool
        self.spare: Optional[Spare] = None

    def launch(
        self, claim: Claim, slot: Optional[str], gpus: Optional[tuple[int, ...]], settings: dict[str, Any]
    ) -> subprocess.Popen:
        """Hand the claimed job to a supervisor, with where it runs (`slot`: its
        CUDA_VISIBLE_DEVICES, `gpus`: the GPUs it holds) and the worker's `settings` for it (its
        hooks, the log cap); afterwards the supervisor owns the claim. OSError if none could be
        started (the claim is then still ours)."""
        where = {"id": claim.job_id, "slot": slot, "gpus": list(gpus) if gpus is not None else None, **settings}
        spare, self.spare = self.spare, None
        process = self._hand_over(spare, claim, where) if spare else None
        if process is None:
            process = self._start_for(claim, where)
        claim.detach()
        return process

    def keep_a_spare(self) -> None:
        """Start a supervisor ahead of time, so the next job does not wait for an interpreter."""
        if self.spare is not None and self.spare.process.poll() is None:
            return
        mine, theirs = socket.socketpair()
        log = self.spool.logs.open_worker_log()
        try:
            process = subprocess.Popen(
                self._supervisor_cmd("--spare-fd", str(theirs.fileno())),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        except OSError:
            mine.close()
            return  # jobs then start the slower way
        finally:
            theirs.close()
            os.close(log)
        self.spare = Spare(process, mine)

    def close_spare(self) -> None:
        """The spare exits when its socket closes (also when the worker dies)."""
        if self.spare is not None:
            self.spare.sock.close()
            self.spare = None

    def _supervisor_cmd(self, *args: str) -> list[str]:
        path = supervisor_path()
        boot = [sys.executable, "-S", "-c", SUPERVISOR_BOOT, str(len(path)), *path]
        return [*boot, "--home", str(self.spool.home), *args]

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
    def _hand_over(spare: Spare, claim: Claim, where: dict[str, Any]) -> Optional[subprocess.Popen]:
        """Give a job and its claim to the spare supervisor; None if the spare is gone."""
        try:
            if spare.process.poll() is not None:
                return None
            socket.send_fds(spare.sock, [json.dumps(where).encode()], [claim.fd])
            return spare.process
        except OSError:
            return None
        finally:
            spare.sock.close()
