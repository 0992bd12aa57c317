"""Placement counting other parties' leases (issue 28, lease_layout.md "Counting"): pure decisions,
leases and GPUs built here directly."""

from __future__ import annotations

import os
import time
from typing import Optional

from gpuq.engine.schedule.placement import Blocked, Holding, Leased, Placement, Request, place, place_in_order
from gpuq.system.gpus import Gpu, GpuProcess
from gpuq.system.leases import Lease

H100 = 81559
GIB = 1024
SINCE = 1733300000.0  # shown as HH:MM in the local time zone
AT = time.strftime("%H:%M", time.localtime(SINCE))
OTHER = os.geteuid() + 1000  # another user than the one deciding


def gpu(index: int, processes: tuple = ()) -> Gpu:
    used = sum(m for _, m in processes)
    return Gpu(index, "Fake H100", f"GPU-fake-{index}", H100, used, tuple(GpuProcess(p, m) for p, m in processes))


def leased(
    index: int,
    mem_mib: Optional[int] = None,
    job: Optional[int] = 12,
    uid: int = OTHER,
    pids: frozenset[int] = frozenset(),
    name: str = "train",
) -> Leased:
    lease = Lease(
        f"GPU-fake-{index}.{uid}.4242.1.lease",
        f"GPU-fake-{index}",
        index,
        mem_mib,
        "bob",
        uid,
        4242,
        0.0,
        job,
        name,
        None if job is None else "/home/bob/.gpuq",
        SINCE,
        "gpu01",
    )
    return Leased(lease, pids)


TWO = [gpu(0), gpu(1)]


def test_a_whole_lease_keeps_a_whole_job_off_its_gpu_and_is_named() -> None:
    assert place(Request(), TWO, leased=[leased(0)]) == Placement((1,))
    blocked = place(Request(), TWO, holdings=[Holding(5, (1,), None)], leased=[leased(0)])
    assert blocked == Blocked(f"waiting for GPU 0: leased whole by bob's job #12 since {AT}; GPU 1: job #5", False)


def test_a_whole_lease_keeps_shared_jobs_off_and_a_memory_lease_keeps_whole_jobs_off() -> None:
    assert place(Request(gpu_mem_mib=GIB), TWO, leased=[leased(0), leased(1)]) == Blocked(
        f"waiting for GPU 0: leased whole by bob's job #12 since {AT}; GPU 1: leased whole by bob's job #12 since {AT}",
        False,
    )
    blocked = place(Request(), [gpu(0)], leased=[leased(0, mem_mib=20 * GIB, job=None, name="jupyter")])
    assert blocked == Blocked(
        f"waiting for GPU 0: 20.0 GiB leased by bob's `jupyter` (gpuq lease, pid 4242) since {AT}", False
    )


def test_memory_leases_add_up() -> None:
    two_leases = [leased(0, mem_mib=30 * GIB), leased(0, mem_mib=30 * GIB, job=13)]
    assert place(Request(gpu_mem_mib=15 * GIB), [gpu(0)], leased=two_leases) == Placement((0,))
    assert place(Request(gpu_mem_mib=20 * GIB), [gpu(0)], leased=two_leases) == Blocked(
        f"waiting for GPU 0: 30.0 GiB leased by bob's job #12 since {AT}, 30.0 GiB leased by bob's job #13 since {AT}",
        False,
    )
    # with gpuq's own shared job beside them: 30 + 30 + 10 + 10 > 79.6
    own = [Holding(1, (0,), 10 * GIB)]
    assert isinstance(place(Request(gpu_mem_mib=10 * GIB), [gpu(0)], holdings=own, leased=two_leases), Blocked)
    assert place(Request(gpu_mem_mib=9 * GIB), [gpu(0)], holdings=own, leased=two_leases) == Placement((0,))


def test_a_leaseholders_processes_are_its_lease_not_outside_memory() -> None:
    """40 GiB used by the holder of a 20 GiB lease counts once, as the lease's, for its larger size."""
    busy = [gpu(0, processes=((500, 40 * GIB),))]
    mine = leased(0, mem_mib=20 * GIB, pids=frozenset({500, 501}))
    assert place(Request(gpu_mem_mib=39 * GIB), busy, leased=[mine]) == Placement((0,))
    assert isinstance(place(Request(gpu_mem_mib=40 * GIB), busy, leased=[mine]), Blocked)
    # the same process without the lease's tree: outside memory, on top of the lease
    stranger = leased(0, mem_mib=20 * GIB)
    assert isinstance(place(Request(gpu_mem_mib=30 * GIB), busy, leased=[stranger]), Blocked)
    # whole requests: blocked by the lease, and its holder's memory is not named as someone else's
    blocked = place(Request(), busy, leased=[mine])
    assert blocked == Blocked(f"waiting for GPU 0: 20.0 GiB leased by bob's job #12 since {AT}, using 40.0 GiB", False)


def test_a_leaseholder_using_more_than_its_lease_is_said_to_use_it() -> None:
    """Bob's 30 GiB lease, his job using 60 GiB: a 30 GiB job waits, and its reason says the 60 GiB
    ("30.0 GiB leased", read alone, left room for it on a 79.6 GiB GPU)."""
    busy = [gpu(0, processes=((500, 60 * GIB),))]
    over = leased(0, mem_mib=30 * GIB, pids=frozenset({500}))
    blocked = place(Request(gpu_mem_mib=30 * GIB), busy, leased=[over])
    assert blocked == Blocked(f"waiting for GPU 0: 30.0 GiB leased by bob's job #12 since {AT}, using 60.0 GiB", False)
    within = [gpu(0, processes=((500, 20 * GIB),))]  # using less than its lease: the lease is what it holds
    blocked = place(Request(gpu_mem_mib=60 * GIB), within, leased=[over])
    assert blocked == Blocked(f"waiting for GPU 0: 30.0 GiB leased by bob's job #12 since {AT}", False)


def test_ones_own_lease_says_so_and_that_its_job_is_of_another_queue() -> None:
    """Placement counts the leases of other spools only (a worker's own jobs are its holdings): one
    of this user's is a job of another queue, whose #3 is not the #3 of the queue that waits."""
    blocked = place(Request(), [gpu(0)], leased=[leased(0, job=3, uid=os.geteuid())])
    why = f"waiting for GPU 0: leased whole by your job #3 in another queue since {AT}"
    assert blocked == Blocked(why, False)


def test_place_in_order_counts_leases_for_every_job() -> None:
    decisions = place_in_order([(1, Request()), (2, Request())], TWO, leased=[leased(1)])
    assert decisions[1] == Placement((0,))
    assert decisions[2] == Blocked(f"waiting for GPU 1: leased whole by bob's job #12 since {AT}; GPU 0: job #1", False)


def test_a_lease_of_another_gpu_does_not_count() -> None:
    assert place(Request(), [gpu(0)], leased=[leased(7)]) == Placement((0,))
