"""The hand-over from the worker to a job's supervisor (issue 15): the job's file name travels with
the job, and the supervisor unlinks the pending/ copy only once the job runs (spool_layout.md,
section 6). Real files, real worker, bounded polls."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import WAIT_FOR_GO, Env, wait_for

from gpuq.core import transitions
from gpuq.core.states import INTERRUPTED, PENDING, RUNNING
from gpuq.engine.lifecycle import enqueue, repairs
from gpuq.engine.schedule.planner import Assignment
from gpuq.engine.schedule.queue_view import QueueView
from gpuq.run.launcher import Launcher
from gpuq.run.worker import CLAIM_HELD, Worker
from gpuq.spool import JobRef, Spool


def _spool_with_jobs(tmp_path: Path, count: int) -> tuple[Spool, list[JobRef]]:
    (tmp_path / "work").mkdir()
    spool = Spool(tmp_path / "spool").ensure()
    refs = [
        enqueue.enqueue(
            spool, cmd=["true"], cwd=tmp_path / "work", name=None, venv=None, env={}, shell_env={},
            after=[], after_any=[], retries=0,
        )[0]
        for _ in range(count)
    ]  # fmt: skip
    return spool, refs


def test_the_named_file_is_used_and_a_wrong_name_is_not(tmp_path: Path) -> None:
    spool, (first, second) = _spool_with_jobs(tmp_path, 2)
    assert spool.jobs.pending_ref(first.id, first.name) == first
    assert spool.jobs.pending_ref(first.id, second.name) == first, "another job's name: found by listing"
    assert spool.jobs.pending_ref(first.id, "../running/x.json") == first
    assert spool.jobs.pending_ref(first.id, None) == first
    spool.jobs.remove(first)
    assert spool.jobs.pending_ref(first.id, first.name) is None


def test_a_crash_before_the_pending_copy_went_leaves_the_running_one(tmp_path: Path) -> None:
    """The supervisor died after writing the running copy and before unlinking the pending one:
    the pending copy is never offered to start, and the next repair keeps the running copy (which,
    with no pid and no supervisor, is interrupted)."""
    spool, (ref,) = _spool_with_jobs(tmp_path, 1)
    job = spool.jobs.load(ref)
    claim = spool.claims.claim(ref.id)
    assert claim is not None
    changes = transitions.start(job, slot=None, gpus=None, boot_id="b", host="h", log="l")
    running, _new = spool.jobs.move(ref, job, RUNNING, changes, keep_old=True)
    assert spool.jobs.states_holding(ref.name, (PENDING, RUNNING)) == [PENDING, RUNNING]
    snap, _ = QueueView().look(spool, time.time())
    assert snap.pending == [] and snap.states[ref.id] == RUNNING
    claim.release()  # as its owner's death would
    repairs.reconcile(spool, full=True)
    assert spool.jobs.states_holding(ref.name, (PENDING, RUNNING, INTERRUPTED)) == [INTERRUPTED]


def test_a_started_job_has_no_pending_copy_left(gq: Env) -> None:
    gq.start_worker("--watch")
    gq.script("wait.py", WAIT_FOR_GO)
    ids = [gq.add("wait.py") for _ in range(2)]
    for job_id in ids:
        wait_for(lambda: gq.job(job_id).get("pid"), 20, what=f"job {job_id} running with its pid")  # noqa: B023
        assert not [f for f in gq.files("pending") if f.startswith(f"{job_id:06d}-")], "its pending copy is left"
        if job_id == ids[0]:
            assert [f for f in gq.files("pending") if f.startswith(f"{ids[1]:06d}-")], "the second job waits"
            (gq.work / "go").write_text("")
    gq.wait_state(ids[1], "done", 20)
    # done/'s copy is written before running/'s goes (spool_layout.md, section 6): a moment with both
    wait_for(lambda: gq.files("pending") == [] and gq.files("running") == [], 10, what="no copy left behind")


def test_a_job_changed_since_the_plan_is_not_started(tmp_path: Path) -> None:
    """The worker's view missed a change (a lost event): once it holds the claim it reads the file
    again, and a version other than the planned one starts nothing; the next look is a full one."""
    spool, (ref,) = _spool_with_jobs(tmp_path, 1)
    worker = Worker(spool, Launcher(spool), say=lambda _line: None)
    worker.view.watching(True)
    snap, _ = worker.view.look(spool, time.time())
    [planned] = snap.pending
    spool.jobs.rewrite(ref, planned, priority=5)  # nobody tells the view
    assert worker._launch(planned, Assignment(None)) == CLAIM_HELD
    assert worker.supervisors == {} and spool.claims.held(ref.id) is None, "the claim is given back"
    snap, _ = worker.view.look(spool, time.time())
    assert [j["priority"] for j in snap.pending] == [5], "a doubt: the next look read it again"


def test_the_start_order_is_the_one_spool_layout_writes_down() -> None:
    """What a supervisor is told is one typed message: its keys are the table of spool_layout.md
    section 6, it survives its encoding, and anything else is refused."""
    import dataclasses
    import re

    from gpuq.run.supervisor.order import StartOrder

    doc = (Path(__file__).resolve().parent.parent / "spool_layout.md").read_text()
    told = doc.split("**What a supervisor is told.**", 1)[1].split("**Who starts supervisors.**", 1)[0]
    keys = re.findall(r"^\| `(\w+)` \|", told, re.M)
    assert keys == [f.name for f in dataclasses.fields(StartOrder)]
    order = StartOrder(7, "000007-x.json", 3, "0,1", (0, 1), True, "echo", 1024, 60.0, 2)
    assert StartOrder.decode(order.encode()) == order
    assert StartOrder.decode(StartOrder(7, None, None, None, None).encode()).gpus is None
    for bad in (b"[]", b'{"id": 7}', b'{"id": "7", "file": null, "rev": null, "slot": null, "gpus": null}', b"{"):
        with pytest.raises(ValueError):
            StartOrder.decode(bad)


def test_a_supervisor_told_no_proper_order_leaves_the_job_pending(tmp_path: Path) -> None:
    """A spare (a new interpreter, as the launcher starts one) sent a message that is no start
    order exits, and the job stays pending with nobody holding its claim."""
    import socket

    spool, (ref,) = _spool_with_jobs(tmp_path, 1)
    launcher = Launcher(spool)
    spare = launcher._start()
    claim = spool.claims.claim(ref.id)
    assert claim is not None and spare.sock is not None
    socket.send_fds(spare.sock, [b'{"id": "not a number"}\n'], [claim.fd])
    claim.detach()
    wait_for(lambda: spare.poll() is not None, 20, what="the spare to exit")
    assert spool.jobs.find(ref.id).state == PENDING
    assert not spool.claims.held(ref.id), "the claim went with the supervisor"
