"""The selected job's log in `gpuq top`, read as `gpuq log -f` reads it."""

from __future__ import annotations

from collections import deque

from gpuq.core.job import Job
from gpuq.core.states import ACTIVE, CANCELLED, HELD, PENDING
from gpuq.spool import Spool

KEPT_LINES = 2000  # enough for any screen; the log itself stays in the spool


class LogFollow:
    def __init__(self, spool: Spool, job: Job, state: str, lines: int = 200) -> None:
        self.spool, self.job, self.state = spool, job, state
        self.lines: deque[str] = deque(maxlen=KEPT_LINES)
        self.partial = ""  # a line not ended yet (a tqdm bar ends it with \r)
        self.offset = spool.logs.size(job)
        if self.offset == 0 and state in (PENDING, HELD, CANCELLED):
            self.lines.append(f"(#{job.id} has not started: no log yet)")
        else:
            self.lines.extend(spool.logs.tail_lines(job, lines))

    def title(self) -> str:
        following = ", following" if self.running() else ""
        return f"log of #{self.job.id} {self.job.name} ({self.state}{following})"

    def running(self) -> bool:
        return self.spool.jobs.find(self.job.id, ACTIVE) is not None

    def poll(self) -> bool:
        chunk = self.spool.logs.read_from(self.job, self.offset)
        if not chunk:
            return False
        self.offset += len(chunk)
        text = self.partial + chunk.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
        *complete, self.partial = text.split("\n")
        self.lines.extend(complete)
        return True

    def shown(self) -> list[str]:
        return list(self.lines) + ([self.partial] if self.partial else [])
