"""The worker's step as a plain function (huey's `tick`): tests drive `Worker.step(now)` with a fake
launcher that records what it was asked to start, on real spool files, with the GPUs simulated
through the planner's look function. What a supervisor would do (begin a job, end it, hand its slot
on) is done here with the supervisor's own functions (run/supervisor/start.py, end.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from gpuq.core.states import DONE, PENDING, PREEMPT_RESUME, PREEMPTED
from gpuq.engine.lifecycle import enqueue
from gpuq.engine.schedule import hostroom
from gpuq.engine.schedule.planner import Planner
from gpuq.run.supervisor import end, start
from gpuq.run.supervisor.order import StartOrder
from gpuq.run.worker import Worker
from gpuq.spool import Claim, JobRef, Spool
from gpuq.system.gpus import Gpu, GpuLook, GpuProcess

G = 1024  # MiB


class FakeLine:
    """A supervisor as the worker sees it: what it was told, and whether it lives."""

    def __init__(self, claim: Claim, order: StartOrder):
        self.claim, self.order = claim, order
        self.told: list[dict[str, Any]] = []
        self.listening = True
        self.code: Optional[int] = None
        self.pid = os.getpid()  # this test plays the supervisor

    def poll(self) -> Optional[int]:
        return self.code

    def tell(self, line: bytes) -> bool:
        self.told.append(json.loads(line))
        return self.listening


class FakeLauncher:
    def __init__(self) -> None:
        self.lines: list[FakeLine] = []
        self.spares = 0  # steps that asked for a spare

    def launch(self, claim: Claim, order: StartOrder) -> FakeLine:
        self.lines.append(FakeLine(claim, order))
        return self.lines[-1]

    def tend(self, spare: bool) -> None:
        self.spares += spare

    def close(self) -> None:
        pass

    def started(self) -> list[int]:
        return [line.order.id for line in self.lines]


def _spool(tmp_path: Path) -> Spool:
    (tmp_path / "work").mkdir(exist_ok=True)
    return Spool(tmp_path / "spool").ensure()


def _add(spool: Spool, tmp_path: Path, cmd: tuple[str, ...] = ("true",), **fields: Any) -> JobRef:
    ref, job = enqueue.enqueue(
        spool, cmd=list(cmd), cwd=tmp_path / "work", name=None, venv=None, env={}, shell_env={},
        after=[], after_any=[], retries=0,
    )  # fmt: skip
    if fields:
        spool.jobs.rewrite(ref, job, **fields)
    return spool.jobs.find(ref.id)


def _no_gpus() -> GpuLook:
    return GpuLook(gpus=(), source="none", problem=None, at=time.time())


def _worker(spool: Spool, planner: Planner) -> tuple[Worker, FakeLauncher, list[str]]:
    said: list[str] = []
    launcher = FakeLauncher()
    return Worker(spool, launcher, say=said.append, planner=planner), launcher, said


def _begin(spool: Spool, line: FakeLine, order: Optional[StartOrder] = None) -> tuple[start.Run, subprocess.Popen]:
    """What the supervisor does with its order: the job moved to running/, its process started (a
    `sleep` in a session of its own) and recorded."""
    order = order or line.order
    claim = line.claim if order is line.order else spool.claims.claim(order.id)
    run = start.begin(spool, claim, order)
    assert run is not None
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    start.drop_queued_copy(run)
    supervisor = {"pid": os.getpid(), "create_time": 0.0, "boot_id": ""}  # this test plays the supervisor
    run.job = spool.jobs.rewrite(run.ref, run.job, pid=process.pid, supervisor=supervisor)
    return run, process


def _end(run: start.Run, process: subprocess.Popen) -> None:
    """The job's process gone, its end recorded as a success."""
    process.kill()
    process.wait()
    end.finish(run, exit_code=0, sig=None, note=None, retry=False)


def test_the_next_jobs_of_a_slot_are_named_to_its_supervisor_and_followed(tmp_path: Path) -> None:
    """Hand-on: the supervisor of the job the worker started is told the jobs that follow in its
    slot; when it has started the next one itself, the worker says so and tells it what follows."""
    spool = _spool(tmp_path)
    a, b, c = (_add(spool, tmp_path) for _ in range(3))
    worker, launcher, said = _worker(spool, Planner(look=_no_gpus))
    result = worker.step(time.time())
    assert result.started == [a.id] and launcher.started() == [a.id] and result.busy
    [line] = launcher.lines
    files = {ref.id: ref.name for ref in (b, c)}
    assert [job[:1] + job[2:] for job in line.told[-1]["next"]] == [[b.id, files[b.id]], [c.id, files[c.id]]]
    run, process = _begin(spool, line)
    worker.step(time.time())
    assert len(line.told) == 1, "nothing changed: nothing more is said"

    # A ended by itself: its supervisor starts B (named first) before it records A's end
    named = [StartOrder.from_fields(dict(line.told[-1], id=i, rev=r, file=f)) for i, r, f in line.told[-1]["next"]]
    run_b, process_b = _begin(spool, line, named[0])
    _end(run, process)
    result = worker.step(time.time())
    assert result.started == [] and launcher.started() == [a.id], "B was not started by the worker"
    assert any(f"starting job #{b.id}" in s and "handed on in its slot" in s for s in said), said
    assert line.told[-1]["id"] == b.id and [job[0] for job in line.told[-1]["next"]] == [c.id]
    _end(run_b, process_b)
    assert spool.jobs.find(a.id).state == DONE and spool.jobs.find(b.id).state == DONE


