"""The worker's scheduling step: a plain function of `now` that tests call one step at a time; the
event loop around it is run/loop.py, and the launcher it is given starts supervisors (tests give a fake).
"""

from __future__ import annotations

import os
import time
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional, Protocol

from gpuq.core import schema
from gpuq.core.job import Job
from gpuq.core.states import DONE, FAILED, INTERRUPTED, PENDING, PREEMPTED, RUNNING
from gpuq.core.words import plural
from gpuq.engine.lifecycle import actions, intake, repairs
from gpuq.engine.lifecycle.preempt import UrgentPreemptions, resume_auto
from gpuq.engine.schedule import diskguard, gpuview, hostroom, placement, scheduler, victims
from gpuq.engine.schedule.planner import Assignment, OtherLeases, Plan, Planner
from gpuq.engine.schedule.queue_read import read_queue
from gpuq.engine.schedule.queue_view import QueueView
from gpuq.engine.schedule.turns import Turns
from gpuq.engine.tracking import eta
from gpuq.run import successor
from gpuq.run.cluster_watch import ClusterWatch
from gpuq.run.supervisor import hostlimits
from gpuq.run.supervisor.order import StartOrder
from gpuq.spool import Claim, JobRef, Spool
from gpuq.spool.files import MIN_FREE_TO_START, free_bytes
from gpuq.system.gpus import GpuLook

RESCAN_SECONDS = 5.0  # a full repair (duplicates, stale claims, tmp files) at most this often
FULL_STEP_SECONDS = 60.0  # a quiet worker still takes a full look this often
SAMPLE_SECONDS = 30.0  # progress samples of running jobs, for their ETA
INTAKE_BUDGET_SECONDS = 0.25  # per step; a burst of dropped files is taken in over several steps
STARTED, CLAIM_HELD, LAUNCH_FAILED = "started", "claim held", "launch failed"  # what became of a launch
HANDED_ON_STATES = (RUNNING, DONE, FAILED, PREEMPTED, INTERRUPTED)  # a job named for a slot that was started


class Line(Protocol):  # the worker's end of a supervisor's socket (run/launcher.Supervisor)
    @property
    def listening(self) -> bool: ...  # open: the supervisor may be told what follows in its slot

    def poll(self) -> Optional[int]: ...  # None while it runs

    def tell(self, line: bytes) -> bool: ...  # False: the line is closed now

    @property
    def pid(self) -> int: ...  # the supervisor's, as its jobs' files record it


class Launcher(Protocol):  # run/launcher.Launcher, or a test's fake
    def launch(self, claim: Claim, order: StartOrder) -> Line: ...  # OSError: none reached, the claim is ours

    def tend(self, spare: bool) -> None: ...  # reap exited supervisors; with `spare`, keep one ready

    def close(self) -> None: ...


class Named(NamedTuple):  # a job named to a supervisor, to start in its slot when its job ends
    id: int
    rev: int
    file: str
    name: str


@dataclass
class Launch:  # a supervisor followed while its job is starting, or while the worker has a line to it
    process: Line
    where: Assignment
    starting: bool = True  # its job is still in pending/
    told: list[Named] = field(default_factory=list)  # what it was last told follows in its slot
    name: str = ""  # its job's, said once the job has started


@dataclass
class StepResult:
    started: list[int] = field(default_factory=list)
    busy: bool = False  # a job runs (or is starting) in one of this worker's slots
    startable_later: bool = False  # some pending job may still start without a person acting
    watch_closely: bool = False  # an adopted job runs: its end is only seen by looking
    more_work: bool = False  # dropped or broken files were left for the next step: come back soon
    gpu_wait: bool = False  # a job waits for GPUs that may free up unannounced, or a GPU job may be given back
    turn_wait: bool = False  # a job of ours holds a waiting ticket: another user's GPUs free up unannounced
    # a ready job's claim was held (its supervisor just requeued it), or a job handed to its
    # supervisor is still in pending/: look again soon
    claim_busy: bool = False
    space_wait: bool = False  # jobs wait for disk space: look again soon, as space comes back unannounced
    next_begin: Optional[float] = None  # the earliest --begin time to come: the worker wakes for it
    cluster_wait: bool = False  # a job waits for one handed to Slurm or Ray: their ends are only seen by asking
    files_written: bool = False  # a broken job file in pending/ may still be being written: look again


