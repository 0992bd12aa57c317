"""A job's GPU leases (lease_layout.md): taken by its supervisor before the job starts, on the GPUs
the worker chose, and held by this process until the job's processes are gone (released just
before its end is recorded), so that every user's gpuq on the machine sees those GPUs taken. Should
this process be killed, the kernel drops the leases' locks at once. A CPU job takes none.
"""

from __future__ import annotations

from typing import Iterable

from gpuq.core.job import Job
from gpuq.engine.schedule.leasing import claim_gpus
from gpuq.engine.schedule.placement import DEFAULT_FOREIGN_THRESHOLD_MIB, Blocked, Request
from gpuq.run.supervisor.order import StartOrder
from gpuq.system.leases import Held


class GpusTaken(Exception):
    """The GPUs the worker chose are no longer free: another party (another user's job, a
    `gpuq lease`) leased them, or processes took their memory, since the worker looked."""


def take(home: str, order: StartOrder, job: Job, replacing: Iterable[Held] = ()) -> list[Held]:
    """The leases of the order's GPUs for `job`, decided under the GPUs' placing locks against every
    live lease but those `replacing` (the ended job's, when its supervisor hands the slot on) and the
    memory that processes hold on them: the one check of a start that is made again here, because
    it is atomic. GpusTaken if they no longer fit; [] for a CPU job, and where the lease directory
    cannot be used (said once, in the job's log: `unsaid`)."""
    if not order.gpus:
        return []
    replaced = {held.lease.file for held in replacing}
    threshold = order.foreign_threshold_mib
    outcome = claim_gpus(
        Request(job.gpu_request, job.gpu_mem_mib),
        candidates=order.gpus,
        exclude=lambda lease: lease.file in replaced,
        threshold=DEFAULT_FOREIGN_THRESHOLD_MIB if threshold is None else threshold,
        job=job.id,
        name=job.name,
        spool=home,
        log=_unsaid.append,
    )
    if isinstance(outcome, Blocked):
        raise GpusTaken(outcome.reason)
    return outcome


def release(leases: Iterable[Held]) -> None:
    for held in leases:
        held.release()


_unsaid: list[str] = []  # problems with the lease directory (each once per process), for the job's log


def unsaid() -> list[str]:
    """What was met with the lease directory since the last call, for the log of the job it
    concerns (begin writes them after the job's attempt header)."""
    lines = _unsaid[:]
    _unsaid.clear()
    return lines
