"""The worker's event loop: a thin shell around Worker.step().

File events are hints (they name the files the view reads again); the loop also looks every
RESCAN_SECONDS in case one was lost (inotify overflow, a network filesystem, a dead observer).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from contextlib import suppress
from typing import Any, Callable, Optional

from watchdog import events
from watchdog.observers import Observer

from gpuq.core.states import PENDING, RUNNING
from gpuq.core.words import ADOPTED_END
from gpuq.engine.schedule.planner import GPU_WAIT_RESCAN_SECONDS
from gpuq.engine.schedule.turns import TURN_RESCAN_SECONDS
from gpuq.run.cluster_watch import SYNC_SECONDS
from gpuq.run.notify.queue import QueueWatch
from gpuq.run.worker import RESCAN_SECONDS, StepResult, Worker
from gpuq.system.security import FULL_ERRNOS

ADOPTED_RESCAN_SECONDS = 1.0
CLAIM_BUSY_RESCAN_SECONDS = 0.1  # a claim is held for milliseconds; nothing announces its release
# A job reaches any other state by leaving running/ or pending/, so these two directories say
# everything the scheduler needs; events elsewhere would only cost steps.
WATCHED = (PENDING, RUNNING)


class Waker:
    """A pipe, not an Event: setting an Event inside a signal handler can deadlock on its own lock."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)

    def set(self) -> None:
        with suppress(BlockingIOError):  # the pipe is full: a wake-up is already pending
            os.write(self.write_fd, b"x")

    def clear(self) -> None:
        with suppress(BlockingIOError):
            while os.read(self.read_fd, 4096):
                pass

    def wait(self, timeout: float) -> bool:  # False: the timeout passed
        return bool(select.select([self.read_fd], [], [], timeout)[0])


def serve(worker: Worker, watch: bool, on_drain: Optional[Callable[[], None]] = None) -> int:
    """Run until stopped (watch) or until nothing is left to do; the exit code. SIGUSR1 (`gpuq stop
    --drain`): nothing new starts, the loop ends once this worker's jobs have; `on_drain` is told."""
    wake = Waker()
    worker.clusters.wake = wake.set  # a sync that recorded an end: look at once
    observer = None
    interrupted = {"signal": 0}

    def stop(signum: int, _frame: Any) -> None:
        if worker.stopping:  # a second Ctrl-C: leave at once
            raise KeyboardInterrupt
        worker.stopping, interrupted["signal"] = True, signum
        wake.set()

    def drain(_signum: int, _frame: Any) -> None:
        worker.draining = True
        wake.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGUSR1, drain)
    # No wake-up on SIGCHLD: a supervisor's exit follows its job leaving running/, which
    # already woke us; one that died early is noticed by the periodic look.
    woken, held_for = True, 0  # held_for: steps in a row that found a ready job's claim held (or work moving)
    emptied = QueueWatch(worker)  # says when the queue runs empty, to the worker's --notify URLs
    try:
        while not worker.stopping:
            observer = _ensure_observer(observer, worker, wake)
            wake.clear()
            result = _step(worker, woken)
            emptied.after_step(result)
            if result.more_work:
                wake.set()  # come back at once for the rest, after starting what could start
            if worker.draining:
                if on_drain is not None:
                    on_drain()
                    on_drain = None
                if not result.busy:
                    worker.say("drained: every job of this worker has ended; worker exits")
                    break
            settling = not watch and not result.busy and not result.startable_later
            if settling and not worker.moving():
                for line in worker.why_done():
                    worker.say(line)
                break
            # A foreground worker with nothing left but a claim still held (a supervisor recording
            # an end, or putting a job back for a retry) looks again within milliseconds: nothing
            # announces a claim's release, and the user waits for the prompt.
            held_for = held_for + 1 if result.claim_busy or settling else 0
            woken = wake.wait(_next_look(result, held_for, settling))
    except KeyboardInterrupt:
        pass
    finally:
        worker.launcher.close()
        if observer is not None:
            _stop_observer(observer)
    if worker.stopping:
        running = worker.still_running()
        supervised = ", ".join(f"#{j.id} {j.name} (pid {j.pid})" for j in running if not j.adopted)
        said = [f"still running under their supervisors: {supervised}"] if supervised else []
        said += [f"#{j.id} {j.name} (pid {j.pid}, {ADOPTED_END})" for j in running if j.adopted]  # as `gpuq stop`
        left = f"; {'; '.join(said)}. `gpuq kill ID` stops one." if said else ""
        worker.say(f"worker stopped{left}")
        return 130 if interrupted["signal"] == signal.SIGINT else 0
    return 0


