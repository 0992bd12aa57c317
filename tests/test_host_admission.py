"""Host memory and CPUs (issue 31): what a job asks of the machine (`--mem`, `--cpus`, a dropped
file's `mem`/`cpus`), and the rule by which a worker admits it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from typing import Any

import pytest
from conftest import wait_for

from gpuq.cli import cmd_worker
from gpuq.cli.parser import parse
from gpuq.core.errors import UsageError
from gpuq.core.job import Job
from gpuq.core.states import PENDING, RUNNING
from gpuq.engine.lifecycle import intake
from gpuq.engine.schedule import hostroom
from gpuq.engine.schedule.planner import Assignment, Planner
from gpuq.engine.schedule.scheduler import QueueState, Wait
from gpuq.engine.tracking import queue_eta
from gpuq.run.slurm_batch import sbatch_options
from gpuq.run.worker import Settings
from gpuq.spool import Spool
from gpuq.system.gpus import Gpu, GpuLook


def _drop(gq: Any, name: str, fields: dict[str, Any]) -> None:
    (gq.home / "pending" / name).write_text(json.dumps({"cmd": ["true"], **fields}))


def test_a_dropped_file_says_mem_and_cpus_or_is_rejected_with_the_reason(gq: Any) -> None:
    spool = Spool(gq.home).ensure()
    _drop(gq, "sized.json", {"mem": "32G", "cpus": 8})
    _drop(gq, "mib.json", {"mem": 2048})
    _drop(gq, "bad-mem.json", {"mem": "lots"})
    _drop(gq, "zero-mem.json", {"mem": 0})
    _drop(gq, "bad-cpus.json", {"cpus": 0})
    _drop(gq, "text-cpus.json", {"cpus": "8"})
    outcomes = dict(intake.take_in_some(spool, time.time() + 60)[0])  # every quiet period is over
    assert outcomes["sized.json"].startswith("job #") and outcomes["mib.json"].startswith("job #")
    asked = sorted((job.mem_mib, job.cpus) for _ref, job in spool.jobs.load_many("pending"))
    assert asked == [(2048, None), (32768, 8)]
    assert "'mem': cannot read 'lots' as a size" in outcomes["bad-mem.json"]
    assert "'mem' must be a size of host memory" in outcomes["zero-mem.json"]
    for name in ("bad-cpus.json", "text-cpus.json"):
        assert "'cpus' must be how many CPUs the job needs" in outcomes[name]


@pytest.mark.parametrize(
    ("line", "message"),
    [(["--mem", "0"], "--mem: '0' is not a positive size"), (["--cpus", "0"], "not a number of CPUs (1 or more)")],
)
def test_add_refuses_a_bad_size_in_one_line(gq: Any, line: list[str], message: str) -> None:
    proc = gq.gpuq("add", *line, "true", check=False)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_add_and_edit_set_the_request(gq: Any) -> None:
    job_id = gq.add("--mem", "1.5G", "--cpus", "3", "true")
    assert (gq.job(job_id)["mem_mib"], gq.job(job_id)["cpus"]) == (1536, 3)
    gq.gpuq("edit", str(job_id), "--set", "mem=512M", "--set", "cpus=1")
    assert (gq.job(job_id)["mem_mib"], gq.job(job_id)["cpus"]) == (512, 1)
    refused = gq.gpuq("edit", str(job_id), "--set", "cpus=-1", check=False)
    assert refused.returncode == 2 and "'cpus' must be" in refused.stderr  # a bad value: exit 2, as add's


def test_a_sweep_gives_each_job_the_request(gq: Any) -> None:
    out = gq.gpuq("add", "-q", "--mem", "2G", "--cpus", "2", "--sweep", "x=1,2", "echo", "{x}").stdout
    assert [(gq.job(int(i))["mem_mib"], gq.job(int(i))["cpus"]) for i in out.split()] == [(2048, 2), (2048, 2)]


def test_gpuq_run_mem_and_cpus_are_the_workers_cap() -> None:
    settings = Settings(**cmd_worker._settings(parse(["run", "--mem", "25G", "--cpus", "4"])))
    assert (settings.host_mem_mib, settings.host_cpus) == (25 * 1024, 4)
    for line, message in ((["--mem", "lots"], "--mem: cannot read 'lots'"), (["--cpus", "0"], "--cpus: expected")):
        with pytest.raises(UsageError) as caught:
            cmd_worker._settings(parse(["run", *line]))
        assert str(caught.value).startswith(message)


# ---- the rule, in the planner (pure: jobs and looks built here) ------------------------------

G = 1024  # MiB


def _job(job_id: int, **fields: Any) -> Job:
    return Job({"id": job_id, "name": f"j{job_id}", "rev": 0, "priority": 0, "after": [], "after_any": [], **fields})


def _snap(pending: list[Job], running: list[Job] = ()) -> QueueState:
    states = {j.id: PENDING for j in pending} | {j.id: RUNNING for j in running}
    return QueueState(states, list(pending), list(running), time.time())


def _slots(count: int, mem_gib: int = 25, cpus: int = 4) -> Planner:
    """A worker's planner on a machine without GPUs: one slot per label, and its host cap."""
    no_gpus = lambda: GpuLook(gpus=(), source="none", problem=None, at=time.time())  # noqa: E731
    return Planner(labels=[str(i) for i in range(count)], look=no_gpus, host=hostroom.Cap(mem_gib * G, cpus))


