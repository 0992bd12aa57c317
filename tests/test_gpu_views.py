"""What `gpuq gpus` and `gpuq status` show of the GPUs and of when queued jobs start (issue 24):
the jobs a step started, a fresh look when the worker's view is old, the time of each figure, and
memory held by processes that are not gpuq's. GPUs simulated by GPUQ_FAKE_GPUS, real workers."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from conftest import Env, wait_for
from test_gpu_worker import Gpus, add, fake_gpus, release, seen

from gpuq.core.job import Job
from gpuq.core.times import parse_iso
from gpuq.engine.schedule import gpuview
from gpuq.engine.tracking import queue_eta
from gpuq.spool import Spool
from gpuq.system import gpus as gpu_info


def worker_view(gq: Env, pid: int) -> dict[str, Any]:
    """The view worker `pid` wrote into the spool (workers/gpus-PID.json), as it is on disk."""
    path = gq.home / "workers" / f"gpus-{pid}.json"
    return json.loads(wait_for(lambda: path.exists() and path.read_text(), 10, what="the worker's GPU view"))


def test_the_view_counts_the_jobs_its_step_started(gq: Env) -> None:
    Gpus(gq, fake_gpus(2))
    first, second = add(gq), add(gq)
    worker = gq.start_worker("--watch")  # both jobs are there at its first step: started together
    assert {seen(gq, first)["CUDA_VISIBLE_DEVICES"], seen(gq, second)["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
    on = {gq.job(job_id)["gpus"][0]: job_id for job_id in (first, second)}
    # no later step looks at the GPUs (nothing waits): the view of the step that started them stays
    assert {g["index"]: g["jobs"] for g in worker_view(gq, worker.pid)["gpus"]} == {0: [on[0]], 1: [on[1]]}
    listed = json.loads(gq.gpuq("gpus", "--json").stdout)
    assert {g["index"]: g["jobs"] for g in listed} == {0: [on[0]], 1: [on[1]]}
    release(gq)


def test_an_old_view_is_looked_at_again_and_every_figure_says_when_it_was_seen(gq: Env) -> None:
    gpus = Gpus(gq, fake_gpus(1))
    worker = gq.start_worker("--watch")  # idle: it looks at the GPUs once, when it starts
    at = worker_view(gq, worker.pid)["at"]
    gpus.set(fake_gpus(1, foreign={0: (4242, 9300)}))  # someone else takes 9.1 GiB
    wait_for(lambda: time.time() - at > gpuview.STALE_SECONDS, 10, what="the worker's view to be old")
    before = time.time()
    listed = json.loads(gq.gpuq("gpus", "--json").stdout)
    assert isinstance(listed, list) and listed[0]["memory_used_mib"] == 9300
    assert listed[0]["foreign"][0]["pid"] == 4242 and listed[0]["foreign_mib"] == 9300
    assert parse_iso(listed[0]["seen_at"]) >= before - 0.01  # ISO time with milliseconds, local offset
    assert 0 <= listed[0]["seen_seconds_ago"] < gpuview.STALE_SECONDS
    assert "pid 4242" in gq.gpuq("status").stdout
    assert worker_view(gq, worker.pid)["at"] == at  # the worker did not look: gpuq gpus did


def test_a_fresh_view_is_shown_as_it_is_and_an_old_one_replaced(gq: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = Gpus(gq, fake_gpus(1))
    monkeypatch.setenv("GPUQ_FAKE_GPUS", str(gpus.path))
    spool = Spool(gq.home)
    spool.ensure()
    now = time.time()
    worker_saw = gpuview.view(gpu_info.look(), [], spool.home)
    gpus.set(fake_gpus(1, foreign={0: (4242, 9300)}))
    fresh = dict(worker_saw, at=now - 1, worker=1, foreign_threshold_mib=2048)
    assert gpuview.current(spool, [], [fresh]) is fresh  # a worker looked a second ago: its view
    old = dict(fresh, at=now - 60)
    shown = gpuview.current(spool, [], [old])
    assert shown["gpus"][0]["memory_used_mib"] == 9300 and shown["at"] >= now
    assert "worker" not in shown and shown["foreign_threshold_mib"] == 2048  # seen by us; the worker's gate
    listed = gpuview.listed(old, now)  # what `gpuq gpus --json` prints of a view
    assert listed[0]["seen_seconds_ago"] == 60.0 and parse_iso(listed[0]["seen_at"]) == pytest.approx(now - 60)


# ---- when a job held back by other processes' memory starts --------------------------------------
STEPS = """import os, time
time.sleep(1)
print('Step 10/20', flush=True)
while not os.path.exists('release'):
    time.sleep(0.05)
