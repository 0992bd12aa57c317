"""The hand-over from the worker to a job's supervisor (issue 15): the job's file name travels with
the job, and the supervisor unlinks the pending/ copy only once the job runs (spool_layout.md,
section 6). Real files, real worker, bounded polls."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import WAIT_FOR_GO, Env, wait_for

from gpuq.core import transitions
from gpuq.core.states import INTERRUPTED, PENDING, RUNNING
from gpuq.engine.lifecycle import enqueue, repairs
from gpuq.engine.schedule.planner import Assignment
from gpuq.engine.schedule.queue_view import QueueView
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
    assert gq.files("pending") == [] and gq.files("running") == []


def test_a_job_changed_since_the_plan_is_not_started(tmp_path: Path) -> None:
    """The worker's view missed a change (a lost event): once it holds the claim it reads the file
    again, and a version other than the planned one starts nothing; the next look is a full one."""
    spool, (ref,) = _spool_with_jobs(tmp_path, 1)
    worker = Worker(spool, say=lambda _line: None)
    worker.view.watching(True)
    snap, _ = worker.view.look(spool, time.time())
    [planned] = snap.pending
    spool.jobs.rewrite(ref, planned, priority=5)  # nobody tells the view
    assert worker._launch(planned, Assignment(None)) == CLAIM_HELD
    assert worker.launching == {} and spool.claims.held(ref.id) is None, "the claim is given back"
    snap, _ = worker.view.look(spool, time.time())
    assert [j["priority"] for j in snap.pending] == [5], "a doubt: the next look read it again"