def _started(plan: Any) -> list[int]:
    return [job.id for job, _where in plan.starts]


def test_jobs_start_while_their_memory_fits_and_the_next_waits_naming_the_holders() -> None:
    three = [_job(i, mem_mib=10 * G) for i in (1, 2, 3)]
    plan = _slots(3).plan(_snap(three), {})
    assert _started(plan) == [1, 2]
    assert plan.waits[3] == Wait("waiting for host memory: 20G of 25G reserved by #1, #2 (it needs 10G)", False)
    # once #1 has ended, #2 runs and #3 fits beside it
    plan = _slots(3).plan(_snap([three[2]], [Job(three[1], slot="1")]), {})
    assert _started(plan) == [3]


def test_cpus_the_same_way_and_jobs_without_a_request_reserve_nothing() -> None:
    jobs = [_job(1, cpus=2), _job(2, cpus=2), _job(3, cpus=2), _job(4)]
    plan = _slots(4).plan(_snap(jobs), {})
    assert _started(plan) == [1, 2, 4]
    assert plan.waits[3].reason == "waiting for CPUs: 4 of 4 reserved by #1, #2 (it needs 2)"


def test_running_and_starting_jobs_hold_what_they_reserved() -> None:
    running = Job(_job(1, mem_mib=12 * G), slot="0")
    starting = _job(2, mem_mib=8 * G)  # handed to its supervisor, still in pending/
    plan = _slots(4).plan(_snap([starting, _job(3, mem_mib=6 * G)], [running]), {2: Assignment("1")})
    assert 3 not in _started(plan)
    assert plan.waits[3].reason == "waiting for host memory: 20G of 25G reserved by #1, #2 (it needs 6G)"


def test_no_overtaking_for_the_same_resource_but_others_go_on() -> None:
    """A job that waits for memory holds back later jobs that ask for memory (a stream of small
    ones would starve it), not those that ask only for CPUs or for nothing: as GPU jobs wait
    behind the first in line for a GPU, and CPU jobs go on."""
    running = Job(_job(1, mem_mib=20 * G), slot="0")
    pending = [_job(2, mem_mib=10 * G), _job(3, mem_mib=1 * G), _job(4, cpus=1), _job(5)]
    plan = _slots(4).plan(_snap(pending, [running]), {})
    assert _started(plan) == [4, 5]
    assert plan.waits[3] == Wait("waiting behind #2 for host memory", False)


def test_a_request_bigger_than_the_cap_waits_for_good_saying_so_and_holds_no_one_back() -> None:
    pending = [_job(1, mem_mib=40 * G), _job(2, cpus=8), _job(3, mem_mib=10 * G, cpus=4)]
    plan = _slots(3).plan(_snap(pending), {})
    assert _started(plan) == [3]
    assert plan.waits[1] == Wait("needs 40G host memory; this worker hands out at most 25G", True)
    assert plan.waits[2] == Wait("needs 8 CPUs; this worker hands out at most 4", True)