"""


def test_a_job_held_back_by_foreign_memory_starts_when_another_gpu_frees(gq: Env) -> None:
    Gpus(gq, fake_gpus(2, total=81920, foreign={0: (4242, 61440)}))  # 60 GiB of GPU 0 is someone else's
    gq.script("steps.py", STEPS)
    busy = gq.add("steps.py")
    gq.start_worker("--watch")
    gq.wait_state(busy, "running")
    assert gq.job(busy)["gpus"] == [1]
    queued = add(gq)

    def estimated() -> Any:
        rows = {r["id"]: r for r in gq.status_json()}
        ready = rows[busy]["eta_seconds"] is not None and rows[queued]["waiting"]
        return ready and rows

    rows = wait_for(estimated, 15, interval=0.2, what="an ETA for the running job and a reason for the queued one")
    assert "GPU 0: 60.0 GiB held by pid 4242" in rows[queued]["waiting"]
    assert rows[queued]["starts_in_seconds"] == pytest.approx(rows[busy]["eta_seconds"], abs=0.11)
    assert rows[queued]["starts_in_seconds"] > 0
    method = rows[queued]["eta_method"]
    assert "on GPU 1" in method and "GPU 0: 60.0 GiB held by processes that are not gpuq's" in method, method
    release(gq)


def test_queue_plan_with_foreign_memory() -> None:
    running = Job({"id": 1, "gpus": [1], "slot": "1"})
    job = Job({"id": 2, "cmd": ["a"], "cwd": "/w", "after": [], "gpu_request": 1})
    shared = Job(job, id=3, gpu_mem_mib=10240)
    slots = ["0", "1", queue_eta.CPU_LANE]
    outside = {"0": queue_eta.Outside(61440, 81920)}  # GPU 0: 60 GiB of 80 held by others
    plan = queue_eta.plan_queue([(running, 4.0)], [(job, None)], slots, {}, outside=outside)
    assert plan[2].starts_in == 4.0 and "on GPU 1" in plan[2].method and "GPU 0: 60.0 GiB" in plan[2].method
    unknown = queue_eta.plan_queue([(running, None)], [(job, None)], slots, {}, outside=outside)[2]
    assert unknown.starts_in is None and unknown.method.startswith("start unknown: GPU 0: 60.0 GiB held by")
    assert "no other GPU frees at a known time" in unknown.method
    # a 10 GiB share fits beside the others' 60 GiB; a whole GPU does not
    assert queue_eta.plan_queue([(running, None)], [(shared, None)], slots, {}, outside=outside)[3].starts_in == 0.0
    small = {"0": queue_eta.Outside(512, 81920)}  # a desktop's few hundred MiB: under the threshold, no gate
    assert queue_eta.plan_queue([(running, None)], [(job, None)], slots, {}, outside=small)[2].starts_in == 0.0
    gated = queue_eta.plan_queue([(running, None)], [(job, None)], slots, {}, outside=small, threshold=256)
    assert gated[2].starts_in is None  # the worker's --foreign-mem-threshold, as its view says


def test_the_default_threshold_is_the_placements() -> None:
    from gpuq.engine.schedule import placement

    assert queue_eta.DEFAULT_FOREIGN_THRESHOLD_MIB == placement.DEFAULT_FOREIGN_THRESHOLD_MIB


def test_gpus_that_could_not_be_read_are_an_error_not_an_empty_list(gq: Env) -> None:
    """`gpus --json` printed `[]` with exit 0 when the look failed: a script took it for no GPUs."""
    broken = gq.work / "gpus.json"
    broken.write_text("{not json")
    gq.env["GPUQ_FAKE_GPUS"] = str(broken)
    listed = gq.gpuq("gpus", "--json", check=False)
    problem = f"GPUQ_FAKE_GPUS={broken}: not JSON: "
    assert (listed.returncode, listed.stdout) == (1, "")
    assert listed.stderr.startswith(f"gpuq: the GPUs could not be read: {problem}") and listed.stderr.count("\n") == 1
    text = gq.gpuq("gpus", check=False)
    assert text.returncode == 1 and problem in text.stdout  # the same failure, said as the view says it
    broken.write_text(json.dumps({"gpus": []}))  # a machine without GPUs: none, and no error
    assert (gq.gpuq("gpus", "--json").stdout, gq.gpuq("gpus").returncode) == ("[]\n", 0)
