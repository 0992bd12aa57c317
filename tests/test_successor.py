"""Handing a slot on (run/successor.py, spool_layout.md section 6): the worker names ahead the jobs
a supervisor may start in its slot when its job ends, and the supervisor starts them under the same
rules as the worker. Real sockets, real files, real workers; bounded polls."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from conftest import WAIT_FOR_GO, Env, fill_up, small_tmpfs, spool_with_true_jobs, wait_for

from gpuq.core.job import Job
from gpuq.core.states import DONE, PENDING, RUNNING
from gpuq.engine.schedule.planner import Planner
from gpuq.engine.schedule.scheduler import QueueState
from gpuq.run import successor
from gpuq.run.supervisor import start as supervisor_start
from gpuq.run.supervisor.order import StartOrder
from gpuq.system.gpus import Gpu, GpuLook


def _job(job_id: int, **fields: Any) -> dict[str, Any]:
    return Job({"id": job_id, "name": f"j{job_id}", "rev": 0, "priority": 0, "after": [], "after_any": [], **fields})


def _no_gpus() -> GpuLook:
    return GpuLook(gpus=(), source="none", problem=None, at=time.time())


def _snap(pending: list[dict], running: list[dict]) -> QueueState:
    states = {j["id"]: PENDING for j in pending} | {j["id"]: RUNNING for j in running}
    return QueueState(states, pending, running, time.time())


def test_the_jobs_named_are_the_queue_in_order_up_to_one_another_waits_for() -> None:
    ending = _job(1, slot=None, gpus=None)
    pending = [_job(2), _job(3), _job(4), _job(5, after=[3])]
    names = [j["id"] for j in Planner().successors(_snap(pending, [ending]), ending, {}, set(), _no_gpus())]
    assert names == [2, 3], "after job 3, job 5 may go first or not: that is for the worker to see"


def test_nothing_is_named_when_a_queued_job_waits_for_the_ending_one() -> None:
    ending = _job(1, slot=None, gpus=None)
    for dependent in (_job(3, after=[1]), _job(3, after_any=[1])):
        assert Planner().successors(_snap([_job(2), dependent], [ending]), ending, {}, set(), _no_gpus()) == []


def test_with_gpus_the_next_job_is_named_only_for_the_gpus_it_would_get() -> None:
    """With GPUs one job is named, and only if it would get the ending job's GPUs once that job
    is gone; a CPU job (the CPU lane) hands nothing on."""
    gpus = tuple(
        Gpu(index=i, uuid=f"GPU-{i}", name="g", memory_total_mib=1000, memory_used_mib=0, processes=()) for i in (0, 1)
    )
    look = GpuLook(gpus=gpus, source="fake", problem=None, at=time.time())
    on_0, on_1 = _job(1, slot="0", gpus=[0]), _job(8, slot="1", gpus=[1])
    pending = [_job(2), _job(3)]
    named = Planner().successors(_snap(pending, [on_0, on_1]), on_0, {}, set(), look)
    assert [j["id"] for j in named] == [2], "one at a time: the next may ask for other GPUs"
    assert Planner().successors(_snap([_job(2, gpu_request=2)], [on_0, on_1]), on_0, {}, set(), look) == [], (
        "it needs both GPUs: the worker starts it once both are free"
    )
    alone = Planner().successors(_snap(pending, [on_0]), on_0, {}, set(), look)
    assert alone == [], "GPU 1 is free: the worker fills it"
    cpu_lane = _job(9, slot="", gpus=[])
    assert Planner().successors(_snap([_job(2, gpu_request=0)], [cpu_lane]), cpu_lane, {}, set(), look) == []


def test_nothing_is_named_while_another_slot_is_free() -> None:
    ending = _job(1, slot=None, gpus=None)
    assert Planner().successors(_snap([_job(2)], [ending]), ending, {}, set(), None) == [], "no look: nothing ready"
    in_slot_a = _job(1, slot="a", gpus=None)
    two_slots = Planner(labels=["a", "b"])
    two = [_job(2), _job(3)]
    assert two_slots.successors(_snap(two, [in_slot_a]), in_slot_a, {}, set(), _no_gpus()) == [], (
        "slot b is free: the worker fills it"
    )
    busy_b = _job(9, slot="b", gpus=None)
    named = two_slots.successors(_snap(two, [in_slot_a, busy_b]), in_slot_a, {}, set(), _no_gpus())
    assert [j["id"] for j in named] == [2, 3]


def test_the_supervisor_hears_the_last_whole_word_and_nothing_once_the_worker_has_gone() -> None:
    ours, theirs = socket.socketpair()
    os.set_blocking(theirs.fileno(), False)
    heard = successor.Heard(theirs.fileno())
    where = StartOrder(1, None, None, slot=None, gpus=None)
    ours.send(successor.offer(where, [(2, 0, "000002-a.json")]))
    ours.send(b"not json\n")
    last = successor.offer(where, [(3, 1, "000003-b.json"), (4, 0, "000004-c.json")])
    ours.send(last[:10])  # half a line: not taken yet
    assert [j.id for j in heard.next_jobs()] == [2]
    ours.send(last[10:])
    assert [(j.id, j.rev, j.file) for j in heard.next_jobs()] == [
        (3, 1, "000003-b.json"),
        (4, 0, "000004-c.json"),
    ]
    ours.close()
    assert heard.next_jobs() == [], "the worker has gone: nobody stands behind its last word"
    theirs.close()


def test_a_full_line_is_closed_rather_than_left_stale() -> None:
    ours, theirs = socket.socketpair()
    line = successor.offer(StartOrder(1, None, None, slot=None, gpus=None), [(2, 0, "x" * 60000)])
    sent = 0
    while successor.send(ours, line):
        sent += 1
        assert sent < 10_000
    os.set_blocking(theirs.fileno(), False)
    heard = successor.Heard(theirs.fileno())
    assert sent > 0 and heard.next_jobs() == [], "a send that failed closed the line: no word is trusted"
    ours.close()
    theirs.close()


def test_a_job_changed_since_it_was_named_is_not_begun(tmp_path: Path) -> None:
    spool, [(ref, job)] = spool_with_true_jobs(tmp_path)
    claim = spool.claims.claim(ref.id)
    assert claim is not None
    named = StartOrder(ref.id, ref.name, job["rev"] + 1, slot=None, gpus=None)
    assert supervisor_start.begin(spool, claim, named) is None
    assert spool.jobs.states_holding(ref.name, (PENDING, RUNNING)) == [PENDING]
    assert spool.claims.held(ref.id) is None, "the claim is given up"


def _warm_up(gq: Env) -> None:
    """One job first, so that the next jobs find a spare supervisor ready."""
    gq.wait_state(gq.add("true"), DONE, 20)


def _worker_has_looked(gq: Env) -> None:
    """Wait until the worker has taken a step that saw everything added so far: a file dropped in
    pending/ now is taken in (renamed) by a step whose look comes after the files added before it."""
    dropped = gq.home / "pending" / "marker.json"
    dropped.write_text(json.dumps({"cmd": ["true"], "cwd": str(gq.work)}))
    wait_for(lambda: not dropped.exists(), 20, what="the worker to take in a dropped file")


def _running_a(gq: Env) -> tuple[subprocess.Popen, int]:
    """A worker, warmed up, running job A, which waits for the file `go`."""
    worker = gq.start_worker("--watch")
    _warm_up(gq)
    gq.script("wait.py", WAIT_FOR_GO)
    a = gq.add("wait.py")
    wait_for(lambda: gq.job(a).get("pid"), 20, what="A running")
    return worker, a


def _supervisor_of(gq: Env, job_id: int) -> int:
    return gq.job(job_id)["supervisor"]["pid"]


def test_the_next_jobs_start_under_the_supervisor_of_the_job_before(gq: Env) -> None:
    _worker, first = _running_a(gq)
    following = [gq.add("true") for _ in range(3)]
    _worker_has_looked(gq)
    (gq.work / "go").write_text("")
    for job_id in following:
        gq.wait_state(job_id, DONE, 20)
    supervisors = {_supervisor_of(gq, i) for i in [first, *following]}
    assert supervisors == {_supervisor_of(gq, first)}, "each was started by the supervisor already in the slot"
    started = [gq.job(i)["started_at"] for i in following]
    assert started == sorted(started), "in queue order"
    wait_for(lambda: f"starting job #{following[-1]}" in gq.worker_output(), 10)
    assert "handed on" in gq.worker_output()


def test_a_job_waiting_for_the_ending_one_goes_first(gq: Env) -> None:
    """Job B waits for A, job C was queued after it: when A ends, B starts, not C, though C was
    ready while A ran."""
    _worker, a = _running_a(gq)
    b = gq.add("--after", str(a), "true")
    c = gq.add("true")
    _worker_has_looked(gq)
    (gq.work / "go").write_text("")
    gq.wait_state(c, DONE, 20)
    gq.wait_state(b, DONE, 20)
    assert gq.job(b)["started_at"] < gq.job(c)["started_at"]


def test_a_draining_worker_has_nothing_handed_on(gq: Env) -> None:
    worker, a = _running_a(gq)
    b = gq.add("true")
    _worker_has_looked(gq)
    gq.gpuq("stop", "--drain")
    wait_for(lambda: "draining" in gq.gpuq("status").stdout, 10, what="status to say the worker drains")
    (gq.work / "go").write_text("")
    assert worker.wait(20) == 0
    assert gq.state_of(a) == DONE and gq.state_of(b) == PENDING


def test_a_stopped_worker_leaves_the_queue_alone(gq: Env) -> None:
    """The worker stops while A runs under its supervisor: A ends, and B is not started by anyone
    (the line's end of file tells the supervisor nobody stands behind the worker's word)."""
    worker, a = _running_a(gq)
    b = gq.add("true")
    _worker_has_looked(gq)
    gq.gpuq("stop")
    assert worker.wait(20) in (0, 130)
    (gq.work / "go").write_text("")
    gq.wait_state(a, DONE, 20)
    wait_for(lambda: not (gq.home / "locks" / f"{a:06d}.lock").exists(), 10, what="A's supervisor gone")
    assert gq.state_of(b) == PENDING


def test_nothing_is_handed_on_once_the_worker_waits_for_disk_space(gq: Env, tmp_path: Path) -> None:
    """Half a MiB free: room enough to start a job, but less than a worker asks before it starts
    one (MIN_FREE_TO_START). B was named to A's supervisor; the disk fills while A runs. The worker
    takes its word back (admission is its decision, made again at its next look, not the
    supervisor's), B waits for space when A ends, and the worker starts it once space is back."""
    with small_tmpfs(tmp_path, "8m") as mount:
        gq.home, gq.work = mount / "spool", mount / "work"
        gq.env["GPUQ_HOME"] = str(gq.home)
        gq.work.mkdir()
        _worker, a = _running_a(gq)
        b = gq.add("true")
        _worker_has_looked(gq)
        filler = fill_up(gq.work)
        os.truncate(filler, filler.stat().st_size - 512 * 1024)
        wait_for(lambda: "disk full" in gq.worker_output(), 30, what="the worker to see the disk full")
        (gq.work / "go").write_text("")
        gq.wait_state(a, DONE, 20)
        wait_for(lambda: "disk space" in (next(r for r in gq.status_json() if r["id"] == b)["waiting"] or ""), 20)
        assert gq.state_of(b) == PENDING
        filler.unlink()
        gq.wait_state(b, DONE, 20)


def test_a_job_that_ended_before_its_pid_was_recorded_has_it_with_its_end(gq: Env) -> None:
    gq.start_worker("--watch")
    ids = [gq.add("true") for _ in range(5)]
    for job_id in ids:
        done = gq.wait_state(job_id, DONE, 20)
        assert done["pid"] and done["pid_create_time"] and done["supervisor"]["pid"], done


def test_trouble_with_the_next_job_does_not_cost_the_ended_one_its_end(gq: Env) -> None:
    """The next job's log cannot be opened (a directory stands in its place): that job is left as
    after a crash (interrupted), and the ended job's end is recorded all the same."""
    _worker, a = _running_a(gq)
    b = gq.add("true")
    _worker_has_looked(gq)
    (gq.home / "logs" / f"{b:06d}.log").mkdir()
    (gq.work / "go").write_text("")
    done = gq.wait_state(a, DONE, 20)
    assert done["exit_code"] == 0
    assert "could not start the next job of the slot" in gq.log(a)
    gq.wait_state(b, "interrupted", 30)


def _gpu_file(foreign_mib: int = 0) -> str:
    """One simulated GPU (GPUQ_FAKE_GPUS, read afresh at every look), with a process not gpuq's
    holding `foreign_mib` on it if that is not 0."""
    procs = [{"pid": 999999, "used_memory_mib": foreign_mib}] if foreign_mib else []
    gpu = {"index": 0, "name": "Fake", "uuid": "GPU-fake-0", "memory_total_mib": 81920}
    gpu.update(memory_used_mib=foreign_mib, processes=procs)
    return json.dumps({"gpus": [gpu]})


def _one_gpu(gq: Env) -> None:
    (gq.work / "gpus.json").write_text(_gpu_file())
    gq.env["GPUQ_FAKE_GPUS"] = str(gq.work / "gpus.json")


def test_with_gpus_the_next_job_starts_under_the_supervisor_of_the_job_before(gq: Env) -> None:
    """With GPUs the worker names one job at a time, so B waits (for `go2`) until the worker has
    looked while it runs and named C: a step the test waits for rather than races."""
    _one_gpu(gq)
    _worker, first = _running_a(gq)
    gq.script("wait2.py", WAIT_FOR_GO.replace("'go'", "'go2'"))
    following = [gq.add("wait2.py"), gq.add("true")]
    _worker_has_looked(gq)
    (gq.work / "go").write_text("")
    wait_for(lambda: gq.job(following[0]).get("pid"), 20, what="B running")
    _worker_has_looked(gq)
    _worker_has_looked(gq)  # a second step: the first one's naming of C has been sent by now
    (gq.work / "go2").write_text("")
    for job_id in following:
        assert gq.wait_state(job_id, DONE, 20)["gpus"] == [0]
    assert {_supervisor_of(gq, i) for i in [first, *following]} == {_supervisor_of(gq, first)}
    wait_for(lambda: f"starting job #{following[-1]}" in gq.worker_output(), 10)
    assert "handed on" in gq.worker_output()


def test_with_gpus_a_job_is_not_handed_on_to_a_gpu_taken_meanwhile(gq: Env) -> None:
    """B was named for A's GPU; as A ends, a process not gpuq's takes memory there (A puts it there
    itself, so that the worker has not looked since). A's supervisor looks at the GPU before it
    would start B: B is left to the worker, which waits."""
    _one_gpu(gq)
    (gq.work / "gpus-taken.json").write_text(_gpu_file(foreign_mib=40000))
    gq.start_worker("--watch")
    _warm_up(gq)
    gq.script("wait.py", WAIT_FOR_GO + "os.replace('gpus-taken.json', 'gpus.json')\n")
    a = gq.add("wait.py")
    wait_for(lambda: gq.job(a).get("pid"), 20, what="A running")
    b = gq.add("true")
    _worker_has_looked(gq)
    (gq.work / "go").write_text("")
    gq.wait_state(a, DONE, 20)
    waiting = wait_for(lambda: next(r for r in gq.status_json() if r["id"] == b)["waiting"], 20, what="B to wait")
    assert "999999" in waiting, waiting
    assert gq.state_of(b) == PENDING
    (gq.work / "gpus.json").write_text(_gpu_file())
    assert gq.wait_state(b, DONE, 20)["supervisor"]["pid"] != _supervisor_of(gq, a)


def test_a_job_named_to_a_slot_but_run_by_another_worker_is_not_said_handed_on(gq: Env) -> None:
    """Worker 0 (slot a) names B to the supervisor of its running A; worker 1 (slot b) runs B, and
    A ends, before worker 0 looks again (it is stopped meanwhile): it must not say B was started
    in its slot."""
    first = gq.start_worker("--watch", "--gpus", "a")
    gq.script("wait.py", WAIT_FOR_GO)
    a = gq.add("wait.py")
    wait_for(lambda: gq.job(a).get("pid"), 20, what="A running")
    b = gq.add("true")
    _worker_has_looked(gq)  # B is named to A's supervisor now
    os.kill(first.pid, signal.SIGSTOP)
    try:
        other = gq.start_worker("--watch", "--gpus", "b")
        assert gq.wait_state(b, DONE, 20)["slot"] == "b"
        other.terminate()
        other.wait(20)
        (gq.work / "go").write_text("")
        gq.wait_state(a, DONE, 20)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    c = gq.add("true")  # only worker 0 is left to start it, in a step after A's end was seen
    wait_for(lambda: f"starting job #{c}" in gq.worker_output(0), 20, what="worker 0 to start C")
    said = [line for line in gq.worker_output(0).splitlines() if f"starting job #{b}" in line]
    assert said == [], said