def test_with_gpus_a_job_the_machine_has_no_room_for_leaves_its_gpu_to_the_next() -> None:
    """Asked before placement: the jobs held back for host memory (one for now, one for good) take
    no GPU, so a job behind them that asks for none gets one."""
    gpus = tuple(Gpu(i, "g", f"GPU-{i}", 81559, 0, ()) for i in range(3))
    look = lambda: GpuLook(gpus=gpus, source="fake", problem=None, at=time.time())  # noqa: E731
    pending = [_job(1, mem_mib=10 * G), _job(2, mem_mib=10 * G), _job(3, mem_mib=10 * G), _job(4, mem_mib=40 * G)]
    plan = Planner(look=look, host=hostroom.Cap(25 * G, 4)).plan(_snap([*pending, _job(5)]), {})
    assert [(job.id, where.gpus) for job, where in plan.starts] == [(1, (0,)), (2, (1,)), (5, (2,))]
    assert plan.waits[3].reason.startswith("waiting for host memory: 20G of 25G reserved by #1, #2")
    assert plan.waits[4].forever


def test_a_supervisor_is_never_told_to_start_a_job_that_reserves_host_resources() -> None:
    """Handing a slot on (run/successor.py) skips the worker's look: a job that asks for memory or
    CPUs is left to the worker, which sees what runs when it starts it."""
    ending = _job(1, slot=None, gpus=None)
    planner = Planner(host=hostroom.Cap(25 * G, 4))
    no_gpus = GpuLook(gpus=(), source="none", problem=None, at=time.time())
    plain = planner.successors(_snap([_job(2), _job(3, mem_mib=G), _job(4)], [ending]), ending, {}, set(), no_gpus)
    assert [job.id for job in plain] == [2]
    assert planner.successors(_snap([_job(2, cpus=1)], [ending]), ending, {}, set(), no_gpus) == []


def test_the_cap_is_the_machine_less_a_margin_unless_the_worker_says() -> None:
    said: list[str] = []
    machine = {"machine_mib": 64 * G, "machine_cpus": 16}
    cap = hostroom.cap(None, None, **machine)
    assert (cap.mem_mib, cap.cpus) == (64 * G - int(64 * G * 0.05), 16)  # 5% of 64G is more than 2G
    assert hostroom.cap(None, None, machine_mib=16 * G, machine_cpus=2).mem_mib == 14 * G  # at least 2G
    cap = hostroom.cap(25 * G, 4, **machine, say=said.append)
    assert (cap.mem_mib, cap.cpus, said) == (25 * G, 4, [])
    cap = hostroom.cap(100 * G, 32, **machine, say=said.append)
    assert (cap.mem_mib, cap.cpus) == (100 * G, 32), "a worker's setting is kept as given..."
    assert said == [  # ...and said
        "--mem 100G is more than this machine's 64G less 3.2G for the system: jobs may reserve up to 100G, as asked",
        "--cpus 32 is more than the 16 CPUs this worker may use: as asked",
    ]


def test_the_margin_is_gpuq_host_mem_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hostroom.MARGIN_ENV, "8G")
    assert hostroom.cap(None, None, machine_mib=64 * G, machine_cpus=1).mem_mib == 56 * G
    monkeypatch.setenv(hostroom.MARGIN_ENV, "plenty")
    said: list[str] = []
    assert hostroom.cap(None, None, machine_mib=64 * G, machine_cpus=1, say=said.append).mem_mib == 64 * G - 3276
    assert said == [
        "GPUQ_HOST_MEM_MARGIN: cannot read 'plenty' as a size; use 20G, 20GiB, 1.5G, 512M or 81559 (MiB); "
        "leaving the default 3.2G to the system"
    ]


def test_the_machine_is_read_as_it_is() -> None:
    cap = hostroom.cap(None, None)
    assert 0 < cap.cpus <= (os.cpu_count() or 1) and 0 <= cap.mem_mib


def test_a_job_waiting_for_host_memory_is_not_expected_before_a_holder_ends() -> None:
    """`status`'s "starts ~" (engine/tracking/queue_eta.py): a free slot is not enough for a job
    the worker holds back for host memory; it starts, at the earliest, when a job holding some ends."""
    holder, other = Job(_job(1, mem_mib=20 * G), slot="0"), Job(_job(2, cpus=1), slot="1")
    waiting = _job(3, mem_mib=10 * G, cmd=["train"], cwd="/w")
    wait = Wait("waiting for host memory: 20G of 25G reserved by #1 (it needs 10G)", False)
    slots = ["0", "1", "2"]
    assert queue_eta.plan_queue([(holder, 60.0), (other, 5.0)], [(waiting, wait)], slots, {})[3].starts_in == 60.0
    assert queue_eta.plan_queue([(holder, None)], [(waiting, wait)], slots, {})[3].starts_in is None
    assert queue_eta.plan_queue([(holder, 60.0)], [(waiting, None)], slots, {})[3].starts_in == 0.0


