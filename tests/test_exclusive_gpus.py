"""GPUs in an exclusive compute mode (`nvidia-smi -c EXCLUSIVE_PROCESS`, issue 28): read from NVML
and from the simulated GPU file, and never shared by `--gpu-mem` jobs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import Env, wait_for
from test_gpu_worker import Gpus, add, fake_gpus, release, row, seen, started
from test_gpus import device, fake_gpu, nvml_look, stand_in_nvml, write_doc

from gpuq.engine.schedule.leasing import Claim, claim_gpus
from gpuq.engine.schedule.placement import Blocked, Holding, Placement, Request, place, place_in_order
from gpuq.system import gpus
from gpuq.system.gpus import Gpu, GpuLook, GpuProcess
from gpuq.system.leases import LeaseDir

H100 = 81559


def gpu(index: int, mode: str = "default", processes: tuple = ()) -> Gpu:
    used = sum(m for _, m in processes)
    procs = tuple(GpuProcess(p, m) for p, m in processes)
    return Gpu(index, "Fake H100", f"GPU-fake-{index}", H100, used, procs, mode)


def test_memory_requests_never_share_an_exclusive_gpu() -> None:
    shared = Request(gpu_mem_mib=10240)
    requests = [(1, shared), (2, shared), (3, Request())]
    assert place_in_order(requests, [gpu(0)]) == {  # a default GPU: both shares, the whole job waits
        1: Placement((0,)),
        2: Placement((0,)),
        3: Blocked("waiting for a free GPU (0: job #1, job #2)", forever=False),
    }
    decisions = place_in_order(requests, [gpu(0, "exclusive_process")])
    assert decisions[1] == Placement((0,))
    assert decisions[2] == Blocked("waiting for a free GPU (0: job #1)", forever=False)
    alone = place(Request(), [gpu(0, "exclusive_process")], holdings=[Holding(1, (0,), 10240)])
    assert alone == decisions[2]
    # a share already running there holds it whole; another GPU beside it takes the next share
    held = [Holding(7, (0,), 10240)]
    assert place(shared, [gpu(0, "exclusive_process"), gpu(1)], holdings=held) == Placement((1,))
    assert place(shared, [gpu(0, "exclusive_thread")], holdings=held) == Blocked(
        "waiting for a free GPU (0: job #7)", forever=False
    )
    assert place(shared, [gpu(0, "prohibited")], holdings=held) == Placement((0,))  # not exclusive: shared


def test_any_other_process_keeps_jobs_off_an_exclusive_gpu() -> None:
    context = ((4242, 500),)  # a bare CUDA context: under the foreign threshold, harmless on a default GPU
    assert place(Request(), [gpu(0, processes=context)]) == Placement((0,))
    assert place(Request(gpu_mem_mib=1024), [gpu(0, processes=context)]) == Placement((0,))
    exclusive = [gpu(0, "exclusive_process", processes=context)]
    blocked = Blocked("waiting for GPU 0: 500 MiB held by pid 4242", forever=False)
    assert place(Request(), exclusive) == blocked
    assert place(Request(gpu_mem_mib=1024), exclusive) == blocked
    assert place(Request(), exclusive + [gpu(1)]) == Placement((1,))


def test_an_exclusive_gpu_is_leased_whole_and_another_partys_lease_keeps_shares_off(tmp_path: Path) -> None:
    gpus_now = (gpu(0, "exclusive_process"), gpu(1))
    kw = {"job": None, "name": "sh", "spool": None, "lease_dir": str(tmp_path / "leases")}
    kw["look"] = lambda: GpuLook(gpus_now, "fake", None, time.time())
    first = claim_gpus(Request(gpu_mem_mib=10240), candidates=[0], **kw)
    assert isinstance(first, Claim) and first.gpus == (0,)
    assert first[0].lease.mem_mib is None  # a share of it would be refused by the driver: leased whole
    second = claim_gpus(Request(gpu_mem_mib=10240), **kw)
    assert isinstance(second, Claim) and second.gpus == (1,) and second[0].lease.mem_mib == 10240
    first.release()
    second.release()
    # another party's share there (a tool that leased it by size) keeps shares off it all the same
    other = LeaseDir.open(tmp_path / "leases").take("GPU-fake-0", 0, 1024, job=None, name="nb", spool=None)
    try:
        blocked = claim_gpus(Request(gpu_mem_mib=1024), candidates=[0], exclude=lambda lease: False, **kw)
        assert isinstance(blocked, Blocked) and "GPU 0: 1.0 GiB leased by your `nb`" in blocked.reason
        assert claim_gpus(Request(gpu_mem_mib=1024), candidates=[1], **kw).gpus == (1,)
    finally:
        other.release()


# ------------------------------------------------------------------ reading the mode


@pytest.fixture
def fake_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "gpus.json"
    monkeypatch.setenv(gpus.FAKE_ENV, str(path))
    return path


def test_the_fake_file_may_say_the_compute_mode(fake_file: Path) -> None:
    doc = {"gpus": [fake_gpu(0), dict(fake_gpu(1), compute_mode="exclusive_process")]}
    write_doc(fake_file, doc)
    look = gpus.look()
    assert [(g.compute_mode, g.exclusive) for g in look.gpus] == [("default", False), ("exclusive_process", True)]
    assert {"gpus": gpus.to_json(look)["gpus"]} == doc  # written back only where not default
    write_doc(fake_file, {"gpus": [dict(fake_gpu(0), compute_mode="exclusive")]})
    problem = gpus.look().problem
    assert problem is not None and "gpus[0].compute_mode: expected one of default, " in problem, problem


def test_nvml_gives_the_compute_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    binding = stand_in_nvml([device(0), device(1), device(2)])
    modes = {"GPU-0": 3, "GPU-1": 0}  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3

    def compute_mode(handle: dict) -> int:
        if handle["uuid"] not in modes:
            raise binding.NVMLError(3, "Not Supported")
        return modes[handle["uuid"]]

    binding.nvmlDeviceGetComputeMode = compute_mode
    look = nvml_look(monkeypatch, binding)
    assert look.problem is None
    assert [g.compute_mode for g in look.gpus] == ["exclusive_process", "default", "default"]


# ------------------------------------------------------------------ through a worker


def test_a_worker_runs_memory_jobs_one_at_a_time_on_an_exclusive_gpu(gq: Env) -> None:
    doc = fake_gpus(1)
    doc["gpus"][0]["compute_mode"] = "exclusive_process"
    Gpus(gq, doc)
    first, second = add(gq, "--gpu-mem", "10G"), add(gq, "--gpu-mem", "10G")
    gq.start_worker("--watch")
    assert seen(gq, first)["CUDA_VISIBLE_DEVICES"] == "0"
    reason = wait_for(lambda: row(gq, second)["waiting"], 10, what="a reason for the second job")
    assert reason == f"waiting for a free GPU (0: job #{first})" and not started(gq, second)
    shown = json.loads(gq.gpuq("gpus", "--json").stdout)
    assert shown[0]["compute_mode"] == "exclusive_process"
    assert "exclusive_process" in gq.gpuq("gpus").stdout
    release(gq)
    assert seen(gq, second)["CUDA_VISIBLE_DEVICES"] == "0"
    gq.wait_state(second, "done")
