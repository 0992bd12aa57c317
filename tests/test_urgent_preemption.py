"""An urgent job preempts at most what it needs, the job `add --urgent` named, and a job put back
by a preemption never preempts another (spool_layout.md section 11, "Who may preempt").

The victims here take a moment to let go, as a trainer saving its state on SIGTERM does: the urgent
job is then started while its own file is still in pending/, which once made the worker count it as
an urgent job still waiting and preempt a second victim for it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Env, wait_for
from test_gpu_worker import Gpus, fake_gpus

from gpuq.core.job import Job
from gpuq.core.states import PENDING, RUNNING
from gpuq.core.times import iso_of
from gpuq.engine.schedule import victims
from gpuq.engine.schedule.planner import Assignment, Planner
from gpuq.engine.schedule.scheduler import QueueState
from gpuq.spool import Spool
from gpuq.system.gpus import Gpu, GpuLook, GpuProcess

FAKE = Path(__file__).with_name("fake_trainer.py")
SLOW_SAVE = ("--save_on_sigterm", "--save_time", "2.5", "--save_steps", "100000", "--max_steps", "100000")


def trainer(gq: Env, name: str, *gpuq_opts: str, steps: tuple[str, ...] = SLOW_SAVE) -> list[str]:
    shutil.copy(FAKE, gq.work / "fake_trainer.py")
    return [*gpuq_opts, "--name", name, "-p", sys.executable, "fake_trainer.py", "--output_dir", name, *steps]


def steps_of(gq: Env, job_id: int) -> int:
    found = re.findall(r"Step (\d+)/", gq.log(job_id))
    return int(found[-1]) if found else 0


def runs(gq: Env, name: str) -> list[str]:
    path = gq.work / name / "runs.txt"
    return path.read_text().split("\n")[:-1] if path.exists() else []


@pytest.mark.parametrize("urgent", ["--urgent", "--urgent=force"])
def test_one_urgent_job_preempts_one_job_the_one_add_named(gq: Env, urgent: str) -> None:
    Gpus(gq, fake_gpus(2))
    pa = gq.add(*trainer(gq, "PA", "--preemptible"))
    pb = gq.add(*trainer(gq, "PB", "--preemptible"))
    gq.start_worker("--watch")
    wait_for(lambda: steps_of(gq, pa) >= 3 and steps_of(gq, pb) >= 3, 30, what="both trainings to run")

    added = gq.gpuq("add", *trainer(gq, "U2", urgent, steps=("--max_steps", "3")))
    named = re.search(r"job #(\d+) (P[AB]) is preempted and resumed after", added.stdout)
    assert named, added.stdout
    victim, name = int(named.group(1)), named.group(2)
    spared, spared_name = (pa, "PA") if victim == pb else (pb, "PB")
    spared_pid = gq.job(spared)["pid"]
    u2 = int(re.search(r"Job #(\d+)", added.stdout).group(1))

    gq.wait_state(u2, "done", timeout=40)
    # the victim goes back first in line and waits for a GPU: it starts again when U2's GPU is free
    wait_for(lambda: len(gq.job(victim)["preemptions"]) == 1 and gq.state_of(victim) == RUNNING, 30, what="resumed")
    wait_for(lambda: "Resumed from step" in gq.log(victim).rsplit("=== gpuq: job #", 1)[-1], 20, what="2nd run")

    assert gq.state_of(spared) == RUNNING and gq.job(spared)["pid"] == spared_pid
    assert gq.job(spared)["preemptions"] == [] and runs(gq, spared_name) == []  # never stopped
    assert runs(gq, name) and len(runs(gq, name)) == 1  # the victim stopped once, saving its step
    out = gq.worker_output()
    assert f"preempting job #{spared} " not in out and out.count("preempting job #") == 1, out
    for job_id in (pa, pb):
        gq.gpuq("kill", str(job_id))


def _gpus(count: int) -> GpuLook:
    gpus = tuple(
        Gpu(index=i, uuid=f"GPU-{i}", name="g", memory_total_mib=80000, memory_used_mib=0, processes=())
        for i in range(count)
    )
    return GpuLook(gpus=gpus, source="fake", problem=None, at=time.time())


def _job(job_id: int, **fields: Any) -> Job:
    base = {"id": job_id, "name": f"j{job_id}", "rev": 0, "priority": 0, "after": [], "after_any": []}
    base.update(cmd=["train.py"], cwd="/nonexistent")  # no checkpoints to be found there
    return Job({**base, **fields})


def _running(job_id: int, gpu: int, started: str) -> Job:
    return _job(
        job_id,
        slot=str(gpu),
        gpus=[gpu],
        pid=10_000_000 + job_id,
        preemptible=True,
        started_at=started,
        cmd=["x"],
        cwd="/nonexistent",
    )


def _snap(pending: list[Job], running: list[Job]) -> QueueState:
    states = {j.id: PENDING for j in pending} | {j.id: RUNNING for j in running}
    return QueueState(states, pending, running, time.time())


def test_an_urgent_job_being_started_is_not_waiting_for_a_victim() -> None:
    """The step after the worker handed the urgent job to its supervisor (its file still in
    pending/, its GPU held for it as `busy`), it is no reason to preempt anyone."""
    pa = _running(1, 0, "2026-01-01T00:00:00+00:00")
    urgent = _job(3, urgent=True)
    planner = Planner(look=lambda: _gpus(2))
    plan = planner.plan(_snap([urgent], [pa]), busy={3: Assignment("1", (1,))})
    assert plan.victims == [] and plan.starts == []


def test_without_gpus_an_urgent_job_being_started_is_not_waiting_either() -> None:
    pa = _job(
        1,
        slot="a",
        gpus=None,
        pid=10_000_001,
        preemptible=True,
        started_at="2026-01-01T00:00:00+00:00",
        cmd=["x"],
        cwd="/nonexistent",
    )
    urgent = _job(3, urgent=True)
    planner = Planner(["a", "b"], look=lambda: GpuLook(gpus=(), source="none", problem=None, at=time.time()))
    plan = planner.plan(_snap([urgent], [pa]), busy={3: Assignment("b")})
    assert plan.victims == [] and plan.starts == []


def test_a_job_put_back_by_a_preemption_preempts_no_one() -> None:
    """An urgent job that was itself preempted (by a person) and resumed waits for a free GPU."""
    pa = _running(1, 0, "2026-01-01T00:00:00+00:00")
    pb = _running(2, 1, "2026-01-01T00:00:01+00:00")
    record = {"at": "2026-01-01T00:00:02+00:00", "by": "user", "exit_code": 0, "checkpoint": None}
    back = _job(3, urgent=True, queue_front=True, preemptions=[record])
    plan = Planner(look=lambda: _gpus(2)).plan(_snap([back], [pa, pb]), busy={})
    assert plan.victims == [] and 3 in plan.waits


def test_a_victim_whose_gpu_would_not_free_up_is_not_preempted_beside_the_one_that_helps() -> None:
    """GPU 0 also holds someone else's 70 GiB: preempting the job there (the first in preference,
    lowest priority) would not make room, so only the job on GPU 1 is preempted, not both."""
    foreign = GpuProcess(pid=999_999_999, used_memory_mib=70000)
    gpus = (
        Gpu(index=0, uuid="GPU-0", name="g", memory_total_mib=80000, memory_used_mib=70000, processes=(foreign,)),
        Gpu(index=1, uuid="GPU-1", name="g", memory_total_mib=80000, memory_used_mib=0, processes=()),
    )
    look = GpuLook(gpus=gpus, source="fake", problem=None, at=time.time())
    low = _job(1, **{**_running(1, 0, "2026-01-01T00:00:00+00:00"), "priority": -1})
    other = _running(2, 1, "2026-01-01T00:00:01+00:00")
    plan = Planner(look=lambda: look).plan(_snap([_job(3, urgent=True)], [low, other]), busy={})
    assert [victim.id for victim in plan.victims] == [2]


def test_add_names_the_job_the_worker_would_preempt_not_a_cpu_job() -> None:
    """`add --urgent` names the job the worker's plan chooses: with GPUs, a GPU job, even where a
    CPU job (the CPU lane) started later."""
    gpu_job = _running(1, 0, "2026-01-01T00:00:00+00:00")
    cpu_job = _job(2, slot="", gpus=[], pid=10_000_002, preemptible=True, started_at="2026-01-01T00:00:05+00:00")
    urgent = _job(3, urgent=True, gpu_request=1)
    assert "job #1 j1 is preempted" in victims.foreseen(urgent, [gpu_job, cpu_job])
    plan = Planner(look=lambda: _gpus(1)).plan(_snap([urgent], [gpu_job, cpu_job]), busy={})
    assert [victim.id for victim in plan.victims] == [1]


def test_of_the_jobs_that_can_continue_the_one_that_loses_the_least_work_is_preempted(tmp_path: Path) -> None:
    """Two whole-GPU jobs with checkpoints: the one started last saved 40 s ago, the other a second
    ago. Preempting the first would throw away 40 s of a GPU, the second 1 s: the second goes."""
    now = time.time()

    def trained(job_id: int, started: float, saved: float) -> Job:
        ckpt = tmp_path / f"out{job_id}" / "checkpoint-10"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
        for path in (ckpt / "trainer_state.json", ckpt):
            os.utime(path, (saved, saved))
        return _job(
            job_id, slot=str(job_id - 1), gpus=[job_id - 1], pid=10_000_000 + job_id, started_at=iso_of(started),
            cmd=["train.py", "--output_dir", f"out{job_id}"], cwd=str(tmp_path),
        )  # fmt: skip

    early = trained(1, now - 100, now - 1)
    late = trained(2, now - 50, now - 40)
    urgent = _job(3, urgent=True)
    assert [job.id for job in victims.in_preference(victims.candidates(urgent, [early, late]), urgent)] == [1, 2]
    assert victims.lost_work(early, now) < victims.lost_work(late, now)
    plan = Planner(look=lambda: _gpus(2)).plan(_snap([urgent], [early, late]), busy={})
    assert [victim.id for victim in plan.victims] == [1]


def _shared(job_id: int, gpu: int, started: str, **fields: Any) -> Job:
    return _job(job_id, **{**_running(job_id, gpu, started), "gpu_mem_mib": 30000, **fields})


def test_the_gpus_emptied_for_an_urgent_job_are_kept_for_it() -> None:
    """A whole-GPU urgent job is emptying GPU 1 of its two shared jobs. C is back first in line while
    D, still in running/, lets go: C must not start beside D again (it did, and was preempted again,
    round after round); nor may a plain urgent job ahead take what was emptied for this one."""
    a, b = _shared(1, 0, "2026-01-01T00:00:00+00:00"), _shared(2, 0, "2026-01-01T00:00:01+00:00")
    d = _shared(4, 1, "2026-01-01T00:00:03+00:00")
    back = _job(3, gpu_mem_mib=30000, queue_front=True, auto_resume=True)  # C, back in line
    urgent = _job(5, urgent=True)
    busy = {4: Assignment.of_job(d)}

    def plan(pending: list[Job], running: list[Job], kept: bool) -> Any:
        preempting = {4} if d in running else set()
        kept_for = (5, frozenset({1})) if kept else None
        return Planner(look=lambda: _gpus(2)).plan(_snap(pending, running), busy, preempting, kept_for)

    assert [job.id for job, _where in plan([urgent, back], [a, b, d], kept=False).starts] == [3]  # as it was
    now = plan([urgent, back], [a, b, d], kept=True)
    assert now.starts == [] and now.victims == []
    assert now.waits[3].reason == "waiting behind job #5 (urgent: the GPUs its preemptions empty are kept for it)"
    busy.clear()  # D gone: GPU 1 is the urgent job's, even with a plain urgent job ahead of it
    ahead = _job(6, urgent=True)
    later = plan([ahead, urgent, back], [a, b], kept=True)
    assert [(job.id, where.gpus) for job, where in later.starts] == [(5, (1,))] and 6 in later.waits


def test_an_urgent_force_job_preempts_behind_an_urgent_job_that_cannot() -> None:
    """U1 (--urgent) finds no job that can continue; U2 (--urgent=force) behind it may take one."""
    plain = _job(1, **{**_running(1, 0, "2026-01-01T00:00:00+00:00"), "preemptible": False})
    u1, u2 = _job(2, urgent=True), _job(3, urgent="force")
    plan = Planner(look=lambda: _gpus(1)).plan(_snap([u1, u2], [plain]), busy={})
    assert [victim.id for victim in plan.victims] == [1] and plan.victims_for == 3


def test_a_control_request_left_for_an_earlier_run_is_not_this_runs(gq: Env) -> None:
    """A second preemption request that reached a run already stopping outlived it; the next run,
    which then ran to its end, was recorded as preempted and run a third time."""
    spool = Spool(gq.home).ensure()
    spool.control.request(7, "preempt-resume")
    made = time.time()
    assert spool.control.take(7, since=made + 1) is None and spool.control.ids() == []
    spool.control.request(7, "preempt-resume")
    assert spool.control.take(7, since=made - 1) == "preempt-resume"


def test_an_urgent_whole_gpu_job_preempts_the_jobs_sharing_one_gpu_once(gq: Env) -> None:
    """Four --gpu-mem 30G trainings, two on each of two GPUs; an urgent job needs a whole GPU: the
    two on one GPU are preempted, once each, it runs, they resume; the other two never stop."""
    Gpus(gq, fake_gpus(2))
    slow = ("--save_on_sigterm", "--save_time", "0.5", "--save_steps", "100000", "--max_steps", "100000")
    ids = [gq.add(*trainer(gq, name, "--preemptible", "--gpu-mem", "30G", steps=slow)) for name in "ABCD"]
    gq.start_worker("--watch")
    wait_for(lambda: all(steps_of(gq, i) >= 2 for i in ids), 30, what="four trainings to run")
    added = gq.gpuq("add", *trainer(gq, "W", "--urgent", steps=("--max_steps", "3")))
    assert "are preempted and resumed after" in added.stdout and "(on GPU " in added.stdout, added.stdout
    named = {int(i) for i in re.findall(r"#(\d+) [A-D]\b", added.stdout)}
    urgent = int(re.search(r"Job #(\d+)", added.stdout).group(1))
    gq.wait_state(urgent, "done", timeout=40)
    stopped = [i for i in ids if gq.job(i)["preemptions"]]
    wait_for(lambda: all(gq.state_of(i) == RUNNING for i in ids), 30, what="the two victims resumed")
    out = gq.worker_output()
    assert len(stopped) == 2 and out.count("preempting job #") == 2 and set(stopped) == named, (out, named)
    assert len({gq.job(i)["gpus"][0] for i in stopped}) == 1  # the two of one GPU
    for i in stopped:
        assert len(gq.job(i)["preemptions"]) == 1 and len(runs(gq, gq.job(i)["name"])) == 1
    for i in ids:
        gq.gpuq("kill", str(i))


def test_add_names_every_job_the_gpus_an_urgent_job_needs_hold() -> None:
    """A whole-GPU urgent job for two GPUs, two shared jobs on GPU 0 and one on GPU 1: all three go
    (`add` named the two of GPU 0 only); for one GPU, the pair the worker would choose."""
    a, b = _shared(1, 0, "2026-01-01T00:00:00+00:00"), _shared(2, 0, "2026-01-01T00:00:01+00:00")
    c = _running(3, 1, "2026-01-01T00:00:02+00:00")
    two = _job(4, urgent=True, gpu_request=2)
    said = victims.foreseen(two, [a, b, c])
    assert all(f"#{i} j{i}" in said for i in (1, 2, 3)) and "(on GPU 0,1)" in said, said
    plan = Planner(look=lambda: _gpus(2)).plan(_snap([two], [a, b, c]), busy={})
    assert sorted(victim.id for victim in plan.victims) == [1, 2, 3]
    one = _job(4, urgent=True)
    plan = Planner(look=lambda: _gpus(2)).plan(_snap([one], [a, b, c]), busy={})
    assert f"job #{plan.victims[0].id} " in victims.foreseen(one, [a, b, c]) and len(plan.victims) == 1


def test_an_urgent_job_whose_gpus_are_kept_preempts_no_more() -> None:
    """Its victim gone, the GPU kept for it is taken by another program: it waits, and the job on
    the other GPU (about to end) is not preempted in turn."""
    foreign = GpuProcess(pid=999_999_999, used_memory_mib=20000)
    gpus = (
        Gpu(index=0, uuid="GPU-0", name="g", memory_total_mib=80000, memory_used_mib=20000, processes=(foreign,)),
        Gpu(index=1, uuid="GPU-1", name="g", memory_total_mib=80000, memory_used_mib=0, processes=()),
    )
    look = GpuLook(gpus=gpus, source="fake", problem=None, at=time.time())
    other = _running(2, 1, "2026-01-01T00:00:01+00:00")
    urgent = _job(3, urgent=True)
    kept = Planner(look=lambda: look).plan(_snap([urgent], [other]), {}, set(), (3, frozenset({0})))
    assert kept.victims == [] and 3 in kept.waits
    assert [v.id for v in Planner(look=lambda: look).plan(_snap([urgent], [other]), busy={}).victims] == [2]


def test_wait_waits_for_a_victim_that_comes_back_by_itself_and_its_dependents(gq: Env) -> None:
    """A job preempted for an urgent one is put back in line by the worker: `gpuq wait` said it
    `preempted` (exit 1) if it looked before the worker did, and its `--after` job `blocked ... runs
    after gpuq resume`. The test holds the victim's claim, so that the worker cannot put it back yet."""
    from gpuq.core.states import HELD, PREEMPTED
    from gpuq.engine.lifecycle import actions

    victim = gq.add("--hold", "true")
    after = gq.add("--after", str(victim), "true")
    spool = Spool(gq.home)
    ref = spool.jobs.find(victim, (HELD,))
    assert ref is not None
    spool.jobs.move(ref, spool.jobs.load(ref), PREEMPTED, {"auto_resume": True})  # as `add --urgent` leaves it
    assert not actions.will_not_start(spool, after)  # `log -f` waits for it, as `wait` does

    alone = gq.gpuq("wait", str(victim), str(after), check=False)  # no worker: nothing would put it back
    assert alone.returncode == 1 and alone.stdout == ""
    assert f"no worker is running; #{victim}, #{after} wait for `gpuq run --daemon`" in alone.stderr

    claim = spool.claims.claim(victim)  # the worker tries again each step, until it is let go
    assert claim is not None
    try:
        gq.start_worker("--watch")
        wait_for(lambda: "worker: running" in gq.gpuq("status").stdout, 15, what="the worker")
        waited = gq.gpuq("wait", "--timeout", "2", str(victim), str(after), check=False)
        assert waited.stdout == (  # it said `#N pending` of the victim, whose file is in preempted/
            f"#{victim} preempted: for an urgent job, resumes by itself; still waiting when --timeout ran out\n"
            f"#{after} pending: still waiting when --timeout ran out\n"
        )
        assert gq.gpuq("wait", "--timeout", "2", check=False).stdout.startswith(f"#{victim} preempted: for an")
        assert gq.state_of(victim) == PREEMPTED
    finally:
        claim.release()
    done = gq.gpuq("wait", str(victim), str(after), check=False, timeout=60)
    assert (done.returncode, done.stdout) == (0, "all 2 jobs done\n")
