"""A job's GPU leases (lease_layout.md): taken by its supervisor before the job starts and held until
its processes are gone, so that every user's gpuq on the machine sees those GPUs taken.
"""

from __future__ import annotations

from typing import Iterable

from gpuq.core.job import Job
from gpuq.engine.schedule import leasing
from gpuq.engine.schedule.leasing import claim_gpus
from gpuq.engine.schedule.placement import DEFAULT_FOREIGN_THRESHOLD_MIB, Blocked, Request
from gpuq.run.supervisor.order import StartOrder
from gpuq.spool import Spool
from gpuq.system.leases import Held, spool_ids


class GpusTaken(Exception):
    """The GPUs the worker chose were leased by another party, or filled, since it looked."""


def take(spool: Spool, order: StartOrder, job: Job, replacing: Iterable[Held] = ()) -> list[Held]:
    """The leases of the order's GPUs for `job`, against every live lease but those `replacing`: the
    one check of a start made again here, because it is atomic. GpusTaken if they no longer fit; []
    for a CPU job, and where the lease directory cannot be used (`unsaid` says why)."""
    if not order.gpus:
        return []
    replaced = {held.lease.file for held in replacing}
    ids = spool_ids(str(spool.home), spool.lease_id.get())
    threshold = order.foreign_threshold_mib
    outcome = claim_gpus(
        Request(job.gpu_request, job.gpu_mem_mib),
        candidates=order.gpus,
        exclude=lambda lease: lease.file in replaced,
        threshold=DEFAULT_FOREIGN_THRESHOLD_MIB if threshold is None else threshold,
        job=job.id,
        name=job.name,
        spool=ids[0],
        mine=ids,
        log=_unsaid.append,
    )
    if isinstance(outcome, Blocked):
        raise GpusTaken(outcome.reason)
    return outcome


def release(leases: Iterable[Held]) -> None:
    for held in leases:
        held.release()


def record_usage(leases: Iterable[Held]) -> None:
    """The GPU-hours these leases held, added to this user's recent usage (leasing.record_usage). A
    handed-on slot records them after the next job started, which never waits for it."""
    leasing.record_usage(leases, _unsaid.append)


_unsaid: list[str] = []  # problems with the lease directory (each once per process), for the job's log


def unsaid() -> list[str]:
    """What was met with the lease directory since the last call, for the job's log."""
    lines = _unsaid[:]
    _unsaid.clear()
    return lines
