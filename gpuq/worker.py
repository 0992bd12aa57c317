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

from gpuq import eta, intake, preempt, recovery, scheduler
from gpuq.spool import Spool
from gpuq.view import PendingCache, snapshot

RESCAN_SECONDS = 5.0
ADOPTED_RESCAN_SECONDS = 1.0
FULL_STEP_SECONDS = 60.0  # a quiet worker still takes a full look this often
SAMPLE_SECONDS = 30.0  # progress samples of running jobs, for their ETA
INTAKE_BUDGET_SECONDS = 0.25  # per step; a burst of dropped files is taken in over several steps
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)
# The supervisor runs with `python -S` and gets the worker's import path instead: `site` (with
# its .pth files) was the largest single cost between the worker's decision and the job's first
# instruction. argv: N, N path entries, then the supervisor's own arguments.
SUPERVISOR_BOOT = (
    "import sys; n = int(sys.argv[1]); sys.path[:0] = sys.argv[2 : 2 + n]; del sys.argv[1 : 2 + n]; "
    "from gpuq.supervisor import main; sys.exit(main())"
)


def supervisor_path() -> list[str]:
    """This package's parent, then the worker's own import path (blank entries mean "the current
    directory", which the supervisor must not search)."""
    return [PACKAGE_PARENT] + [p for p in sys.path if p and p != PACKAGE_PARENT]


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

    def wait(self, timeout: float) -> bool:
        """True if woken, False if the timeout passed."""
        return bool(select.select([self.read_fd], [], [], timeout)[0])


@dataclass
class Launch:
    job_id: int
    process: subprocess.Popen


@dataclass
class Spare:
    process: subprocess.Popen
    sock: Any  # our end of the socket pair; the spare waits for a job on the other


@dataclass
class StepResult:
    started: list[int] = field(default_factory=list)
    busy: bool = False  # a job runs (or is starting) in one of this worker's slots
    startable_later: bool = False  # some pending job may still start without a person acting
    watch_closely: bool = False  # an adopted job runs: its end is only seen by looking


