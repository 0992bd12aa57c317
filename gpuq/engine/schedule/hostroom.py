"""Host memory and CPUs: whether the machine has room for a job that says what it needs of it
(`gpuq add --mem 32G --cpus 8`; spool_layout.md section 12a). No overtaking, as for GPUs: once a job
waits for a resource, later jobs that ask for it wait behind it, so small jobs cannot starve a big one.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable, Iterator, NamedTuple, Optional

from gpuq.core.job import Job
from gpuq.core.timespec import parse_size_mib
from gpuq.core.words import plural, size_text
from gpuq.engine.schedule import diskguard
from gpuq.engine.schedule.scheduler import Wait
from gpuq.system import host

MARGIN_ENV = "GPUQ_HOST_MEM_MARGIN"  # host memory gpuq leaves to the system (a size: 4G)
MIN_MARGIN_MIB = 2048  # the default margin: the larger of 2 GiB...
MARGIN_SHARE = 0.05  # ...and 5% of the machine's memory
MEMORY, CPUS = "host memory", "CPUs"


def asks(job: Job) -> bool:
    return bool(job.mem_mib or job.cpus)


def request_text(job: Job) -> str:
    """`10G host memory, 4 CPUs` (what `gpuq show` says a job reserves); '' for none."""
    parts = [f"{size_text(job.mem_mib)} host memory"] if job.mem_mib else []
    if job.cpus:
        parts.append(plural(job.cpus, "CPU"))
    return ", ".join(parts)


class Cap(NamedTuple):  # what a worker may hand out
    mem_mib: int
    cpus: int


def cap(
    mem_setting: Optional[int],
    cpus_setting: Optional[int],
    machine_mib: Optional[int] = None,
    machine_cpus: Optional[int] = None,
    say: Callable[[str], None] = lambda line: None,
) -> Cap:
    """A worker's cap: its `--mem`/`--cpus`, else the machine's (less the margin). A setting above what
    the machine has is kept as given, and said."""
    machine_mib = host.memory_mib() if machine_mib is None else machine_mib
    machine_cpus = host.usable_cpus() if machine_cpus is None else machine_cpus
    margin = max(MIN_MARGIN_MIB, int(machine_mib * MARGIN_SHARE))  # left to the system
    if os.environ.get(MARGIN_ENV):
        try:
            margin = parse_size_mib(os.environ[MARGIN_ENV], MARGIN_ENV)
        except ValueError as exc:
            say(f"{exc}; leaving the default {size_text(margin)} to the system")
    mem = max(machine_mib - margin, 0)
    if mem_setting is not None and mem_setting > mem:
        say(
            f"--mem {size_text(mem_setting)} is more than this machine's {size_text(machine_mib)} less "
            f"{size_text(margin)} for the system: jobs may reserve up to {size_text(mem_setting)}, as asked"
        )
    if cpus_setting is not None and cpus_setting > machine_cpus:
        say(f"--cpus {cpus_setting} is more than the {machine_cpus} CPUs this worker may use: as asked")
    return Cap(mem if mem_setting is None else mem_setting, machine_cpus if cpus_setting is None else cpus_setting)


class _Pool:
    def __init__(self, what: str, total: int, show: Callable[[int], str]) -> None:
        self.what, self.total, self.show = what, total, show
        self.held: dict[int, int] = {}  # job id -> what it reserved
        self.first_waiting: Optional[int] = None

    def wait(self, job_id: int, amount: int) -> Optional[Wait]:
        """Why `amount` cannot be had now (None: it can); a job refused is the one others wait behind."""
        if amount > self.total:
            return Wait(
                f"needs {self.show(amount)} {self.what}; this worker hands out at most {self.show(self.total)}", True
            )
        if self.first_waiting is not None:
            return Wait(f"waiting behind #{self.first_waiting} for {self.what}", False)
        used = sum(self.held.values())
        if used + amount <= self.total:
            return None
        self.first_waiting = job_id
        holders = ", ".join(f"#{i}" for i in sorted(self.held))
        reserved = f"{self.show(used)} of {self.show(self.total)} reserved by {holders}"
        return Wait(f"waiting for {self.what}: {reserved} (it needs {self.show(amount)})", False)


class Room:
    """What is left of a cap at one plan, made only when a job that asks is met."""

    def __init__(self, cap: Callable[[], Cap], holders: Callable[[], Iterable[Job]]) -> None:
        self._cap, self._holders = cap, holders
        self._pools: Optional[tuple[_Pool, _Pool]] = None

    def _made(self) -> tuple[_Pool, _Pool]:
        if self._pools is None:
            limits = self._cap()
            mem, cpus = _Pool(MEMORY, limits.mem_mib, size_text), _Pool(CPUS, limits.cpus, str)
            for job in self._holders():
                if job.mem_mib:
                    mem.held[job.id] = job.mem_mib
                if job.cpus:
                    cpus.held[job.id] = job.cpus
            self._pools = mem, cpus
        return self._pools

    def admit(self, job: Job) -> Optional[Wait]:
        """None: the job may start, and what it asks is now reserved in this room; else why it waits."""
        if not asks(job):
            return None
        asked = [(pool, amount) for pool, amount in zip(self._made(), (job.mem_mib, job.cpus)) if amount]
        if any(job.id in pool.held for pool, _amount in asked):
            return None  # being started already (its claim keeps it from starting twice): counted once
        never = [w for w in (pool.wait(job.id, a) for pool, a in asked if a > pool.total) if w is not None]
        waits = never or [w for w in (pool.wait(job.id, amount) for pool, amount in asked) if w is not None]
        if waits:
            return waits[0]
        for pool, amount in asked:
            pool.held[job.id] = amount
        return None

    def admitted(self, ready: Iterable[Job], waits: dict[int, Wait]) -> Iterator[Job]:
        for job in ready:
            wait = diskguard.wait(job) or self.admit(job)  # no room for its next checkpoint: it waits
            if wait is None:
                yield job
            else:
                waits[job.id] = wait
