"""gpuq.engine.schedule.placement: pure decisions over GPUs as a look gives them (built here directly)."""

from __future__ import annotations

from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.engine.schedule.placement import (
    CPU_ONLY,
    DEFAULT_FOREIGN_THRESHOLD_MIB,
    GPUS,
    UNREADABLE,
    Blocked,
    Holding,
    Placement,
    Request,
    mode_of,
    place,
    place_in_order,
    unreadable,
)
from gpuq.system.gpus import Gpu, GpuLook, GpuProcess

H100 = 81559  # MiB, as nvidia-smi reports an H100 80GB


def gpu(index: int, used: int = 0, processes: tuple = (), total: int = H100) -> Gpu:
    return Gpu(index, "Fake H100", f"GPU-fake-{index}", total, used, tuple(GpuProcess(p, m) for p, m in processes))


def alice(pid: int) -> str:
    return {4242: "python, user alice", 99: "jupyter, user bob"}.get(pid, "not visible here")


TWO = [gpu(0), gpu(1)]


# ------------------------------------------------------------------ whole GPUs


def test_one_job_per_gpu() -> None:
    decisions = place_in_order([(1, Request()), (2, Request()), (3, Request())], TWO)
    assert decisions[1] == Placement((0,)) and decisions[2] == Placement((1,))
    assert decisions[3] == Blocked("waiting for a free GPU (0: job #1, 1: job #2)", forever=False)


def test_two_gpus_are_two_distinct_indices() -> None:
    four = [gpu(i) for i in range(4)]
    assert place(Request(gpus=2), four, holdings=[Holding(7, (0,), None)]) == Placement((1, 2))
    decisions = place_in_order([(1, Request(gpus=2)), (2, Request(gpus=2))], four)
    assert decisions == {1: Placement((0, 1)), 2: Placement((2, 3))}


def test_whole_gpu_job_waits_for_a_gpu_holding_shared_jobs() -> None:
    holdings = [Holding(3, (0,), 10240), Holding(5, (1,), None)]
    assert place(Request(), TWO, None, holdings) == Blocked("waiting for a free GPU (0: job #3, 1: job #5)", False)


def test_cpu_jobs_start_beside_gpu_jobs() -> None:
    holdings = [Holding(1, (0,), None), Holding(2, (1,), None)]
    decisions = place_in_order([(3, Request()), (4, Request(gpus=0)), (5, Request(gpus=0))], TWO, None, holdings)
    assert isinstance(decisions[3], Blocked)
    assert decisions[4] == decisions[5] == Placement(())  # not held up behind the waiting GPU job


def test_foreign_process_delays_a_whole_gpu_job_and_is_named() -> None:
    busy = [gpu(0, used=9300, processes=((4242, 9300),))]
    decision = place(Request(), busy, describe=alice)
    assert decision == Blocked("waiting for GPU 0: 9.1 GiB held by pid 4242 (python, user alice)", forever=False)
    assert place(Request(), busy + [gpu(1)], describe=alice) == Placement((1,))  # another GPU is free
    gone = [gpu(0, used=3)]
    assert place(Request(), gone, describe=alice) == Placement((0,))  # once it has ended


def test_small_foreign_use_under_the_threshold_does_not_block() -> None:
    context = [gpu(0, used=500, processes=((99, 500),))]
    assert place(Request(), context) == Placement((0,))
    assert isinstance(place(Request(), context, foreign_threshold_mib=256), Blocked)
    assert DEFAULT_FOREIGN_THRESHOLD_MIB == 1024


def test_reason_names_the_two_largest_holders_then_a_count() -> None:
    crowded = [gpu(0, used=7000, processes=((1, 1000), (4242, 3000), (99, 2000), (3, 1000)))]
    decision = place(Request(), crowded, describe=alice)
    assert decision.reason == (
        "waiting for GPU 0: 2.9 GiB held by pid 4242 (python, user alice), "
        "2.0 GiB by pid 99 (jupyter, user bob), and 2 more"
    )


def test_memory_no_listed_process_explains_counts_as_foreign() -> None:
    hidden = [gpu(0, used=5000)]  # e.g. a process in another container
    decision = place(Request(), hidden, describe=alice)
    assert decision.reason == "waiting for GPU 0: 4.9 GiB in use by no listed process (hidden from this container?)"
    listed_but_more = [gpu(0, used=5000, processes=((4242, 600),))]
    assert "4.3 GiB in use by no listed process" in place(Request(), listed_but_more, describe=alice).reason


def test_gpuq_process_on_a_gpu_its_job_does_not_hold_still_blocks_it() -> None:
    stray = [gpu(0), gpu(1, used=6000, processes=((500, 6000),))]
    holdings = [Holding(3, (0,), None, frozenset({500}))]
    decision = place(Request(), stray, None, holdings, own_pids={500}, describe=alice)
    assert decision == Blocked("waiting for GPU 1: 5.9 GiB held by pid 500 (gpuq job #3); GPU 0: job #3", False)
    adopted = place(Request(), [gpu(0, used=6000, processes=((600, 6000),))], own_pids={600})
    assert adopted.reason == "waiting for GPU 0: 5.9 GiB held by pid 600 (a gpuq job)"


