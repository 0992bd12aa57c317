"""GPUs through a real worker (issue 11), with GPUs simulated by GPUQ_FAKE_GPUS: a JSON file the
worker reads afresh at every look, so a test can change what the GPUs hold while the worker runs."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

import pytest
from conftest import Env, wait_for

# Each job records the GPUs it was given, then runs until its release file appears.
JOB = """import os, sys, time
from pathlib import Path
here = Path(sys.argv[1])
info = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUQ_JOB_ID")}
(here / f"seen-{info['GPUQ_JOB_ID']}.json").write_text(__import__("json").dumps(info))
while not (here / "release").exists():
    time.sleep(0.05)
"""


def fake_gpus(count: int, total: int = 81559, foreign: Optional[dict[int, tuple[int, int]]] = None) -> dict:
    """`count` GPUs; `foreign`: GPU index -> (pid, MiB) of a process that is not gpuq's."""
    gpus = []
    for index in range(count):
        procs = (
            [{"pid": foreign[index][0], "used_memory_mib": foreign[index][1]}] if foreign and index in foreign else []
        )
        used = sum(p["used_memory_mib"] for p in procs)
        gpus.append(
            {
                "index": index,
                "name": "Fake H100",
                "uuid": f"GPU-fake-{index}",
                "memory_total_mib": total,
                "memory_used_mib": used,
                "processes": procs,
            }
        )
    return {"gpus": gpus}


class Gpus:
    """A simulated GPU file for one test, rewritten atomically as a real machine changes."""

    def __init__(self, gq: Env, doc: dict):
        self.path = gq.work / "gpus.json"
        self.set(doc)
        gq.env["GPUQ_FAKE_GPUS"] = str(self.path)

    def set(self, doc: dict) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.path)


def seen(gq: Env, job_id: int) -> dict[str, Any]:
    path = gq.work / f"seen-{job_id}.json"
    return json.loads(wait_for(lambda: path.exists() and path.read_text(), 15, what=f"job {job_id} to start"))


def started(gq: Env, job_id: int) -> bool:
    return (gq.work / f"seen-{job_id}.json").exists()


def add(gq: Env, *options: str) -> int:
    gq.script("job.py", JOB)
    return gq.add(*options, "job.py", str(gq.work))


def row(gq: Env, job_id: int) -> dict[str, Any]:
    return next(r for r in gq.status_json() if r["id"] == job_id)


def release(gq: Env) -> None:
    (gq.work / "release").write_text("")


def test_one_job_per_gpu_each_sees_its_own(gq: Env) -> None:
    Gpus(gq, fake_gpus(4))
    ids = [add(gq) for _ in range(5)]
    gq.start_worker("--watch")
    given = [seen(gq, i)["CUDA_VISIBLE_DEVICES"] for i in ids[:4]]
    assert sorted(given) == ["0", "1", "2", "3"]
    assert all(seen(gq, i)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for i in ids[:4])
    assert "waiting for a free GPU" in row(gq, ids[4])["waiting"]
    assert not started(gq, ids[4])
    assert sorted(row(gq, i)["gpus"][0] for i in ids[:4]) == [0, 1, 2, 3]  # status --json names them
    release(gq)
    assert seen(gq, ids[4])["CUDA_VISIBLE_DEVICES"] in ("0", "1", "2", "3")
    gq.wait_state(ids[4], "done")


def test_a_two_gpu_job_gets_two_distinct_gpus_and_a_cpu_job_runs_beside(gq: Env) -> None:
    Gpus(gq, fake_gpus(2))
    pair = add(gq, "--gpus", "2")
    cpu = add(gq, "--gpus", "0")
    single = add(gq)
    gq.start_worker("--watch")
    assert seen(gq, pair)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert seen(gq, cpu)["CUDA_VISIBLE_DEVICES"] == ""  # a CPU job sees no GPU at all
    assert gq.job(pair)["gpus"] == [0, 1] and gq.job(cpu)["gpus"] == []
    assert re.search(r"\n  state +running: pid \d+, CPU[,\n]", gq.gpuq("show", str(cpu)).stdout)  # not a bare "GPU "
    assert not started(gq, single) and "waiting for a free GPU" in row(gq, single)["waiting"]
    release(gq)
    for job_id in (pair, cpu, single):
        gq.wait_state(job_id, "done")


