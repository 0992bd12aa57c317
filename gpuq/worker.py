"""The worker: starts pending jobs in free slots. `Worker.step()` is one scheduling step (a plain
call tests can make); `Worker.serve()` is the thin event loop around it.

Events from watchdog only say "look again soon": the truth is always a fresh look at the spool,
and the loop also looks every RESCAN_SECONDS in case an event was lost (inotify overflow, a
network filesystem, a dead observer thread).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from gpuq import intake, jobs, recovery, scheduler
from gpuq.spool import STATES, Spool
from gpuq.view import PendingCache, snapshot

RESCAN_SECONDS = 5.0
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)
SUPERVISOR_BOOT = "import sys; sys.path.insert(0, sys.argv.pop(1)); from gpuq.supervisor import main; sys.exit(main())"


class Waker:
    """Wakes the loop from a signal handler or the observer thread. A pipe, not an Event:
    setting an Event inside a signal handler can deadlock on the Event's own lock."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)

    def set(self) -> None:
        try:
            os.write(self.write_fd, b"x")
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is already pending

    def clear(self) -> None:
        try:
            while os.read(self.read_fd, 4096):
                pass
        except BlockingIOError:
            pass

    def wait(self, timeout: float) -> None:
        select.select([self.read_fd], [], [], timeout)


@dataclass
class Launch:
    job_id: int
    process: subprocess.Popen


@dataclass
class StepResult:
    started: list[int] = field(default_factory=list)
    busy: bool = False  # a job runs (or is starting) in one of this worker's slots
    startable_later: bool = False  # some pending job may still start without a person acting