def test_nothing_is_named_while_the_disk_is_too_full_to_start(tmp_path: Path, monkeypatch: Any) -> None:
    from gpuq.run import worker as worker_module

    spool = _spool(tmp_path)
    b = [_add(spool, tmp_path) for _ in range(2)][1]
    worker, launcher, said = _worker(spool, Planner(look=_no_gpus))
    worker.step(time.time())
    [line] = launcher.lines
    assert [job[0] for job in line.told[-1]["next"]] == [b.id]
    # the filesystem as full as a worker will not start jobs on: the free space it asks for, raised
    monkeypatch.setattr(worker_module, "MIN_FREE_TO_START", 1 << 62)
    result = worker.step(time.time())
    assert line.told[-1]["next"] == [], "the word taken back"
    assert result.space_wait and any("disk full" in s for s in said)
    run, process = _begin(spool, line)
    _end(run, process)
    result = worker.step(time.time())
    assert result.started == [] and "waiting for disk space" in worker.waits[b.id].reason


def _gpu(index: int, foreign_mib: int = 0) -> Gpu:
    procs = (GpuProcess(pid=999_999, used_memory_mib=foreign_mib),) if foreign_mib else ()
    return Gpu(
        index=index,
        uuid=f"GPU-{index}",
        name="g",
        memory_total_mib=80 * G,
        memory_used_mib=foreign_mib,
        processes=procs,
    )


def test_gpu_jobs_are_placed_on_the_free_gpus_and_wait_for_the_others(tmp_path: Path) -> None:
    """Two simulated GPUs, one holding 40 GiB of a process not gpuq's: the first job gets the free
    GPU, the next two wait (naming the process, and the job on the other GPU); once the memory is
    freed, the next look starts the waiting job there."""
    spool = _spool(tmp_path)
    first, second, third = (_add(spool, tmp_path) for _ in range(3))
    seen = {"gpus": (_gpu(0, foreign_mib=40 * G), _gpu(1))}

    def look() -> GpuLook:
        return GpuLook(gpus=seen["gpus"], source="fake", problem=None, at=time.time())

    worker, launcher, _said = _worker(spool, Planner(look=look))
    result = worker.step(time.time())
    assert result.started == [first.id] and result.gpu_wait
    [line] = launcher.lines
    assert (line.order.slot, line.order.gpus) == ("1", (1,))
    assert "GPU 0" in worker.waits[second.id].reason and "999999" in worker.waits[second.id].reason
    assert f"GPU 1: job #{first.id}" in worker.waits[third.id].reason
    seen["gpus"] = (_gpu(0), _gpu(1))
    result = worker.step(time.time())
    assert result.started == [second.id] and (launcher.lines[1].order.gpus, launcher.lines[1].order.slot) == ((0,), "0")
    assert third.id in worker.waits  # both GPUs taken: it waits for one


def test_jobs_asking_for_host_memory_start_as_the_cap_has_room(tmp_path: Path) -> None:
    """A worker that may hand out 10G: of two jobs asking 6G each, one starts and the other waits,
    saying for what; a job asking for nothing takes the other slot; once the first has ended, the
    second starts."""
    spool = _spool(tmp_path)
    big, second, small = (
        _add(spool, tmp_path, mem_mib=6 * G),
        _add(spool, tmp_path, mem_mib=6 * G),
        _add(spool, tmp_path),
    )
    planner = Planner(labels=["a", "b"], look=_no_gpus, host=hostroom.Cap(10 * G, 8))
    worker, launcher, _said = _worker(spool, planner)
    result = worker.step(time.time())
    assert result.started == [big.id, small.id]
    assert worker.waits[second.id].reason.startswith("waiting for host memory: 6G of 10G reserved by #")
    runs = [_begin(spool, line) for line in launcher.lines]
    assert worker.step(time.time()).started == []
    _end(*runs[0])
    result = worker.step(time.time())
    assert result.started == [second.id] and launcher.lines[-1].order.slot == "a"
    _end(*runs[1])