def _step(worker: Worker, woken: bool) -> StepResult:
    """One step; a disk too full for the step's own writes is said, and waited out, not fatal."""
    try:
        return worker.step(woken=woken)
    except OSError as exc:
        if exc.errno not in FULL_ERRNOS:
            raise
        if not worker.said_disk_full:
            worker.say(f"disk full ({exc.strerror}): waiting for room")
            worker.said_disk_full = True
        return StepResult(busy=True, startable_later=True, space_wait=True)


def _next_look(result: StepResult, held_for: int = 0, settling: bool = False) -> float:
    """Seconds until the next look without an event (a claim held long, by a person's command, is
    looked at less and less often), and never past the next --begin time."""
    if result.claim_busy or settling:
        wait = min(RESCAN_SECONDS, CLAIM_BUSY_RESCAN_SECONDS * 2 ** max(0, held_for - 1))
    elif result.watch_closely:
        wait = ADOPTED_RESCAN_SECONDS
    else:
        wait = GPU_WAIT_RESCAN_SECONDS if result.gpu_wait or result.space_wait else RESCAN_SECONDS
        if result.turn_wait:  # another user's job ends unannounced, and its GPU is ours for a moment only
            wait = min(wait, TURN_RESCAN_SECONDS)
        if result.cluster_wait:  # the next sync of the hand-overs is due then
            wait = min(wait, SYNC_SECONDS)
    if result.next_begin is not None:
        wait = min(wait, max(0.0, result.next_begin - time.time()))
    return wait


class _Handler(events.FileSystemEventHandler):
    def __init__(self, worker: Worker, wake: Waker):
        self.worker, self.wake = worker, wake

    def on_any_event(self, event: Any) -> None:  # a move names two files
        for path in (event.src_path, getattr(event, "dest_path", "")):
            directory, name = os.path.split(path)
            if path and os.path.basename(directory) in WATCHED:
                self.worker.view.note(os.path.basename(directory), name)
        # What can change what may start: anything arriving in pending/ (a job leaving it starts
        # nothing; `--after-any` on a cancelled job waits for the periodic look), and a job leaving
        # running/ (a pid recorded in place frees nothing).
        parent = os.path.basename(os.path.dirname(event.src_path))
        if event.event_type in ("deleted", "moved") if parent == RUNNING else event.event_type != "deleted":
            self.wake.set()


def _ensure_observer(observer: Any, worker: Worker, wake: Waker) -> Optional[Any]:
    if observer is not None and observer.is_alive():
        return observer
    worker.view.watching(False)  # until a new observer runs, every step is a full look
    # Only the events that can change the queue: on Linux the filter becomes the inotify mask, so
    # the kernel never reports the opens and reads of every job file (the worker's own included).
    # A file edited in place is seen when its writer closes it.
    wanted = [events.FileCreatedEvent, events.FileMovedEvent, events.FileDeletedEvent, events.FileClosedEvent]
    new = Observer()
    for state in WATCHED:
        new.schedule(_Handler(worker, wake), worker.spool.layout.state_dir(state), recursive=False, event_filter=wanted)
    try:
        new.start()
    except OSError as exc:  # e.g. inotify watch limit reached: fall back to rescans
        worker.say(f"file watching unavailable ({exc}); looking every {RESCAN_SECONDS:.0f}s")
        return None
    worker.view.watching(True)  # the watches are in place once start() returns
    wake.set()  # files that arrived before the observer started produce no event
    return new


def _stop_observer(observer: Any) -> None:
    # its inotify thread can log a harmless error when it wakes up to a stop it raced with
    logging.getLogger("watchdog").setLevel(logging.CRITICAL)
    observer.stop()
    observer.join(timeout=5)