class Worker:
    def __init__(self, spool: Spool, gpus: Optional[list[str]] = None, say: Callable[[str], None] = print):
        self.spool = spool
        self.slots: list[Optional[str]] = list(gpus) if gpus else [None]
        self.say = say
        self.launching: dict[Optional[str], Launch] = {}
        self.cache = PendingCache()
        self.wake = Waker()
        self.stopping = False
        self._last_full_reconcile = 0.0

    # ---- one step -----------------------------------------------------------------------------
    def step(self, now: Optional[float] = None) -> StepResult:
        now = time.time() if now is None else now
        full = now - self._last_full_reconcile >= RESCAN_SECONDS
        if full:
            self._last_full_reconcile = now
        report = recovery.reconcile(self.spool, full=full)
        for job_id, state in report.settled:
            self.say(f"job #{job_id} had lost its process and supervisor: now {state}")
        for name, outcome in intake.take_in_all(self.spool, now):
            self.say(f"{name}: {outcome}")
        snap, invalid = snapshot(self.spool, self.cache)
        self._reject_invalid(invalid, now)
        self._forget_finished_launches(snap)
        busy = scheduler.occupied_slots(snap.running, self.slots) | set(self.launching)
        free = [slot for slot in self.slots if slot not in busy]
        result = StepResult()
        if not self.stopping:
            for job, slot in scheduler.plan(snap, free):
                if self._launch(job, slot):
                    result.started.append(job["id"])
        result.busy = bool(self.launching) or bool(scheduler.occupied_slots(snap.running, self.slots))
        result.startable_later = scheduler.has_startable_future(snap)
        return result

    def _reject_invalid(self, invalid: list, now: float) -> None:
        for ref, reason in invalid:
            path = self.spool.state_dir(ref.state) / ref.name
            if ref.state == "pending" and not intake.still_being_written(path, now):
                try:
                    self.spool.reject(ref.name, reason)
                    self.say(f"{ref.name}: rejected: {reason}")
                except FileNotFoundError:
                    pass

    def _forget_finished_launches(self, snap: scheduler.Snapshot) -> None:
        """A launch stops counting once its job left pending/ (running/ then holds the slot) or
        its supervisor exited."""
        for slot, launch in list(self.launching.items()):
            if launch.process.poll() is not None or snap.states.get(launch.job_id) != "pending":
                del self.launching[slot]

    def _launch(self, job: dict[str, Any], slot: Optional[str]) -> bool:
        claim = self.spool.claim(job["id"])
        if claim is None:
            return False  # another worker (or a cancel) got there first
        try:
            log = os.open(self.spool.log_path(job["id"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            cmd = [
                sys.executable,
                "-c",
                SUPERVISOR_BOOT,
                PACKAGE_PARENT,
                "--home",
                str(self.spool.home),
                "--job",
                str(job["id"]),
                "--lock-fd",
                str(claim.fd),
            ]
            if slot is not None:
                cmd += ["--slot", slot]
            process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(claim.fd,), start_new_session=True
            )
            os.close(log)
        except OSError as exc:
            claim.release()
            self.say(f"job #{job['id']}: could not start its supervisor: {exc}")
            return False
        claim.detach()  # the supervisor now holds the claim
        self.launching[slot] = Launch(job["id"], process)
        where = f" on GPU {slot}" if slot is not None else ""
        self.say(f"starting job #{job['id']} {job['name']}{where}")
        return True

    def reap(self) -> None:
        for launch in self.launching.values():
            launch.process.poll()

    # ---- the loop -----------------------------------------------------------------------------
    def serve(self, watch: bool) -> int:
        """Run until stopped (watch) or until nothing is left to do. Returns an exit code."""
        observer = None
        interrupted = {"signal": 0}

        def stop(signum: int, _frame: Any) -> None:
            if self.stopping:  # a second Ctrl-C: leave at once
                raise KeyboardInterrupt
            self.stopping, interrupted["signal"] = True, signum
            self.wake.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGCHLD, lambda *_: self.wake.set())
        try:
            while not self.stopping:
                observer = self._ensure_observer(observer)
                self.wake.clear()
                result = self.step()
                if not watch and not result.busy and not result.startable_later:
                    self._say_why_done()
                    break
                self.wake.wait(RESCAN_SECONDS)
        except KeyboardInterrupt:
            pass
        finally:
            if observer is not None:
                observer.stop()
        if self.stopping:
            self._say_left_running()
            return 130 if interrupted["signal"] == signal.SIGINT else 0
        return 0

    def _ensure_observer(self, observer: Any) -> Any:
        """(Re)start the watchdog observer; a dead one (an exception in its thread) is replaced."""
        if observer is not None and observer.is_alive():
            return observer
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            return None  # polling every RESCAN_SECONDS still works
        wake = self.wake

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                wake.set()

        new = Observer()
        for state in STATES:
            new.schedule(Handler(), str(self.spool.state_dir(state)), recursive=False)
        try:
            new.start()
        except OSError as exc:  # e.g. inotify watch limit reached: fall back to rescans
            self.say(f"file watching unavailable ({exc}); looking every {RESCAN_SECONDS:.0f}s")
            return None
        self.wake.set()  # files that arrived before the observer started produce no event
        return new

    def _say_why_done(self) -> None:
        snap, _ = snapshot(self.spool, self.cache)
        blocked = [(j, scheduler.waiting_reason(j, snap.states)) for j in snap.pending]
        if blocked:
            self.say(f"nothing more can start; {len(blocked)} job(s) wait for something only you can change:")
            for job, wait in blocked:
                self.say(f"  #{job['id']} {job['name']}: {wait.reason if wait else 'waiting'}")
        else:
            self.say("queue empty; worker exits")

    def _say_left_running(self) -> None:
        running = [
            j
            for j in snapshot(self.spool, self.cache)[0].running
            if j.get("slot") in self.slots or self.slots == [None]
        ]
        if running:
            names = ", ".join(f"#{j['id']} {j['name']} (pid {j.get('pid')})" for j in running)
            self.say(f"worker stopped; still running under their supervisors: {names}. `gpuq kill ID` stops one.")
        else:
            self.say("worker stopped")


def describe_started(job: dict[str, Any]) -> str:
    return f"#{job['id']} {job['name']} {jobs.display_script(job['cmd'])}"
