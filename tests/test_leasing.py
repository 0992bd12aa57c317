"""claim_gpus (engine/schedule/leasing.py): decide and lease under the placing locks, with a real
lease directory in tmp; a directory that cannot be trusted falls back to the memory gate, said once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpuq.engine.schedule.leasing import Claim, claim_gpus
from gpuq.engine.schedule.placement import Blocked, Request
from gpuq.system.gpus import Gpu, GpuLook, GpuProcess
from gpuq.system.leases import LeaseDir, spool_id, spool_ids

H100 = 81559


def looking_at(*gpus: Gpu):  # noqa: ANN201
    return lambda: GpuLook(tuple(gpus), "fake", None, time.time())


def gpu(index: int, processes: tuple = ()) -> Gpu:
    used = sum(m for _, m in processes)
    return Gpu(index, "Fake H100", f"GPU-fake-{index}", H100, used, tuple(GpuProcess(p, m) for p, m in processes))


TWO = looking_at(gpu(0), gpu(1))


def claim(tmp_path: Path, request: Request = Request(), **kw):  # noqa: ANN201, B008
    kw = {"job": None, "name": "sh", "spool": None, "lease_dir": str(tmp_path / "leases"), "look": TWO, **kw}
    return claim_gpus(request, **kw)


def test_claims_take_distinct_gpus_until_none_is_left(tmp_path: Path) -> None:
    first = claim(tmp_path, job=4, name="train", spool="/home/me/.gpuq")
    second = claim(tmp_path)
    assert isinstance(first, Claim) and (first.gpus, second.gpus) == ((0,), (1,))
    assert [held.lease.gpu_uuid for held in first] == ["GPU-fake-0"] and first[0].lease.job == 4
    third = claim(tmp_path)
    assert isinstance(third, Blocked) and not third.forever
    held = "leased whole by your job #4 in another queue"  # seen from no queue: it is said
    assert third.reason.startswith(f"waiting for GPU 0: {held} since ")
    from_its_queue = claim(tmp_path, mine=spool_ids("/home/me/.gpuq", None))  # `gpuq lease` in that GPUQ_HOME
    assert isinstance(from_its_queue, Blocked)
    assert from_its_queue.reason.startswith("waiting for GPU 0: leased whole by your job #4 since "), from_its_queue
    assert f"GPU 1: leased whole by your `sh` (gpuq lease, pid {os.getpid()}) since " in third.reason
    first.release()
    fourth = claim(tmp_path, Request(gpu_mem_mib=20480))
    assert fourth.gpus == (0,) and fourth[0].lease.mem_mib == 20480
    assert [lease.gpu_index for lease in LeaseDir.open(tmp_path / "leases").live()] == [0, 1]
    for held in (second, fourth):
        held.release()
    assert LeaseDir.open(tmp_path / "leases").live() == []


def test_excluded_leases_do_not_count(tmp_path: Path) -> None:
    mine = claim(tmp_path, candidates=[0], spool="/home/me/.gpuq", job=1)
    assert isinstance(claim(tmp_path, candidates=[0]), Blocked)
    again = claim(tmp_path, candidates=[0], exclude=lambda lease: lease.spool == spool_id("/home/me/.gpuq"))
    assert again.gpus == (0,)
    mine.release()
    again.release()


def test_a_leaseholders_memory_is_not_outside_memory(tmp_path: Path) -> None:
    """A 20 GiB lease whose holder (this test's process) uses 40 GiB: a 30 GiB request fits beside
    it; the same 40 GiB in a process that holds no lease would leave no room."""
    look = looking_at(gpu(0, processes=((os.getpid(), 40960),)))
    held = claim(tmp_path, Request(gpu_mem_mib=20480), look=lambda: GpuLook((gpu(0),), "fake", None, 0.0))
    assert claim(tmp_path, Request(gpu_mem_mib=30720), look=look).gpus == (0,)
    stranger = looking_at(gpu(0, processes=((1, 40960),)))
    assert isinstance(claim(tmp_path, Request(gpu_mem_mib=30720), look=stranger), Blocked)
    held.release()


def test_an_untrusted_directory_falls_back_to_the_memory_gate_said_once(tmp_path: Path) -> None:
    loose = tmp_path / "leases"
    loose.mkdir()
    loose.chmod(0o777)
    said: list[str] = []
    first = claim(tmp_path, log=said.append)
    assert isinstance(first, Claim) and first.gpus == (0,) and list(first) == []
    busy = looking_at(gpu(0, processes=((1, 9000),)), gpu(1, processes=((2, 9000),)))
    assert claim(tmp_path, log=said.append, look=busy, describe=None) == Blocked(
        "waiting for GPU 0: 8.8 GiB held by pid 1; GPU 1: 8.8 GiB held by pid 2", False
    )
    assert said == [
        f"lease directory {loose} is not sticky (mode 0777): other users could remove your leases; "
        "leases are off, the GPU memory gate alone decides"
    ]


def test_no_gpus_to_lease(tmp_path: Path) -> None:
    none = lambda: GpuLook((), "none", "no NVIDIA driver (no /dev/nvidiactl)", 0.0)  # noqa: E731
    assert claim(tmp_path, look=none) == Blocked("no GPU to lease here: no NVIDIA driver (no /dev/nvidiactl)", True)
    assert claim(tmp_path, Request(gpus=0), look=none) == Claim([], ())


RACER = """
import json, sys, time
from gpuq.engine.schedule.leasing import claim_gpus
from gpuq.engine.schedule.placement import Request
spans = []
while len(spans) < int(sys.argv[2]):
    got = claim_gpus(Request(), job=None, name='racer', spool=None, lease_dir=sys.argv[1], describe=None)
    if isinstance(got, list):
        began = time.monotonic()
        time.sleep(0.005)
        spans.append((began, time.monotonic()))
        got.release()
print(json.dumps(spans))
"""


def test_two_processes_claiming_at_once_never_share_the_gpu(tmp_path: Path) -> None:
    fake = tmp_path / "gpus.json"
    fake.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "index": 0,
                        "name": "F",
                        "uuid": "GPU-race",
                        "memory_total_mib": H100,
                        "memory_used_mib": 0,
                        "processes": [],
                    }
                ]
            }
        )
    )
    env = dict(os.environ, GPUQ_FAKE_GPUS=str(fake))
    argv = [sys.executable, "-c", RACER, str(tmp_path / "leases"), "25"]
    racers = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    spans = sorted(span for racer in racers for span in json.loads(racer.communicate(timeout=60)[0]))
    assert len(spans) == 50
    overlaps = [(a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1]]
    assert overlaps == []
