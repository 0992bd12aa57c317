"""The worker's incremental view of the queue (engine/schedule/queue_view.py): files named by events are
read again whatever their inode, a job leaving pending/ and running/ is found where it went, and
every doubt (no events, a hint lost, a supervisor that found its job gone) means a full look.
Real files; the last test runs a real worker with its real observer."""

from __future__ import annotations

import os
import time
from pathlib import Path

from conftest import WAIT_FOR_GO, Env, wait_for

from gpuq.core.states import DONE, HELD, PENDING, RUNNING
from gpuq.engine.lifecycle import enqueue
from gpuq.engine.schedule.queue_view import FULL_LOOK_SECONDS, QueueView
from gpuq.spool import JobRef, Spool


def _spool(tmp_path: Path) -> Spool:
    (tmp_path / "work").mkdir()
    return Spool(tmp_path / "spool").ensure()


def _add(spool: Spool, tmp_path: Path, after: tuple[int, ...] = ()) -> tuple[JobRef, dict]:
    return enqueue.enqueue(
        spool, cmd=["true"], cwd=tmp_path / "work", name=None, venv=None, env={}, shell_env={},
        after=list(after), after_any=[], retries=0,
    )  # fmt: skip


def _watching_view(spool: Spool, now: float) -> QueueView:
    view = QueueView()
    view.watching(True)
    view.look(spool, now)  # the first look is a full one
    assert view.full_at == now
    return view


def test_a_named_file_is_read_again_even_if_it_left_and_came_back(tmp_path: Path) -> None:
    """The case a stat cannot tell: the job leaves pending/ and comes back (here a hold and a
    release with a new `after`) between two looks. The events name it, so its new version is used."""
    spool = _spool(tmp_path)
    first, _job = _add(spool, tmp_path)
    ref, job = _add(spool, tmp_path)
    now = time.time()
    view = _watching_view(spool, now)
    held_ref, held = spool.jobs.move(ref, job, HELD, {})
    back_ref, _back = spool.jobs.move(held_ref, held, PENDING, {"after": [first.id]})
    view.note(PENDING, ref.name)  # the observer saw the file go, and come back
    view.note(PENDING, back_ref.name)
    snap, _invalid = view.look(spool, now + 1)
    assert view.full_at == now, "within FULL_LOOK_SECONDS, with events, the look is not a full one"
    [again] = [j for j in snap.pending if j["id"] == ref.id]
    assert again["after"] == [first.id] and again["rev"] == job["rev"] + 2