@dataclass
class Settings:
    """How `gpuq run` was asked to work: a field per option (test_cli_options)."""

    gpus: Optional[list[str]] = None  # --gpus: the GPUs (or, without GPUs, the slots) it uses; None: all
    foreign_threshold_mib: int = placement.DEFAULT_FOREIGN_THRESHOLD_MIB  # --foreign-mem-threshold
    notify: bool = False  # --notify: a desktop notification when any job ends
    notify_urls: list[str] = field(default_factory=list)  # --notify URL (else GPUQ_NOTIFY, the config's)
    on_finish: Optional[str] = None  # --on-finish CMD: run when any job ends
    recover: bool = False  # --recover: interrupted jobs back in the queue when the worker starts
    max_log_bytes: Optional[int] = None  # --max-log-size: the cap of a job's log (a job's own comes first)
    default_time: Optional[float] = None  # --default-time: the time limit of jobs without their own
    kill_grace: Optional[float] = None  # --kill-grace: seconds from SIGTERM to SIGKILL when a job ends
    host_mem_mib: Optional[int] = None  # --mem: host memory jobs may reserve in all (None: the machine's less a margin)
    host_cpus: Optional[int] = None  # --cpus: CPUs jobs may reserve in all (None: those it may run on)


class Worker:
    def __init__(
        self,
        spool: Spool,
        launcher: Launcher,
        settings: Optional[Settings] = None,
        say: Callable[[str], None] = print,
        planner: Optional[Planner] = None,
    ):
        self.spool, self.launcher, self.say = spool, launcher, say
        self.settings = s = settings or Settings()
        if planner is None:
            turns = Turns(str(spool.home), say)
            planner = Planner(s.gpus, s.foreign_threshold_mib, leases=OtherLeases(spool.home, say), turns=turns)
            planner.host = hostroom.cap(s.host_mem_mib, s.host_cpus, say=say)
            for line in hostlimits.ignored_settings():  # the supervisors that read them say nothing
                say(line)
        self.planner = planner
        self.view = QueueView()  # pending/ and running/ kept between steps, read again as events say
        self.urgent = UrgentPreemptions(spool)
        self.supervisors: dict[int, Launch] = {}  # job id -> the supervisor it was handed to
        self.waits: dict[int, scheduler.Wait] = {}  # why ready jobs could not start at the last step
        self.shown: tuple = (None, {})  # without GPUs the GPU view changes only with its problem and waits
        self.said_disk_full = False  # the worker's log says "disk full" once, not at every look
        self.stopping = False
        self.draining = False  # `gpuq stop --drain`: start nothing new, exit once our jobs end
        self.last_repair = self.last_sample = 0.0
        self.quiet: Optional[tuple[object, float, StepResult]] = None  # (signature, time, result)
        self.clusters = ClusterWatch(spool, say)

    def step(self, now: Optional[float] = None, woken: bool = True) -> StepResult:
        """One scheduling step. A periodic look (`woken` False) at an unchanged spool only checks the
        running jobs' processes: a thousand blocked jobs read every few seconds would cost too much."""
        now = time.time() if now is None else now
        if not woken and self._nothing_changed(now):
            return self._quiet_step(now)
        # before the look: a job landing during the step, after the look, then reads as a change
        before, read_at = self.spool.jobs.signature(), time.time()
        result = self._full_step(now)
        self.quiet = None if self.spool.jobs.racy(before, read_at) else (before, now, result)
        return result

    def _nothing_changed(self, now: float) -> bool:
        if self.quiet is None or self.urgent.under_way or any(s.starting for s in self.supervisors.values()):
            return False
        signature, since, result = self.quiet
        if result.gpu_wait or result.space_wait or result.claim_busy or result.files_written:
            return False  # GPU memory, disk space and a claim free up, a writer ends, without pending/ changing
        if result.next_begin is not None and now >= result.next_begin:
            return False  # a --begin time has come
        if now - since >= FULL_STEP_SECONDS or signature != self.spool.jobs.signature():
            return False
        if self.clusters.news.is_set():
            return False  # a sync recorded the end of a job some pending job waits for
        if (result.busy or result.startable_later) and free_bytes(self.spool.home) < MIN_FREE_TO_START:
            return False  # the disk filled up: the jobs named to supervisors are taken back
        return not self.spool.dropbox.dropped()  # a dropped file waiting to be complete needs looks

    def _quiet_step(self, now: float) -> StepResult:
        report = repairs.Report()
        repairs.settle_unsupervised(self.spool, report)
        if report.settled:  # a job ended unseen: look at everything again
            self._say_settled(report)
            self.quiet = None
            return self.step(now)
        self._sample_progress(now, [])
        self.clusters.poke(now)
        assert self.quiet is not None
        return self.quiet[2]

    def _full_step(self, now: float) -> StepResult:
        result = StepResult()
        self._repair(now)
        if self.clusters.take_news():
            self.view.doubt()  # jobs left slurm/ or ray/: only a full look sees where they went
        if self.view.intake_due(now):  # else nothing in pending/ waits to be taken in
            result.more_work = self._take_in_dropped(now)
        snap, invalid = self.view.look(self.spool, now)
        # Jobs preempted for urgent ones back in the queue, first in line, after the look, and the
        # view looks again (else the urgent job's supervisor would be named a job behind them).
        resumed, resume_due = resume_auto(self.spool)
        result.claim_busy = resume_due or self.view.unsettled  # a move under way: look again soon
        for r in resumed:
            self.say(f"job #{r.job.id} back in the queue (first in line): {r.job.note}")
        if resumed:
            self.view.doubt()
            snap, invalid = self.view.look(self.spool, now)
        self._follow_supervisors(snap)
        busy = {job_id: s.where for job_id, s in self.supervisors.items() if s.starting}
        busy.update(self.urgent.holding(snap.states, now))
        # a job of ours with a control request is already being killed or preempted by a person:
        # its place is about to free up, and it must not be turned into an auto-resumed victim
        mine = {j.id for j in snap.running if self._mine(j)}
        preempting = set(self.urgent.under_way) | (mine & set(self.spool.control.ids()))
        idle = self.stopping or self.draining
        if self.planner.turns is not None:
            self.planner.turns.paused = idle  # a worker that starts nothing must not hold a GPU's turn
        # a job file moved in by hand may hold an id the counter has not reached: passed before it runs
        self.spool.ids.seen(max((job.id for job in snap.pending), default=0))
        plan = self.planner.plan(snap, busy, preempting, self.urgent.kept_for())
        self.waits = plan.waits
        result.space_wait = self._disk_full(plan, bool(snap.pending))
        if not idle:
            self._start(plan, now, result)
        busy.update((job_id, s.where) for job_id, s in self.supervisors.items() if s.starting)
        urgent_waits = plan.victims or self.urgent.under_way or self.urgent.kept
        handing_on = not (idle or urgent_waits or resume_due or result.space_wait)
        self._tell_successors(snap, plan.look, busy, preempting, handing_on)
        if plan.look is not None:  # after the starts; without GPUs only when it says something new
            shown, self.shown = self.shown, (plan.look.problem, {i: w.reason for i, w in plan.waits.items()})
            if plan.look.gpus or shown != self.shown:
                self._write_gpu_view(plan.look, snap.running, plan.waits)
        # after starting jobs: a pile of broken files must not delay them
        rejected, left, result.files_written = intake.reject_broken(self.spool, invalid, now, INTAKE_BUDGET_SECONDS)
        for name, outcome in rejected:
            self.say(f"{name}: {outcome}")
        starting = [s for s in self.supervisors.values() if s.starting]
        result.claim_busy = result.claim_busy or bool(starting)  # its start is said once seen: look soon
        result.more_work = result.more_work or left
        result.busy = bool(starting or self.urgent.under_way or any(map(self._mine, snap.running)))
        result.startable_later = result.more_work or scheduler.has_startable_future(snap, plan.waits)
        looks = any(not (w.forever or w.heard) for w in plan.waits.values())
        result.gpu_wait = looks or any(s.where.gpus for s in starting)
        result.turn_wait = self.planner.turns is not None and self.planner.turns.ticket is not None
        result.next_begin = scheduler.next_begin(snap.pending, now)
        result.cluster_wait = self.clusters.look(snap.pending, snap.states, now)
        # Nothing reports an adopted process's exit: look at it more often than usual.
        result.watch_closely = any(job.adopted for job in snap.running)
        if snap.running:
            self._sample_progress(now, snap.running)
        self.launcher.tend(spare=not idle and (result.busy or bool(snap.pending)))  # after the starts
        return result

    def _start(self, plan: Plan, now: float, result: StepResult) -> None:
        for victim in plan.victims:
            self.urgent.begin(victim, now, plan.victims_for)
            how = victims.how_it_continues(victim)
            then = f"it continues {how}" if how else "it will start over (--urgent=force)"
            self.say(f"preempting job #{victim.id} {victim.name} to make room for an urgent job: {then}")
        for job, where in plan.starts:
            outcome = self._launch(job, where)
            if outcome == STARTED:
                result.started.append(job.id)
            result.claim_busy = result.claim_busy or outcome == CLAIM_HELD

    def _repair(self, now: float) -> None:
        full = now - self.last_repair >= RESCAN_SECONDS
        if full:
            self.last_repair = now
        report = repairs.reconcile(self.spool, full=full)
        self._say_settled(report)
        if full:
            self.spool.files.keep_emergency_room()

    def _say_settled(self, report: repairs.Report) -> None:
        for job_id, state, adopted in report.settled:  # an adopted job never had a supervisor
            self.say(
                f"adopted job #{job_id} ended: now {state}"
                if adopted
                else f"job #{job_id} had lost its process and supervisor: now {state}"
            )

    def _take_in_dropped(self, now: float) -> bool:
        with self.spool.dropbox.turn() as mine:
            if not mine:
                return False
            outcomes, more = intake.take_in_some(self.spool, now, budget=INTAKE_BUDGET_SECONDS)
            # files still being written stay for the next step
            self.view.dropped = more or bool(self.spool.dropbox.dropped() or self.spool.dropbox.leftovers())
        for name, outcome in outcomes:
            self.say(f"{name}: {outcome}")
        return more

    def _disk_full(self, plan: Plan, waiting: bool) -> bool:
        """Whether the spool's filesystem is too full to start jobs; the planned starts then wait."""
        free = free_bytes(self.spool.home)
        if free >= MIN_FREE_TO_START:
            if self.said_disk_full:
                self.say("disk space is back: starting jobs again")
                self.said_disk_full = False
            return False
        reason = f"{diskguard.WAITING}: the spool's filesystem has {free // 1024} KiB free"
        for job, _where in plan.starts:
            plan.waits[job.id] = scheduler.Wait(reason, False)
        plan.starts = []
        if waiting and not self.said_disk_full:
            self.say(f"disk full ({free // 1024} KiB free in {self.spool.home}): starting nothing until there is room")
            self.said_disk_full = True
        return waiting

    def recover_interrupted(self) -> None:
        """`gpuq run --recover`: jobs a reboot interrupted back in the queue before the first step."""
        repairs.reconcile(self.spool, full=True)  # after a reboot: running jobs are interrupted now
        recovered, left = actions.recover_at_start(self.spool)
        for job, how in recovered:
            self.say(f"recovered job #{job.id} {job.name}: {how.text()}")
        for job, why in left:
            self.say(f"job #{job.id} {job.name} {why}: left for you (`gpuq recover --jobs {job.id}` runs it again)")

    def publish_gpus(self) -> GpuLook:
        look = self.planner.look()
        self._write_gpu_view(look, read_queue(self.spool, self.view.cache)[0].running, {})
        return look

    def _write_gpu_view(self, look: GpuLook, running: list[Job], waits: dict[int, scheduler.Wait]) -> None:
        # jobs handed to their supervisors (this step's starts among them) are not in running/ yet
        starting = {job_id: s.where.gpus or () for job_id, s in self.supervisors.items() if s.starting}
        shown = gpuview.view(look, running, self.spool.home, starting)
        shown["waiting"] = {str(i): {"reason": w.reason, "forever": w.forever} for i, w in waits.items()}
        shown["worker"] = os.getpid()
        shown["foreign_threshold_mib"] = self.settings.foreign_threshold_mib  # for the queue's ETA in `status`
        turns = self.planner.turns
        shown["max_gpus"] = turns.cap() if turns is not None else None  # the user's cap: the ETA keeps it too
        with suppress(OSError):  # only shown by `gpuq status`: a full disk must not stop the worker
            self.spool.workers.write_gpu_view(shown)

    def _mine(self, job: Job) -> bool:
        labels = self.settings.gpus
        if labels is None or job.slot is None:
            return True
        return job.slot in labels or bool({str(g) for g in job.gpus or []} & set(labels))

    def _follow_supervisors(self, snap: scheduler.QueueState) -> None:
        """A launch stops counting once its job left pending/ (running/ then holds the slot) or its
        supervisor exited; it is followed on while the worker has a line to it. Of the jobs named
        for the slot of a job that left running/, those that have left pending/ were started by its
        supervisor (or cancelled, or taken by another worker): the running one is its job now."""
        for job_id, s in list(self.supervisors.items()):
            state = snap.states.get(job_id)
            if s.starting:
                ended = s.process.poll() is not None
                if state == PENDING and not ended:
                    continue
                if state == PENDING:
                    self.view.doubt()  # its supervisor found it gone, or gave it back: look at everything
                elif self._started_by(s, job_id, snap):  # not before: a supervisor may give it back (its
                    # GPUs leased by another queue meanwhile), and it would be said to start twice
                    self.say(f"starting job #{job_id} {s.name}{s.where.text()}")
                s.starting = False
            if state in (PENDING, RUNNING) and s.process.listening:
                continue
            del self.supervisors[job_id]
            for named in s.told:
                if named.id in self.supervisors or not self._started_by(s, named.id, snap):
                    continue
                self.say(f"starting job #{named.id} {named.name}{s.where.text()} (handed on in its slot)")
                if snap.states.get(named.id) == RUNNING and s.process.poll() is None and s.process.listening:
                    self.supervisors[named.id] = Launch(s.process, s.where, starting=False)

    def _started_by(self, launch: Launch, job_id: int, snap: scheduler.QueueState) -> bool:
        """Whether the supervisor of `launch` started the job (a job named to it may have been taken
        by another worker meanwhile): its file names that supervisor, or, before the supervisor is
        recorded (a job that ended at once has it recorded with its end), that slot."""
        state = snap.states.get(job_id)
        if state not in HANDED_ON_STATES:
            return False
        job = next((j for j in snap.running if j.id == job_id), None)
        ref = self.spool.jobs.find(job_id, (state,)) if job is None else None
        try:
            job = self.spool.jobs.load(ref) if ref is not None else job
        except (FileNotFoundError, schema.InvalidJob):  # gone meanwhile: not known to be ours
            return False
        if job is None:
            return False
        return job.supervisor["pid"] == launch.process.pid if job.supervisor else job.slot == launch.where.slot

    def _tell_successors(
        self,
        snap: scheduler.QueueState,
        look: Optional[GpuLook],
        busy: dict[int, Assignment],
        preempting: set[int],
        allowed: bool,
    ) -> None:
        """Tell each supervisor of ours the jobs we would start in its slot (none unless `allowed`),
        when that changed."""
        for job_id, s in self.supervisors.items():
            if not s.process.listening:
                continue
            following: list[Job] = []
            if allowed and snap.states.get(job_id) in (PENDING, RUNNING):
                pid = next((j.pid for j in snap.running if j.id == job_id), None)
                ending = Job(id=job_id, slot=s.where.slot, gpus=s.where.gpus, pid=pid)
                following = self.planner.successors(snap, ending, busy, preempting, look)
            named = [Named(job.id, job.rev, self.view.pending_name(job.id) or "", job.name) for job in following]
            named = [n for n in named if n.file]
            if named == s.told:
                continue
            if s.process.tell(successor.offer(self._order(job_id, None, s.where), [n[:3] for n in named])):
                s.told = named
            else:
                s.told = []  # the line is closed: this supervisor hands nothing on

    def _launch(self, job: Job, where: Assignment) -> str:
        """STARTED, CLAIM_HELD (someone holds the job, or it changed since the look) or LAUNCH_FAILED."""
        claim = self.spool.claims.claim(job.id)
        name = self.view.pending_name(job.id)
        if claim is None or not self._as_planned(job, name):
            if claim is not None:
                claim.release()
            self.view.doubt()  # its file may not say what the view does: look again soon, at everything
            return CLAIM_HELD
        try:
            process = self.launcher.launch(claim, self._order(job.id, name, where))
        except OSError as exc:
            claim.release()
            self.say(f"job #{job.id}: could not start its supervisor: {exc}")
            return LAUNCH_FAILED
        self.supervisors[job.id] = Launch(process, where, name=job.name)
        return STARTED

    def _as_planned(self, job: Job, name: Optional[str]) -> bool:
        """Whether the job's file, read under its claim, has the `rev` the plan saw: a view a lost event
        left behind starts nothing it has not seen."""
        if name is None:
            return False
        try:
            return self.spool.jobs.load(JobRef(job.id, PENDING, name)).rev == job.rev
        except (FileNotFoundError, schema.InvalidJob):
            return False

    def _order(self, job_id: int, file: Optional[str], where: Assignment) -> StartOrder:
        s = self.settings
        return StartOrder(
            id=job_id, file=file, rev=None, slot=where.slot, gpus=where.gpus, notify=s.notify, on_finish=s.on_finish,
            max_log_bytes=s.max_log_bytes, default_time=s.default_time, kill_grace=s.kill_grace,
            foreign_threshold_mib=s.foreign_threshold_mib, notify_urls=tuple(s.notify_urls),
            host_mem_cap_mib=self.planner.host_cap().mem_mib,
        )  # fmt: skip

    def _sample_progress(self, now: float, running: list[Job]) -> None:
        if now - self.last_sample < SAMPLE_SECONDS:
            return
        self.last_sample = now
        if not running:
            running = [job for _ref, job in self.spool.jobs.load_many(RUNNING)]
        eta.sample_running(self.spool, running, now)  # so a first `gpuq status` has a rate

    def moving(self) -> bool:
        """Whether work may still appear: a job claimed but not running (a retry being moved back),
        one of ours running (started since the step's look), or one startable since. The claims are
        read before the look, so no move falls in between."""
        held = [job_id for job_id in self.spool.claims.ids() if self.spool.claims.held(job_id)]
        snap, _ = read_queue(self.spool, self.view.cache)
        if any(snap.states.get(job_id) != RUNNING for job_id in held):
            return True
        if any(map(self._mine, snap.running)):  # one a supervisor handed on since the step's look
            return True
        return scheduler.has_startable_future(snap, self.waits)

    def why_done(self) -> list[str]:
        snap, _ = read_queue(self.spool, self.view.cache)
        reasons = scheduler.waiting_reasons(snap, self.waits)
        blocked = [(j, reasons[j.id]) for j in snap.pending]
        if not blocked:
            return ["queue empty; worker exits"]
        waits = "waits" if len(blocked) == 1 else "wait"
        head = f"nothing more can start; {plural(len(blocked), 'job')} {waits} for something only you can change:"
        return [head, *(f"  #{job.id} {job.name}: {wait.reason if wait else 'waiting'}" for job, wait in blocked)]

    def still_running(self) -> list[Job]:
        return [j for j in read_queue(self.spool, self.view.cache)[0].running if self._mine(j)]