def test_an_urgent_job_preempts_a_running_one_and_takes_its_slot(tmp_path: Path) -> None:
    """One slot, a --preemptible job running in it, an urgent job queued: the worker asks the
    running job to stop (its process gets SIGTERM) and starts nothing until it has; the job ends
    preempted, goes back in the queue first in line, and the urgent job starts in the slot."""
    spool = _spool(tmp_path)
    victim = _add(spool, tmp_path, preemptible=True)
    worker, launcher, said = _worker(spool, Planner(look=_no_gpus))
    worker.step(time.time())
    run, process = _begin(spool, launcher.lines[0])
    urgent = _add(spool, tmp_path, urgent=True)
    result = worker.step(time.time())
    assert result.started == [] and launcher.started() == [victim.id]
    assert spool.control.peek(victim.id) == PREEMPT_RESUME
    assert any(f"preempting job #{victim.id}" in s for s in said), said
    assert process.wait(10) == -15, "SIGTERM to the job's process group"
    assert worker.step(time.time()).started == [], "its job still in running/: the slot is held"
    end.finish(run, exit_code=143, sig=15, note=None, retry=True)  # its supervisor records the preemption
    assert spool.jobs.find(victim.id).state == PREEMPTED
    result = worker.step(time.time())
    assert result.started == [urgent.id] and launcher.lines[-1].order.slot is None
    back = spool.jobs.load(spool.jobs.find(victim.id))
    assert spool.jobs.find(victim.id).state == PENDING and back.queue_front and back.preemptions
    assert worker.step(time.time()).started == [], "it waits for the urgent job's slot"


def test_an_out_of_memory_retry_is_placed_again_with_its_doubled_share(tmp_path: Path, monkeypatch: Any) -> None:
    """A 20G job on a 32G GPU (the best fit) dies of CUDA out-of-memory: its end sends it back with
    40G, and the next step places it on the 80G GPU, where 40G fits; GPUQ_OOM_RETRY=1 is in the
    environment its next start gets."""
    from gpuq.core.jobenv import add_job_variables

    spool = _spool(tmp_path)
    small = Gpu(index=0, uuid="GPU-0", name="g", memory_total_mib=32 * G, memory_used_mib=0, processes=())
    seen = (small, _gpu(1))
    fake = tmp_path / "gpus.json"
    fake.write_text(json.dumps({"gpus": [{**g._asdict(), "processes": []} for g in seen]}))
    monkeypatch.setenv("GPUQ_FAKE_GPUS", str(fake))  # what the supervisor's own look sees

    def look() -> GpuLook:
        return GpuLook(gpus=seen, source="fake", problem=None, at=time.time())

    job = _add(spool, tmp_path, gpu_mem_mib=20 * G, retries=1)
    worker, launcher, _said = _worker(spool, Planner(look=look))
    assert worker.step(time.time()).started == [job.id] and launcher.lines[0].order.gpus == (0,)
    run, process = _begin(spool, launcher.lines[0])
    os.write(run.log_fd, b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    process.kill()
    process.wait()
    end.finish(run, exit_code=1, sig=None, note=None, retry=True)
    back = spool.jobs.load(spool.jobs.find(job.id, (PENDING,)))
    assert (back.gpu_mem_mib, back.oom_retries) == (40 * G, 1)
    assert add_job_variables({}, back)["GPUQ_OOM_RETRY"] == "1"
    launcher.lines[0].code = 0  # its supervisor is gone
    result = worker.step(time.time())
    assert result.started == [job.id] and launcher.lines[-1].order.gpus == (1,)


def test_a_job_still_starting_holds_only_its_share_and_the_next_one_packs_beside_it(tmp_path: Path) -> None:
    """A 20G job handed to its supervisor but not yet in running/ counts its 20G on its GPU, not the
    whole GPU: a 20G job queued just after it starts beside it at the next step; a whole-GPU job
    waits for the GPU, naming the starting one."""
    spool = _spool(tmp_path)
    first = _add(spool, tmp_path, gpu_mem_mib=20 * G)
    worker, launcher, _said = _worker(spool, Planner(look=lambda: GpuLook((_gpu(0),), "fake", None, time.time())))
    assert worker.step(time.time()).started == [first.id]  # its supervisor has not begun it yet
    second = _add(spool, tmp_path, gpu_mem_mib=20 * G)
    whole = _add(spool, tmp_path)
    assert worker.step(time.time()).started == [second.id]
    assert [line.order.gpus for line in launcher.lines] == [(0,), (0,)]
    assert f"job #{first.id}" in worker.waits[whole.id].reason