def test_jobs_that_declare_memory_share_a_gpu_while_they_fit(gq: Env) -> None:
    Gpus(gq, fake_gpus(1, total=81920))  # 80 GiB
    a, b, c = (add(gq, "--gpu-mem", "30G") for _ in range(3))
    gq.start_worker("--watch")
    assert seen(gq, a)["CUDA_VISIBLE_DEVICES"] == seen(gq, b)["CUDA_VISIBLE_DEVICES"] == "0"
    wait_for(lambda: "waiting for 30.0 GiB on a GPU" in (row(gq, c)["waiting"] or ""), 10, what="c to wait")
    assert not started(gq, c)
    release(gq)
    assert seen(gq, c)["CUDA_VISIBLE_DEVICES"] == "0"
    gq.wait_state(c, "done")


def test_a_foreign_process_holds_the_next_job_back_until_it_is_gone(gq: Env) -> None:
    gpus = Gpus(gq, fake_gpus(1, foreign={0: (4242, 9300)}))
    job_id = add(gq)
    gq.start_worker("--watch")
    reason = wait_for(lambda: row(gq, job_id)["waiting"], 10, what="a waiting reason")
    assert reason.startswith("waiting for GPU 0: 9.1 GiB held by pid 4242")
    assert "pid 4242" in gq.gpuq("status").stdout  # the status table says it too
    assert json.loads(gq.gpuq("gpus", "--json").stdout)[0]["foreign"][0]["pid"] == 4242
    assert not started(gq, job_id)
    gpus.set(fake_gpus(1))  # the other process is gone
    assert seen(gq, job_id)["CUDA_VISIBLE_DEVICES"] == "0"
    release(gq)
    gq.wait_state(job_id, "done")


def test_edit_refuses_the_gpus_or_gpu_mem_that_add_refuses(gq: Env) -> None:
    """On one GPU, `edit --set gpus=5` or `gpu_mem=200G` is refused as `add` refuses them (exit 2,
    the job unchanged); they were taken, and the job waited for ever."""
    Gpus(gq, fake_gpus(1))
    job = gq.add("--hold", "true")
    never = ": this job could never start"
    for setting, option, problem in (
        ("gpus=5", "--gpus=5", "needs 5 GPUs; this machine has 1"),
        ("gpu_mem=200G", "--gpu-mem=200G", "needs 200.0 GiB on a GPU; the largest here is GPU 0 with 79.6 GiB"),
    ):
        edited = gq.gpuq("edit", str(job), "--set", setting, check=False)
        assert (edited.returncode, edited.stderr) == (2, f"gpuq edit: job #{job} not changed: {problem}{never}\n")
        added = gq.gpuq("add", option, "true", check=False)
        assert (added.returncode, added.stderr) == (2, f"gpuq add: {problem}{never}\n")
    assert (gq.job(job)["gpu_request"], gq.job(job).get("gpu_mem_mib")) == (1, None)
    gq.gpuq("edit", str(job), "--set", "gpu_mem=20G")  # one that fits is taken
    assert gq.job(job)["gpu_mem_mib"] == 20480


def test_add_and_edit_name_the_smaller_gpu_that_bounds_memory_on_each_of_n(gq: Env) -> None:
    """Two GPUs of 79.6 GiB and one of 39.1: 60G on each of 3 is refused because of GPU 1, and was
    refused saying `the largest here has 79.6 GiB`, which 60G fits."""
    doc = fake_gpus(3)
    doc["gpus"][1]["memory_total_mib"] = 40000
    Gpus(gq, doc)
    problem = "needs 60.0 GiB on each of 3 GPUs; the smallest of the 3 largest here is GPU 1 with 39.1 GiB"
    added = gq.gpuq("add", "--gpus", "3", "--gpu-mem", "60G", "true", check=False)
    assert (added.returncode, added.stderr) == (2, f"gpuq add: {problem}: this job could never start\n")
    job = gq.add("--hold", "--gpus", "3", "true")
    edited = gq.gpuq("edit", str(job), "--set", "gpu_mem=60G", check=False)
    assert (edited.returncode, edited.stderr) == (
        2,
        f"gpuq edit: job #{job} not changed: {problem}: this job could never start\n",
    )
    assert gq.gpuq("add", "-q", "--hold", "--gpus", "2", "--gpu-mem", "60G", "true").returncode == 0  # GPUs 0 and 2