def test_own_processes_on_their_gpu_are_not_foreign() -> None:
    # Job 3 shares GPU 0 and its process uses 9 GiB: a second shared job sees it as committed, not foreign.
    mine = [gpu(0, used=9216, processes=((500, 9216),))]
    holdings = [Holding(3, (0,), 10240, frozenset({500}))]
    assert place(Request(1, 20480), mine, None, holdings, {500}) == Placement((0,))
    decision = place(Request(1, 72000), mine, None, holdings, {500})
    assert decision == Blocked("waiting for 70.3 GiB on a GPU (most free: GPU 0, 69.6 GiB)", False)


# ------------------------------------------------------------------ shared GPUs


def test_two_shared_jobs_fit_on_one_gpu_and_a_third_waits_for_memory() -> None:
    one = [gpu(0)]
    requests = [(1, Request(1, 30720)), (2, Request(1, 30720)), (3, Request(1, 30720))]
    decisions = place_in_order(requests, one)
    assert decisions[1] == decisions[2] == Placement((0,))
    assert decisions[3] == Blocked("waiting for 30.0 GiB on a GPU (most free: GPU 0, 19.6 GiB)", forever=False)


def test_a_shared_job_counts_what_it_uses_when_that_is_more_than_declared() -> None:
    over = [gpu(0, used=51200, processes=((500, 51200),))]
    holdings = [Holding(3, (0,), 10240, frozenset({500}))]
    assert isinstance(place(Request(1, 30720), over, None, holdings, {500}), Blocked)  # 50 + 30 > 79.6
    assert place(Request(1, 20480), over, None, holdings, {500}) == Placement((0,))  # 50 + 20 fits
    # declared more than used: the declaration counts
    under = [gpu(0, used=1024, processes=((500, 1024),))]
    big = [Holding(3, (0,), 71680, frozenset({500}))]
    assert isinstance(place(Request(1, 10240), under, None, big, {500}), Blocked)


def test_shared_jobs_never_go_onto_a_whole_gpu_job_and_vice_versa() -> None:
    assert place(Request(1, 1024), [gpu(0)], None, [Holding(1, (0,), None)]) == Blocked(
        "waiting for a free GPU (0: job #1)", False
    )
    assert place(Request(), [gpu(0)], None, [Holding(1, (0,), 1024)]) == Blocked(
        "waiting for a free GPU (0: job #1)", False
    )


def test_shared_request_prefers_the_tightest_fit() -> None:
    gpus = [gpu(0), gpu(1), gpu(2, total=143771)]
    holdings = [Holding(1, (1,), 40960), Holding(2, (2,), 40960)]
    # free: 0 -> 79.6 GiB, 1 -> 39.6 GiB, 2 -> 100.4 GiB: 20 GiB goes to GPU 1, 50 GiB to GPU 0
    assert place(Request(1, 20480), gpus, None, holdings) == Placement((1,))
    assert place(Request(1, 51200), gpus, None, holdings) == Placement((0,))
    assert place(Request(1, 20480), [gpu(0), gpu(1)]) == Placement((0,))  # ties: lower index


def test_shared_request_for_two_gpus_needs_two_that_each_fit() -> None:
    gpus = [gpu(0), gpu(1), gpu(2)]
    holdings = [Holding(1, (1,), 71680)]
    assert place(Request(2, 20480), gpus, None, holdings) == Placement((0, 2))
    blocked = place(Request(2, 20480), gpus[:2], None, holdings)
    assert blocked == Blocked(
        "waiting for 20.0 GiB on each of 2 GPUs (1 fits now; most free of the others: GPU 1, 9.6 GiB)", False
    )


def test_foreign_memory_that_keeps_a_shared_job_out_is_named() -> None:
    full = [gpu(0, used=70000, processes=((4242, 70000),))]
    assert place(Request(1, 8192), full, describe=alice) == Placement((0,))  # fits beside it
    decision = place(Request(1, 20480), full, describe=alice)
    assert decision == Blocked("waiting for GPU 0: 68.4 GiB held by pid 4242 (python, user alice)", False)


# ------------------------------------------------------------------ never


