"""The worker's look at the clusters its pending jobs wait for. A job queued `--after` one handed to
Slurm or Ray may start once a sync of that hand-over records the other's end, and nobody need run
`gpuq status` for it: the worker syncs the hand-overs itself, only while a pending job waits for a
job in slurm/ or ray/, at most every SYNC_SECONDS, and in a thread of its own, so that a cluster
that does not answer (each client gives up after its own timeout) never holds up a step.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from gpuq.core.errors import GpuqError
from gpuq.core.job import Job
from gpuq.core.states import RAY, SLURM
from gpuq.engine.lifecycle import ray_handover, slurm_handover
from gpuq.spool import Spool

SYNC_SECONDS = 5.0  # the least time between two syncs the worker starts


class ClusterWatch:
    def __init__(self, spool: Spool, say: Callable[[str], None]) -> None:
        self.home, self.say = spool.home, say
        self.kinds: frozenset[str] = frozenset()  # the hand-overs (SLURM, RAY) pending jobs waited for at the last look
        self.last = float("-inf")  # when the last sync was started
        self.thread: Optional[threading.Thread] = None
        self.news = threading.Event()  # a sync moved a job out of slurm/ or ray/: the queue changed
        self.wake: Callable[[], None] = lambda: None  # tells the worker's loop to look now
        self.said: dict[str, str] = {}  # hand-over -> the last warning said of it (each said once)

    def look(self, pending: list[Job], states: dict[int, str], now: float) -> bool:
        """At a full look: whether some pending job waits for a job on a cluster (then a sync is
        started when one is due)."""
        afters = [dep for job in pending for dep in job.after + job.after_any]
        self.kinds = frozenset(states[dep] for dep in afters if states.get(dep) in (SLURM, RAY))
        self.poke(now)
        return bool(self.kinds)

    def poke(self, now: float) -> None:
        """Start a sync of what the pending jobs wait for, unless one runs or ran too recently."""
        if not self.kinds or now - self.last < SYNC_SECONDS:
            return
        if self.thread is not None and self.thread.is_alive():
            return
        self.last = now
        self.thread = threading.Thread(target=self._sync, args=(self.kinds,), name="gpuq-cluster-sync", daemon=True)
        self.thread.start()

    def take_news(self) -> bool:
        """Whether a sync moved jobs since the last call (the worker's view then reads the tree again)."""
        news = self.news.is_set()
        self.news.clear()
        return news

    def _sync(self, kinds: frozenset[str]) -> None:
        spool = Spool(self.home)  # its own: the worker's is used by the step meanwhile
        moved = False
        for kind in sorted(kinds):
            try:
                if kind == SLURM:
                    moved = bool(slurm_handover.sync(spool).ended) or moved
                else:
                    report = ray_handover.sync(spool)
                    moved = bool(report.ended or report.back) or moved
            except (GpuqError, OSError) as exc:
                line = f"could not ask {kind.capitalize()} about the jobs handed to it: {exc}"
                if self.said.get(kind) != line:
                    self.said[kind] = line
                    self.say(line)
            else:
                self.said.pop(kind, None)
        if moved:
            self.news.set()
            self.wake()
