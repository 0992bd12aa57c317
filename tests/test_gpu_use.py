"""What the GPUs did for each job (issue 29): the arithmetic of a job's GPU record, and a real worker
whose job's simulated GPU the test turns from busy to idle while the job runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from conftest import Env, wait_for
from test_gpu_worker import Gpus, add, fake_gpus, release

from gpuq.engine.tracking import gpuuse
from gpuq.spool import Spool

PERIOD = 0.2  # GPUQ_GPU_SAMPLE_SECONDS in the end-to-end test


def test_record_sums_busy_and_idle_time_and_halves_long_series() -> None:
    attempt = gpuuse.new_attempt([0, 1], started=1000.0)
    for n in range(1, 11):  # GPU 0 busy for 5 s then idle for 5 s; GPU 1 never known
        gpuuse.add_sample(attempt, 1000.0 + n, [100 if n <= 5 else 3, None], [2000 + n, None])
    record = {"attempts": {"1": attempt}}
    assert gpuuse.summary([attempt]) == {"mean_util": 51.5, "peak_mem_mib": 2010, "gpu_hours_idle": round(5 / 3600, 4)}
    assert gpuuse.idle_now(record, 1, limit=4.0) == [(0, 5.0)]
    assert gpuuse.idle_now(record, 1, limit=5.0) == []
    assert gpuuse.idle_text([(0, 22 * 60 + 5)]) == "GPU 0 idle 22 min: stuck in data loading or a debugger?"
    for n in range(11, 11 + gpuuse.MAX_POINTS):
        gpuuse.add_sample(attempt, 1000.0 + n, [50, None], [1, None])
    assert len(attempt["points"]) <= gpuuse.MAX_POINTS
    assert attempt["points"][-1][0] == 1000.0 + 10 + gpuuse.MAX_POINTS  # the newest sample is kept
    assert attempt["points"][0] == [1002.0, [100, None], [2002, None]]  # neighbours merged


def test_record_is_kept_in_the_spool_and_removed_with_the_job(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.layout.ensure()
    assert spool.reports.read_gpu_use(7) == {} and gpuuse.of_job(spool, 7) is None
    record = {"attempts": {"1": gpuuse.new_attempt([0], 1.0)}}
    gpuuse.add_sample(record["attempts"]["1"], 3.0, [0], [10])
    spool.reports.write_gpu_use(7, record)
    assert spool.reports.read_gpu_use(7) == record
    assert gpuuse.of_job(spool, 7) == {"mean_util": 0.0, "peak_mem_mib": 10, "gpu_hours_idle": round(2 / 3600, 4)}
    assert spool.reports.delete(7) > 0 and spool.reports.read_gpu_use(7) == {}


def gpu_record(gq: Env, job_id: int) -> dict[str, Any]:
    path = Path(gq.home) / "progress" / f"{job_id:06d}.gpu.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def util_gpus(util: int) -> dict:
    doc = fake_gpus(1)
    doc["gpus"][0].update(utilization_gpu=util, memory_used_mib=4000 if util else 3000)
    return doc


def test_a_job_busy_then_idle_is_recorded_within_a_sample_period(gq: Env) -> None:
    gpus = Gpus(gq, fake_gpus(1))
    gq.env.update(GPUQ_GPU_SAMPLE_SECONDS=str(PERIOD), GPUQ_GPU_IDLE_MINUTES=str(1.0 / 60))
    job_id = add(gq, "--gpus", "1")
    gq.start_worker()  # after the add: a foreground worker that finds nothing to do exits
    gq.wait_state(job_id, "running")
    gpus.set(util_gpus(100))  # its memory is now the job's (a job's own memory is never foreign)
    wait_for(lambda: len(gpu_record(gq, job_id).get("attempts", {}).get("1", {}).get("points", ())) >= 5, 15)
    gpus.set(util_gpus(0))
    went_idle = time.time()
    wait_for(lambda: gpu_record(gq, job_id)["attempts"]["1"]["at"] > went_idle + 1.5, 15)
    (flag,) = next(r for r in gq.status_json() if r["id"] == job_id)["gpu_idle"]  # limit: 1 s
    assert flag["gpu"] == 0 and flag["idle_seconds"] >= 1.5
    assert "GPU 0 idle 0 min: stuck in data loading or a debugger?" in gq.gpuq("status").stdout
    release(gq)
    gq.wait_state(job_id, "done")
    assert next(r for r in gq.status_json() if r["id"] == job_id)["gpu_idle"] == []  # only running jobs
    attempt = gpu_record(gq, job_id)["attempts"]["1"]
    span = attempt["at"] - attempt["started"]
    idle_truth = attempt["at"] - went_idle
    # A sample stands for the time since the one before: the change is known to within the gap
    # between the last busy sample and the next, PERIOD apart on a quiet machine, more on a busy
    # one (its times are rounded to 0.1 s: 0.1 more).
    last_busy = max(n for n, point in enumerate(attempt["points"]) if point[1] == [100])
    gap = attempt["points"][last_busy + 1][0] - attempt["points"][last_busy][0] + 0.1
    assert abs(attempt["idle_seconds"][0] - idle_truth) <= gap + 0.1, (attempt, went_idle)
    mean = attempt["util_seconds"][0] / attempt["seconds"][0]
    assert abs(mean - 100 * (span - idle_truth) / span) <= 100 * (gap + 0.1) / span
    assert attempt["peak_mem_mib"] == [4000]
    figures = json.loads(gq.gpuq("show", str(job_id), "--json").stdout)["gpu_use"]
    assert figures["peak_mem_mib"] == 4000 and abs(figures["mean_util"] - round(mean, 1)) < 0.2
    assert abs(figures["gpu_hours_idle"] * 3600 - attempt["idle_seconds"][0]) < 1
    assert "mean " in gq.gpuq("show", str(job_id)).stdout and "peak 3.9 GiB" in gq.gpuq("show", str(job_id)).stdout
    (group,) = json.loads(gq.gpuq("history", "--json").stdout)
    assert group["gpu_use"] == figures  # one job in its group
    table = gq.gpuq("history").stdout
    assert "idle GPU-h" in table.splitlines()[0] and f"{figures['mean_util']:.0f}%" in table


def test_a_sampled_gpu_job_still_stops_at_its_time_limit(gq: Env) -> None:
    doc = fake_gpus(1)
    doc["gpus"][0]["utilization_gpu"] = 50  # and no memory held by anyone else: the job starts at once
    Gpus(gq, doc)
    gq.env.update(GPUQ_GPU_SAMPLE_SECONDS=str(PERIOD))
    job_id = add(gq, "--gpus", "1", "--time", "0:00:01")
    gq.start_worker()  # after the add: a foreground worker that finds nothing to do exits
    job = gq.wait_state(job_id, "failed", timeout=15)
    assert "time limit of 1s reached" in job["reason"]
    points = gpu_record(gq, job_id)["attempts"]["1"]["points"]
    assert 2 <= len(points) and all(p[1] == [50] for p in points)