def test_a_job_that_left_is_found_where_it_went(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    ref, job = _add(spool, tmp_path)
    dependent, _ = _add(spool, tmp_path, after=(ref.id,))
    now = time.time()
    view = _watching_view(spool, now)
    running_ref, running = spool.jobs.move(ref, job, RUNNING, {})
    view.note(RUNNING, ref.name)
    view.note(PENDING, ref.name)
    snap, _ = view.look(spool, now + 1)
    assert snap.states[ref.id] == RUNNING and [j["id"] for j in snap.running] == [ref.id]
    assert [j["id"] for j in snap.pending] == [dependent.id]
    spool.jobs.move(running_ref, running, DONE, {})
    view.note(RUNNING, ref.name)
    snap, _ = view.look(spool, now + 2)
    assert snap.states[ref.id] == DONE and snap.running == []
    assert view.full_at == now


def test_without_events_or_after_a_doubt_every_look_is_full(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    ref, job = _add(spool, tmp_path)
    now = time.time()
    view = QueueView()  # no observer: as a test calling Worker.step() one step at a time
    view.look(spool, now)
    spool.jobs.move(ref, job, DONE, {})  # nobody tells the view
    snap, _ = view.look(spool, now + 1)
    assert snap.states[ref.id] == DONE and view.full_at == now + 1

    view = _watching_view(spool, now)
    other, _ = _add(spool, tmp_path)  # no hint: a lost event
    snap, _ = view.look(spool, now + 1)
    assert other.id not in snap.states, "a lost event is not seen before the next full look..."
    snap, _ = view.look(spool, now + FULL_LOOK_SECONDS)
    assert snap.states[other.id] == PENDING, "...which comes FULL_LOOK_SECONDS later at the latest"
    spool.jobs.remove(other)
    view.doubt()
    snap, _ = view.look(spool, now + FULL_LOOK_SECONDS + 1)
    assert other.id not in snap.states and view.full_at == now + FULL_LOOK_SECONDS + 1


def test_a_new_observer_means_a_full_look(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    now = time.time()
    view = _watching_view(spool, now)
    view.watching(False)  # the observer died
    ref, _ = _add(spool, tmp_path)
    view.watching(True)  # a new one: it did not see what happened before it started
    snap, _ = view.look(spool, now + 1)
    assert snap.states[ref.id] == PENDING and view.full_at == now + 1


def test_dropped_files_are_taken_in_only_when_some_may_be_there(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    now = time.time()
    view = _watching_view(spool, now)
    assert not view.intake_due(now + 1), "an empty pending/ after a full look: no intake turn"
    (Path(spool.home) / PENDING / "mine.json").write_text('{"cmd": ["true"]}')
    view.note(PENDING, "mine.json")
    assert view.intake_due(now + 1)
    assert view.intake_due(now + FULL_LOOK_SECONDS), "a full look is due: it may find some"


def test_worker_follows_a_job_edited_while_held(gq: Env) -> None:
    """A real worker with its observer: a queued job is held, made to wait for another job, and
    released while the only slot is busy. It must wait for that job, then run: the worker read
    the released file, not what it had seen of it before."""
    gq.start_worker("--watch")
    gq.script("block.py", WAIT_FOR_GO)
    blocker = gq.add("block.py")
    gq.wait_state(blocker, "running")
    waiting = gq.add("--hold", "true")  # the job it will wait for
    job = gq.add("true")
    later = gq.add("true")  # behind `job` in the queue: it starts only if `job` may not
    gq.gpuq("hold", str(job))
    gq.gpuq("edit", str(job), "--set", f"after=[{waiting}]")
    gq.gpuq("release", str(job))
    (gq.work / "go").write_text("")
    gq.wait_state(blocker, "done")
    gq.wait_state(later, "done", timeout=20)
    assert gq.state_of(job) == "pending", "it started although the job it waits for is held"
    gq.gpuq("release", str(waiting))
    gq.wait_state(job, "done", timeout=20)
    wait_for(lambda: gq.state_of(waiting) == "done", 20, what="the released job to run")


def test_the_observer_names_a_file_written_in_place_once(tmp_path: Path) -> None:
    """The observer's filter (run/loop.py) leaves opens, reads and each write() out of the hints:
    a file rewritten in place in pending/ by three writes is named once, when its writer closes it
    (watchdog unfiltered reported a `modified` event per write, besides the opens and reads)."""
    from gpuq.run import loop
    from gpuq.run.launcher import Launcher
    from gpuq.run.worker import Worker

    spool = _spool(tmp_path)
    ref, _job = _add(spool, tmp_path)
    worker = Worker(spool, Launcher(spool), say=lambda _line: None)
    observer = loop._ensure_observer(None, worker, loop.Waker())
    assert observer is not None
    try:
        hints = worker.view._hints  # the observer thread's side of the view
        hints.clear()
        path = Path(spool.layout.state_dir(PENDING)) / ref.name
        for _ in range(3):
            path.read_bytes()
        text = path.read_bytes()
        with open(path, "r+b", buffering=0) as out:  # three writes, then one close
            out.write(text[:10])
            out.write(text[10:20])
            out.write(text[20:])
        _later, _ = _add(spool, tmp_path)  # a new job: its hint comes after every earlier one
        wait_for(lambda: (PENDING, _later.name) in hints, timeout=10)
        assert [h for h in hints if h[1] == ref.name] == [(PENDING, ref.name)]
    finally:
        loop._stop_observer(observer)


def test_a_job_seen_in_two_places_is_looked_up_until_it_settles(tmp_path: Path) -> None:
    """A move writes the new copy before it removes the old one. A look in between sees the job
    in pending/ and held/ and takes the later state (held); the held/ copy then goes without an
    event (held/ is not watched). The view must look it up again, not keep it held until a full
    look a minute later (a watching worker left a released job waiting that long)."""
    spool = _spool(tmp_path)
    ref, job = _add(spool, tmp_path)
    now = time.time()
    view = _watching_view(spool, now)
    held_ref, held = spool.jobs.move(ref, job, HELD, {})
    view.note(PENDING, ref.name)  # the hold
    snap, _invalid = view.look(spool, now + 1)
    assert snap.states[ref.id] == HELD and not view.unsettled
    back_ref, _back = spool.jobs.move(held_ref, held, PENDING, {}, keep_old=True)  # a release, half done
    view.note(PENDING, back_ref.name)
    snap, _invalid = view.look(spool, now + 2)
    assert snap.states[ref.id] == HELD and view.unsettled  # the held copy still there: it counts
    spool.jobs.remove(held_ref)  # the release's second half: no event names it
    snap, _invalid = view.look(spool, now + 3)
    assert view.full_at == now, "no full look: the doubled job alone was looked up"
    assert snap.states[ref.id] == PENDING and [j.id for j in snap.pending] == [ref.id]
    assert not view.unsettled


def test_a_polling_worker_starts_a_job_that_landed_during_its_step(tmp_path: Path, monkeypatch) -> None:
    """Without file events (no watchdog, a network filesystem, an inotify overflow) the worker
    looks every few seconds, and a look that finds the spool unchanged since the last step does
    nothing more. A job queued while a step runs, after its look (here: while the step moves a
    broken file to rejected/, which it does after the look), must count as a change: the
    signature compared is the one taken before the step's look, not after it."""
    from gpuq.run.launcher import Launcher
    from gpuq.run.worker import Worker

    no_gpus = tmp_path / "gpus.json"
    no_gpus.write_text('{"gpus": []}')
    monkeypatch.setenv("GPUQ_FAKE_GPUS", str(no_gpus))  # a machine without GPUs: one slot
    spool = _spool(tmp_path)
    broken = Path(spool.layout.state_dir(PENDING)) / "000050-broken.json"
    broken.write_text("{not json")
    for path in (broken, *(spool.layout.state_dir(d) for d in (PENDING, RUNNING, "locks", "control"))):
        os.utime(path, (time.time() - 60, time.time() - 60))  # the file's writer long done; a quiet spool
    landed: list[JobRef] = []

    def say(line: str) -> None:  # the worker's log, written while its step runs
        if "rejected" in line and not landed:
            landed.append(_add(spool, tmp_path)[0])

    worker = Worker(spool, Launcher(spool), say=say)
    try:
        now = time.time()
        result = worker.step(now, woken=False)
        assert landed and result.started == []
        later = worker.step(now + 1, woken=False)  # the loop's next periodic look, no event
        assert later.started == [landed[0].id]
        wait_for(lambda: spool.jobs.find(landed[0].id, (DONE,)), 20, what="the job to run")
    finally:
        worker.launcher.close()