def test_a_job_that_can_never_fit_is_blocked_forever() -> None:
    assert place(Request(gpus=4), TWO) == Blocked("needs 4 GPUs; this worker has 2 (0,1)", forever=True)
    assert place(Request(gpus=2), TWO, allowed=[1, 5]) == Blocked(
        "needs 2 GPUs; this worker has 1 (1); GPU 5 not found on this machine", forever=True
    )
    assert place(Request(1, 204800), TWO) == Blocked(
        "needs 200.0 GiB on a GPU; the largest here is GPU 0 with 79.6 GiB", forever=True
    )
    # on each of 2 GPUs, the smaller of the 2 largest bounds what fits (the largest alone would not)
    assert place(Request(2, 61440), [gpu(0), gpu(1, total=40000), gpu(2, total=H100 // 2)]) == Blocked(
        "needs 60.0 GiB on each of 2 GPUs; the smallest of the 2 largest here is GPU 2 with 39.8 GiB", forever=True
    )


def test_a_never_job_does_not_hold_up_the_queue_but_a_waiting_one_does() -> None:
    holdings = [Holding(1, (0,), None)]
    requests = [(2, Request(gpus=3)), (3, Request()), (4, Request(gpus=2)), (5, Request())]
    decisions = place_in_order(requests, TWO, None, holdings)
    assert decisions[2].forever and decisions[3] == Placement((1,))
    assert decisions[4] == Blocked("waiting for 2 free GPUs (0: job #1, 1: job #3)", forever=False)
    assert decisions[5] == Blocked("waiting for a free GPU (0: job #1, 1: job #3)", forever=False)
    # job 4 first in line: job 5 would fit (alone it is placed) but waits behind it
    later = place_in_order([(4, Request(gpus=2)), (5, Request())], TWO, None, holdings)
    assert later[5] == Blocked("waiting behind job #4 (first in line for a GPU)", forever=False)
    assert place(Request(), TWO, None, holdings) == Placement((1,))


# ------------------------------------------------------------------ one step never double-books


@st.composite
def scenes(draw: st.DrawFn) -> tuple[list[Gpu], list[tuple[int, Request]]]:
    count = draw(st.integers(1, 4))
    gpus = []
    for i in range(count):
        total = draw(st.sampled_from([24576, 40960, 81559]))
        foreign = draw(st.integers(0, total // 2))
        gpus.append(gpu(i, used=foreign, processes=((9000 + i, foreign),) if foreign else (), total=total))
    requests = []
    for job in range(1, draw(st.integers(1, 10)) + 1):
        n = draw(st.integers(0, 3))
        mem: Optional[int] = draw(st.one_of(st.none(), st.integers(1024, 50000))) if n else None
        requests.append((job, Request(n, mem)))
    return gpus, requests


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_place_in_order_never_double_books(scene: tuple) -> None:
    gpus, requests = scene
    decisions = place_in_order(requests, gpus)
    asked = dict(requests)
    by_gpu: dict[int, list[int]] = {g.index: [] for g in gpus}
    for job, decision in decisions.items():
        if isinstance(decision, Placement):
            assert len(decision.gpus) == asked[job].gpus and len(set(decision.gpus)) == len(decision.gpus)
            for index in decision.gpus:
                by_gpu[index].append(job)
    for g in gpus:
        jobs = by_gpu[g.index]
        whole = [j for j in jobs if asked[j].gpu_mem_mib is None]
        assert not whole or jobs == whole[:1]  # a whole GPU is given once, and never shared
        if whole:
            assert g.memory_used_mib <= DEFAULT_FOREIGN_THRESHOLD_MIB
        assert g.memory_used_mib + sum(asked[j].gpu_mem_mib or 0 for j in jobs) <= g.memory_total_mib


# ------------------------------------------------------------------ modes, slots, sizes


def test_modes_of_a_look() -> None:
    assert mode_of(GpuLook((gpu(0),), "nvml", None, 0.0)) == GPUS
    assert mode_of(GpuLook((gpu(0),), "nvml", "GPU 1 unreadable (NVML: GPU is lost)", 0.0)) == GPUS
    assert mode_of(GpuLook((), "none", "no NVIDIA driver (NVML: NVML Shared Library Not Found)", 0.0)) == CPU_ONLY
    assert mode_of(GpuLook((), "fake", None, 0.0)) == CPU_ONLY  # a file listing no GPUs
    broken = GpuLook((), "fake", "GPUQ_FAKE_GPUS=/x.json: not JSON: Expecting value", 0.0)
    assert mode_of(broken) == UNREADABLE
    assert unreadable(broken) == Blocked(
        "waiting for the GPUs to be readable: GPUQ_FAKE_GPUS=/x.json: not JSON: Expecting value", forever=False
    )


def test_no_gpus_present_means_gpu_requests_never_fit_here() -> None:
    assert place(Request(), []) == Blocked("needs 1 GPU; this worker has 0", forever=True)
    assert place(Request(gpus=0), []) == Placement(())


@pytest.mark.parametrize(
    "kwargs,message",
    [({"gpus": -1}, "--gpus"), ({"gpus": 0, "gpu_mem_mib": 1024}, "needs --gpus 1"), ({"gpu_mem_mib": 0}, "--gpu-mem")],
)
def test_impossible_requests_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Request(**kwargs)