def test_a_job_that_can_never_fit_is_refused_or_waits_without_blocking_others(gq: Env) -> None:
    Gpus(gq, fake_gpus(2))
    gq.script("job.py", JOB)
    proc = gq.gpuq("add", "--gpus", "3", "job.py", check=False)
    assert (
        proc.returncode == 2
        and proc.stderr.strip() == "gpuq add: needs 3 GPUs; this machine has 2: this job could never start"
    )
    assert gq.files("pending") == []
    dropped = {"cmd": ["python3", str(gq.work / "job.py"), str(gq.work)], "cwd": str(gq.work), "gpus": 3}
    (gq.home / "pending").mkdir(parents=True, exist_ok=True)
    (gq.home / "pending" / "big.json").write_text(json.dumps(dropped))
    behind = add(gq)
    gq.start_worker()
    assert seen(gq, behind)["CUDA_VISIBLE_DEVICES"] in ("0", "1")  # not blocked behind the big one
    big = next(r for r in gq.status_json() if r["id"] != behind)
    assert big["state"] == "pending" and big["waiting"] == "needs 3 GPUs; this worker has 2 (0,1)"
    release(gq)
    gq.wait_state(behind, "done")
    gq.workers[0].wait(15)  # `gpuq run` without --watch gives up on a job that can never start
    assert "needs 3 GPUs" in gq.worker_output()


def test_run_gpus_limits_the_worker_to_those_gpus(gq: Env) -> None:
    Gpus(gq, fake_gpus(3))
    first, second = add(gq), add(gq)
    gq.start_worker("--watch", "--gpus", "2")
    assert seen(gq, first)["CUDA_VISIBLE_DEVICES"] == "2"
    assert "waiting for a free GPU (2: job #" in wait_for(lambda: row(gq, second)["waiting"], 10, what="a reason")
    release(gq)
    assert seen(gq, second)["CUDA_VISIBLE_DEVICES"] == "2"


def test_run_gpus_refuses_an_index_the_machine_does_not_have(gq: Env) -> None:
    """As Slurm refuses an invalid index, rather than dropping it (`GPUs 0 of 2`) or running on none."""
    gpus = Gpus(gq, fake_gpus(2))
    for line in (["--gpus", "0,2"], ["--gpus", "5"], ["--daemon", "--gpus", "5"]):
        proc = gq.gpuq("run", *line, check=False, timeout=30)
        wrong = line[-1].split(",")[-1]
        assert (proc.returncode, proc.stderr.strip()) == (
            2,
            f"gpuq run: --gpus: no GPU {wrong} here; this machine has 2 GPUs (0,1)",
        ), line
    assert not gq.gpuq("status").stdout.startswith("worker: running")
    assert "started (GPUs 1 of 2 (fake)" in gq.gpuq("run", "--gpus", "1", timeout=30).stdout
    gpus.path.write_text("{")  # a look that fails refuses nothing: the GPUs may be back at the next
    assert "started (GPUs unreadable" in gq.gpuq("run", "--gpus", "0,2", timeout=30).stdout


def test_status_shows_a_line_per_gpu(gq: Env) -> None:
    Gpus(gq, fake_gpus(2, foreign={1: (5151, 2048)}))
    out = gq.gpuq("status").stdout  # no worker: status looks at the GPUs itself
    lines = [line for line in out.splitlines() if line.strip().startswith("GPU ")]
    assert len(lines) == 2 and "Fake H100" in lines[0] and "0.0/79.6 GiB" in lines[0]
    assert "pid 5151" in lines[1] and "2.0 GiB" in lines[1]
    listed = json.loads(gq.gpuq("gpus", "--json").stdout)
    assert [g["index"] for g in listed] == [0, 1] and listed[1]["foreign"][0]["used_memory_mib"] == 2048


def test_gpus_says_the_fake_gpus_file_lists_none(gq: Env) -> None:
    """Not "GPUQ_FAKE_GPUS is not set", as it said while it was set."""
    gpus = Gpus(gq, {"gpus": []})
    out = gq.gpuq("gpus").stdout.strip()
    assert out == f"no GPUs found (GPUQ_FAKE_GPUS={gpus.path} lists none): jobs run one slot at a time"


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="this machine has an NVIDIA driver")
def test_without_gpus_jobs_run_one_at_a_time_as_before(gq: Env) -> None:
    gq.env.pop("GPUQ_FAKE_GPUS", None)
    first, second = add(gq, "--gpus", "2"), add(gq)  # a GPU request on a machine without GPUs still runs
    gq.start_worker("--watch")
    assert seen(gq, first)["CUDA_VISIBLE_DEVICES"] is None
    assert not started(gq, second)
    assert "GPU" not in gq.gpuq("status").stdout.split("ID")[0]
    release(gq)
    gq.wait_state(second, "done")