# ---- a real worker ---------------------------------------------------------------------------

WAIT_FOR_ITS_FILE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.02)\n"


@pytest.mark.parametrize(
    ("cap", "ask", "reason"),
    [
        (("--mem", "25G"), ("--mem", "10G"), "waiting for host memory: 20G of 25G reserved by #1, #2 (it needs 10G)"),
        (("--cpus", "5"), ("--cpus", "2"), "waiting for CPUs: 4 of 5 reserved by #1, #2 (it needs 2)"),
    ],
)
def test_a_worker_runs_two_of_three_and_the_third_when_one_ends(
    gq: Any, cap: tuple[str, str], ask: tuple[str, str], reason: str
) -> None:
    """The issue's rule, with a real worker and real jobs: three jobs that each ask for 10G
    against `gpuq run --mem 25G` (or 2 CPUs against `--cpus 5`): two run, the third waits and
    `status` says why; when one ends, the third starts. A machine without GPUs (simulated: none
    listed), three slots, so that only the host resources hold the third back."""
    (gq.work / "no-gpus.json").write_text('{"gpus": []}')
    gq.env["GPUQ_FAKE_GPUS"] = str(gq.work / "no-gpus.json")
    gq.script("job.py", WAIT_FOR_ITS_FILE)
    ids = [gq.add(*ask, "job.py", f"end-{n}") for n in (1, 2, 3)]
    gq.start_worker("--watch", "--gpus", "a,b,c", *cap)
    for job_id in ids[:2]:
        gq.wait_state(job_id, "running")
    row = wait_for(lambda: next((r for r in gq.status_json() if r["id"] == 3 and r["waiting"] == reason), None))
    assert row["state"] == "pending"
    assert reason in gq.gpuq("status").stdout
    (gq.work / "end-1").write_text("")
    gq.wait_state(ids[0], "done")
    gq.wait_state(ids[2], "running")
    for n in (2, 3):
        (gq.work / f"end-{n}").write_text("")
    for job_id in ids[1:]:
        gq.wait_state(job_id, "done")


def test_show_says_what_a_job_reserves(gq: Any) -> None:
    job_id = gq.add("--mem", "32G", "--cpus", "8", "true")
    assert "32G host memory, 8 CPUs" in gq.gpuq("show", str(job_id)).stdout


# ---- the Slurm hand-over ---------------------------------------------------------------------


def test_sbatch_gets_mem_and_cpus_per_task() -> None:
    job = Job({"id": 7, "name": "t", "cwd": "/data", "log": "/spool/logs/000007.log", "mem_mib": 10240, "cpus": 4})
    options = sbatch_options(job, spool_id="abc", slurm_ids={}, extra=["--mem=12G"], grace_seconds=90)
    assert options[-3:] == ["--mem=10240M", "--cpus-per-task=4", "--mem=12G"], "a --slurm-opt given comes last"
    plain = sbatch_options(Job(job, mem_mib=None, cpus=None), spool_id="abc", slurm_ids={}, extra=[], grace_seconds=9)
    assert not [o for o in plain if o.startswith(("--mem", "--cpus"))]


def test_a_job_handed_to_slurm_is_given_its_memory_and_cpus(gq: Any, slurm: Any) -> None:
    gq.env["SLURM_CONF"] = slurm.env["SLURM_CONF"]
    job_id = gq.add("--gpus", "0", "--mem", "64M", "--cpus", "1", "--", "sleep", "30")
    gq.gpuq("slurm", "submit", str(job_id))
    slurm_id = gq.job(job_id)["slurm"]["job_id"]
    shown = subprocess.run(
        ["scontrol", "show", "job", str(slurm_id)], env=slurm.env, capture_output=True, text=True, check=True
    ).stdout
    assert "MinMemoryNode=64M" in shown and re.search(r"\bNumCPUs=1\b", shown), shown
    gq.gpuq("cancel", str(job_id))