class Worker:
    def __init__(self, spool: Spool, gpus: Optional[list[str]] = None, say: Callable[[str], None] = print):
        self.spool = spool
        self.slots: list[Optional[str]] = list(gpus) if gpus else [None]
        self.say = say
        self.launching: dict[Optional[str], Launch] = {}
        self.spare: Optional[Spare] = None
        self.supervisors: list[subprocess.Popen] = []  # started by us, job under way
        self.preemptions: dict[int, preempt.Preemption] = {}  # job id -> preempted for an urgent job
        self.cache = PendingCache()
        self.wake = Waker()
        self.stopping = False
        self._last_full_reconcile = 0.0
        self._last_sample = 0.0
        self._quiet_since: Optional[tuple[Any, float, StepResult]] = None  # (signature, time, result)

    # ---- one step -----------------------------------------------------------------------------
    def step(self, now: Optional[float] = None, woken: bool = True) -> StepResult:
        """One scheduling step. A periodic look (`woken` False) at a spool whose pending/,
        running/, locks/ and control/ have not changed only checks the running jobs' processes:
        with a thousand blocked jobs, re-reading the queue every few seconds would cost more CPU
        than an idle worker may."""
        now = time.time() if now is None else now
        if not woken and self._nothing_changed(now):
            return self._quiet_step(now)
        result = self._full_step(now)
        self._quiet_since = (self.spool.signature(), now, result)
        return result

    def _nothing_changed(self, now: float) -> bool:
        if self._quiet_since is None or self.launching or self.preemptions:
            return False
        signature, since, _result = self._quiet_since
        if now - since >= FULL_STEP_SECONDS or signature != self.spool.signature():
            return False
        return not self.spool.dropped_files()  # a dropped file waiting to be complete needs looks

    def _quiet_step(self, now: float) -> StepResult:
        report = recovery.Report()
        recovery.settle_unsupervised(self.spool, report)
        if report.settled:  # a job ended unseen: look at everything again
            self._quiet_since = None
            return self.step(now)
        self._sample_progress(now, [])
        return self._quiet_since[2]

    def _sample_progress(self, now: float, running: list[dict[str, Any]]) -> None:
        if now - self._last_sample < SAMPLE_SECONDS:
            return
        self._last_sample = now
        if not running:
            running = [job for _ref, job in self.spool.load_many("running")]
        eta.sample_running(self.spool, running, now)  # so a first `gpuq status` has a rate

    def _full_step(self, now: float) -> StepResult:
        full = now - self._last_full_reconcile >= RESCAN_SECONDS
        if full:
            self._last_full_reconcile = now
        report = recovery.reconcile(self.spool, full=full)
        for job_id, state in report.settled:
            self.say(f"job #{job_id} had lost its process and supervisor: now {state}")
        with self.spool.intake_turn() as mine:
            outcomes, more = intake.take_in_some(self.spool, now, budget=INTAKE_BUDGET_SECONDS) if mine else ([], False)
        for name, outcome in outcomes:
            self.say(f"{name}: {outcome}")
        if more:
            self.wake.set()  # come back at once for the rest, after starting what can start
        for resumed in preempt.resume_auto(self.spool):
            self.say(f"job #{resumed.job['id']} back in the queue (first in line): {resumed.job.get('note')}")
        snap, invalid = snapshot(self.spool, self.cache)
        self._forget_finished_launches(snap)
        busy = scheduler.occupied_slots(snap.running, self.slots) | set(self.launching) | self._preempting(snap, now)
        free = [slot for slot in self.slots if slot not in busy]
        result = StepResult()
        if not self.stopping:
            self._make_room_for_urgent(snap, free, now)
            for job, slot in scheduler.plan(snap, free):
                if self._launch(job, slot):
                    result.started.append(job["id"])
        self._reject_invalid(invalid, now)  # after starting jobs: a pile of broken files must not delay them
        occupied = scheduler.occupied_slots(snap.running, self.slots)
        result.busy = bool(self.launching or self.preemptions or occupied)
        result.startable_later = more or scheduler.has_startable_future(snap)
        # Nothing reports an adopted process's exit: look at it more often than RESCAN_SECONDS.
        result.watch_closely = any(job.get("adopted") for job in snap.running)
        if snap.running:
            self._sample_progress(now, snap.running)
        if not self.stopping and (result.busy or snap.pending):
            self._keep_a_spare()
        return result

    def _preempting(self, snap: scheduler.Snapshot, now: float) -> set[Optional[str]]:
        """Slots of jobs this worker is preempting whose processes are not all gone yet (SIGKILL
        once their grace is over): nothing else may start there before."""
        for job_id, p in list(self.preemptions.items()):
            if not preempt.enforce(p, snap.states.get(job_id), now):
                del self.preemptions[job_id]
        return {p.slot for p in self.preemptions.values()}

    def _make_room_for_urgent(self, snap: scheduler.Snapshot, free: list[Optional[str]], now: float) -> None:
        # a job of ours with a control request is already being killed or preempted by a person:
        # its slot is about to free up, and it must not be turned into an auto-resumed victim
        mine = {j["id"] for j in snap.running if self.slots == [None] or j.get("slot") in self.slots}
        busy_ids = set(self.preemptions) | (mine & set(self.spool.request_ids()))
        for victim in scheduler.preemption_victims(snap, free, self.slots, busy_ids):
            self.preemptions[victim["id"]] = preempt.begin(self.spool, victim, now)
            self.say(f"preempting job #{victim['id']} {victim['name']} to make room for an urgent job")

    def _reject_invalid(self, invalid: list, now: float) -> None:
        writers = intake.Writers(self.spool.state_dir("pending"))  # one /proc scan for all of them
        stop_at = time.monotonic() + INTAKE_BUDGET_SECONDS
        for ref, reason in invalid:
            if time.monotonic() > stop_at:
                self.wake.set()  # the rest in the next step, after starting what can start
                return
            path = self.spool.state_dir(ref.state) / ref.name
            if ref.state == "pending" and not intake.still_being_written(path, now, writers):
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
                self.supervisors.append(launch.process)
        # reap supervisors that have exited, so none lingers as a zombie
        self.supervisors = [p for p in self.supervisors if p.poll() is None]

    def _launch(self, job: dict[str, Any], slot: Optional[str]) -> bool:
        claim = self.spool.claim(job["id"])
        if claim is None:
            return False  # another worker (or a cancel) got there first
        spare, self.spare = self.spare, None
        process = self._hand_over(spare, job["id"], slot, claim.fd) if spare else None
        if process is None:
            try:
                process = self._start_supervisor(job["id"], slot, claim.fd)
            except OSError as exc:
                claim.release()
                self.say(f"job #{job['id']}: could not start its supervisor: {exc}")
                return False
        claim.detach()  # the supervisor now holds the claim
        self.launching[slot] = Launch(job["id"], process)
        where = f" on GPU {slot}" if slot is not None else ""
        self.say(f"starting job #{job['id']} {job['name']}{where}")
        return True

    def _supervisor_cmd(self, *args: str) -> list[str]:
        path = supervisor_path()
        return [
            sys.executable,
            "-S",
            "-c",
            SUPERVISOR_BOOT,
            str(len(path)),
            *path,
            "--home",
            str(self.spool.home),
            *args,
        ]

    def _start_supervisor(self, job_id: int, slot: Optional[str], lock_fd: int) -> subprocess.Popen:
        args = ["--job", str(job_id), "--lock-fd", str(lock_fd)] + (["--slot", slot] if slot is not None else [])
        log = os.open(self.spool.log_path(job_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            return subprocess.Popen(
                self._supervisor_cmd(*args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(lock_fd,),
                start_new_session=True,
            )
        finally:
            os.close(log)

    def _keep_a_spare(self) -> None:
        """Start a supervisor ahead of time while jobs are queued or running, so the next job does
        not wait for an interpreter to start (most of the gap between two jobs)."""
        if self.spare is not None and self.spare.process.poll() is None:
            return
        import socket

        mine, theirs = socket.socketpair()
        log = os.open(self.spool.worker_log_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            process = subprocess.Popen(
                self._supervisor_cmd("--spare-fd", str(theirs.fileno())),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        except OSError:
            mine.close()
            return  # jobs then start the slower way
        finally:
            theirs.close()
            os.close(log)
        self.spare = Spare(process, mine)

    @staticmethod
    def _hand_over(spare: Spare, job_id: int, slot: Optional[str], lock_fd: int) -> Optional[subprocess.Popen]:
        """Give a job and its claim to the spare supervisor; None if the spare is gone."""
        import json
        import socket

        try:
            if spare.process.poll() is not None:
                return None
            socket.send_fds(spare.sock, [json.dumps({"id": job_id, "slot": slot}).encode()], [lock_fd])
            return spare.process
        except OSError:
            return None
        finally:
            spare.sock.close()

    def close_spare(self) -> None:
        """The spare exits when its socket closes (also when the worker dies)."""
        if self.spare is not None:
            self.spare.sock.close()
            self.spare = None

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
        # No wake-up on SIGCHLD: a supervisor's exit follows its job leaving running/, which
        # already woke us; one that died early is noticed by the periodic look.
        woken = True
        try:
            while not self.stopping:
                observer = self._ensure_observer(observer)
                self.wake.clear()
                result = self.step(woken=woken)
                if not watch and not result.busy and not result.startable_later:
                    self._say_why_done()
                    break
                woken = self.wake.wait(ADOPTED_RESCAN_SECONDS if result.watch_closely else RESCAN_SECONDS)
        except KeyboardInterrupt:
            pass
        finally:
            self.close_spare()
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
                if _worth_a_step(event):
                    wake.set()

        new = Observer()
        for state in WATCHED:
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
        reasons = scheduler.waiting_reasons(snap)
        blocked = [(j, reasons[j["id"]]) for j in snap.pending]
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


# A job reaches any other state by leaving running/ or pending/, so these two directories say
# everything the scheduler needs; events elsewhere would only cost steps.
WATCHED = ("pending", "running")
_IGNORED_EVENTS = ("modified", "opened", "closed_no_write")


def _worth_a_step(event: Any) -> bool:
    """Events that can change what may start: anything arriving in pending/ (a hand-written file
    counts once it is closed), and a job leaving running/. A file rewritten in place inside
    running/ (the supervisor recording a pid) frees nothing."""
    if event.is_directory or event.event_type in _IGNORED_EVENTS:
        return False
    parent = os.path.basename(os.path.dirname(event.src_path))
    if parent == "running":
        return event.event_type in ("deleted", "moved")
    # In pending/, a job leaving (a supervisor taking it, a cancel) starts nothing; the rare
    # case where it matters (`--after-any` on a cancelled job) waits for the periodic look.
    return event.event_type != "deleted"
