"""Which pending jobs start now, and where: GPUs by placement (CPU jobs one at a time in a CPU lane
beside them), or slots on a machine without GPUs. The GPUs are looked at only when a job is ready,
and other parties' leases are read afresh at each look, as leases end without an event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from itertools import chain, islice, takewhile
from typing import AbstractSet, Any, Callable, Iterator, Optional, Sequence

from gpuq.core.job import Job
from gpuq.core.times import parse_iso
from gpuq.core.words import ids_text
from gpuq.engine.schedule import diskguard, hostroom, placement, scheduler, victims
from gpuq.engine.schedule.placement import Blocked, Holding, Leased, Placement, Request
from gpuq.engine.schedule.turns import Turns
from gpuq.spool import Spool
from gpuq.system import gpus as gpu_info
from gpuq.system.leases import Lease, LeaseDir, LeaseDirProblem, say_once, spool_ids

GPU_WAIT_RESCAN_SECONDS = 2.0  # nothing announces freed GPU memory: look this often while a job waits
MAX_PLACED = 256  # ready jobs placed per step; behind a waiting GPU job only CPU jobs could start anyway


@dataclass(frozen=True)
class Assignment:
    """`slot`: its CUDA_VISIBLE_DEVICES (None: unset, the whole machine; "": a CPU job beside GPU
    jobs); `gpus`: the GPU indices it holds (None without GPUs)."""

    slot: Optional[str]
    gpus: Optional[tuple[int, ...]] = None
    # its share of each GPU while it starts (None: whole), so that jobs after it pack beside it
    # before it is seen running; not part of where it is
    gpu_mem_mib: Optional[int] = field(default=None, compare=False)

    @classmethod
    def of_job(cls, job: Job) -> Assignment:
        return cls(job.slot, None if job.gpus is None else tuple(job.gpus))

    def text(self) -> str:
        if self.gpus is not None:
            return f" on GPU {self.slot}" if self.gpus else " (CPU job)"
        return f" on GPU {self.slot}" if self.slot is not None else ""


@dataclass
class Plan:
    starts: list[tuple[Job, Assignment]] = field(default_factory=list)
    waits: dict[int, scheduler.Wait] = field(default_factory=dict)  # ready jobs the GPUs hold back
    for_gpus: set[int] = field(default_factory=set)  # those of `waits` that wait for GPUs (not the host's room)
    victims: list[Job] = field(default_factory=list)  # running jobs to preempt for urgent ones
    victims_for: Optional[int] = None  # the urgent job they are preempted for
    look: Optional[gpu_info.GpuLook] = None  # the GPUs, when they were looked at


MAX_SUCCESSORS = 8  # jobs named ahead to a supervisor for its slot (run/successor.py)


class OtherLeases:
    """The live GPU leases of every party but this spool's jobs. A problem with the lease directory is
    said once, and planning goes on without those leases."""

    def __init__(self, spool_home: Any, say: Callable[[str], None]):
        self.home, self.lease_id = str(spool_home), Spool(spool_home).lease_id  # how its jobs' leases name it
        self.say = say
        self._dir: Optional[LeaseDir] = None

    def __call__(self) -> list[Lease]:
        try:
            if self._dir is None:
                self._dir = LeaseDir.open()  # GPUQ_LEASE_DIR, else the machine's default
            found = self._dir.live()
        except LeaseDirProblem as exc:
            say_once(str(exc), self.say)
            self._dir = None  # opened (and checked) again at the next look
            return []
        for problem in self._dir.problems:
            say_once(problem, self.say)
        mine = spool_ids(self.home, self.lease_id.read())  # read again: its first job's lease makes it
        return [lease for lease in found if lease.spool not in mine]


class Planner:
    def __init__(
        self,
        labels: Optional[list[str]] = None,
        foreign_threshold_mib: int = placement.DEFAULT_FOREIGN_THRESHOLD_MIB,
        look: Callable[[], gpu_info.GpuLook] = gpu_info.look,
        leases: Optional[Callable[[], list[Lease]]] = None,
        host: Optional[hostroom.Cap] = None,
        turns: Optional[Turns] = None,
    ):
        self.labels = labels  # `gpuq run --gpus` (None: every GPU found)
        try:
            self.allowed = None if labels is None else {int(label) for label in labels}
        except ValueError:
            self.allowed = set()  # labels that are not GPU indices: nothing here matches them
        self.threshold = foreign_threshold_mib
        self.look = look
        self.leases = leases  # other parties' live leases (OtherLeases; None: none are counted)
        self.host = host  # what jobs may reserve of the machine (None: the machine's, read when first needed)
        self.turns = turns  # fair share with the machine's other users (None: their tickets are not read)
        self._trees: dict[int, set[int]] = {}  # a running job's (or lease holder's) pid -> its process tree, this step
        self._leased: list[Leased] = []  # the other parties' leases at this step's look

    def plan(
        self,
        snap: scheduler.QueueState,
        busy: dict[int, Assignment],
        preempting: AbstractSet[int] = frozenset(),
        kept_for: Optional[tuple[int, frozenset[int]]] = None,
    ) -> Plan:
        """What to start now. `busy`: jobs being started or preempted, which hold their place though
        not in running/; `preempting`: never chosen again; `kept_for`: an urgent job and the GPUs its
        preemptions under way empty, which no other job takes meanwhile."""
        if self.turns is None:
            return self._plan(snap, busy, preempting, kept_for)
        self.turns.turn_waits, self.turns.capped = set(), set()
        plan = self._plan(snap, busy, preempting, kept_for)
        gpus = [(g.index, g.uuid) for g in plan.look.gpus] if plan.look is not None else []
        starting = {*busy, *(job.id for job, _where in plan.starts)}  # a ticket is kept until the lease is taken
        self.turns.upkeep(snap.pending, plan.waits, plan.for_gpus, starting, gpus, self.allowed, self._leased)
        return plan

    def _plan(
        self,
        snap: scheduler.QueueState,
        busy: dict[int, Assignment],
        preempting: AbstractSet[int],
        kept_for: Optional[tuple[int, frozenset[int]]] = None,
    ) -> Plan:
        self._trees, self._leased = {}, []
        starting = [job for job in snap.pending if job.id in busy]
        if starting:  # handed to their supervisors, not yet in running/: they no longer wait
            snap = _queue_without(snap, {job.id for job in starting})
        found = _ready(snap)
        first = next(found, None)
        if first is None:
            return Plan()
        look = self.look()
        mode = placement.mode_of(look)
        if mode == placement.CPU_ONLY:  # only as many ready jobs as there are free slots are looked for
            return self._plan_slots(snap, busy, chain((first,), found), preempting, look, starting)
        if mode == placement.GPUS and self.leases is not None:
            listed = any(g.processes for g in look.gpus)  # a holder's tree only says whose a listed process is
            leases = self.leases()
            self._leased = [Leased(lease, frozenset(self._tree(lease.pid) if listed else ())) for lease in leases]
        ready = [first, *islice(found, MAX_PLACED - 1)]
        return self._plan_gpus(snap, busy, ready, preempting, look, mode, starting, kept_for)

    def successors(
        self,
        snap: scheduler.QueueState,
        ending: Job,
        busy: dict[int, Assignment],
        preempting: AbstractSet[int],
        look: Optional[gpu_info.GpuLook],
    ) -> list[Job]:
        """The jobs this planner would start one after another in `ending`'s slot were `ending` to end
        now (spool_layout.md section 6); empty whenever what comes next cannot be known ahead. With
        GPUs only the next job, and only if it would get `ending`'s GPUs. `look`: this step's."""
        if look is None:
            return []
        mode = placement.mode_of(look)
        if mode not in (placement.CPU_ONLY, placement.GPUS) or (mode == placement.GPUS and not ending.gpus):
            return []
        waited = {dep for job in snap.pending for dep in (*job.after, *job.after_any)}
        if ending.id in waited:
            return []
        busy = {job_id: where for job_id, where in busy.items() if job_id != ending.id}
        rest = _queue_without(snap, {*busy, ending.id}, frozenset({ending.id}))
        ready = list(islice(_ready(rest), MAX_SUCCESSORS if mode == placement.CPU_ONLY else 1))
        # a job that reserves host memory or CPUs, or needs disk space, is admitted by the worker, which
        # sees what runs and what is free then
        ready = list(takewhile(lambda job: not hostroom.asks(job) and not diskguard.guarded(job), ready))
        if not ready:
            return []
        if mode == placement.GPUS:  # one at a time: the next job may ask for other GPUs than this one
            now = scheduler.QueueState(snap.states, rest.pending, snap.running, snap.now)
            if self._plan_gpus(now, busy, ready, preempting, look, mode).starts:
                return []  # it can start now on other GPUs: the worker starts it there
            gone = self._tree(ending.pid) if ending.pid else set()
            ended = look._replace(gpus=tuple(_without(gpu, gone) for gpu in look.gpus))
            plan = self._plan_gpus(rest, busy, ready, preempting, ended, mode)
        else:
            plan = self._plan_slots(rest, busy, iter(ready), preempting, look)
        if plan.victims or [where for _job, where in plan.starts] != [Assignment.of_job(ending)]:
            return []  # preempting, or another slot free too
        # up to the first that a pending job waits for: what comes after it is not known ahead
        cut = next((i + 1 for i, job in enumerate(ready) if job.id in waited), len(ready))
        return ready[:cut]

    def _plan_slots(
        self,
        snap: scheduler.QueueState,
        busy: dict[int, Assignment],
        ready: Iterator[Job],
        preempting: AbstractSet[int],
        look: gpu_info.GpuLook,
        starting: Sequence[Job] = (),
    ) -> Plan:
        slots: list[Optional[str]] = list(self.labels) if self.labels else [None]
        taken = scheduler.occupied_slots(snap.running, slots) | {a.slot for a in busy.values()}
        if None in taken:
            taken = set(slots)
        free = [slot for slot in slots if slot not in taken]
        plan = Plan(look=look)
        plan.victims, unserved = scheduler.preemption_victims(
            snap, free, slots, set(preempting), victims.how_it_continues
        )
        for job in unserved:  # they wait for a slot like any other job, first in line
            plan.waits[job.id] = scheduler.Wait(f"urgent, but {victims.no_victim(job, snap.running)}", False)
        for job in islice(self._room(snap, starting).admitted(ready, plan.waits), len(free)):
            plan.starts.append((job, Assignment(free[len(plan.starts)])))
        if len(plan.starts) == len(free):  # every slot taken: the rest wait for the jobs in them to end
            # every running job of the queue: another worker's slots serve the waiting jobs as well
            holders = [j.id for j in snap.running]
            holders += [*busy, *(job.id for job, _where in plan.starts)]
            jobs = "job" if len(set(holders)) == 1 else "jobs"
            wait = scheduler.Wait(f"waiting for a free slot ({jobs} {ids_text(holders)} running)", False, heard=True)
            plan.waits.update((job.id, wait) for job in islice(ready, MAX_PLACED) if job.id not in plan.waits)
        return plan

    def _plan_gpus(
        self,
        snap: scheduler.QueueState,
        busy: dict[int, Assignment],
        ready: list[Job],
        preempting: AbstractSet[int],
        look: gpu_info.GpuLook,
        mode: str,
        starting: Sequence[Job] = (),
        kept_for: Optional[tuple[int, frozenset[int]]] = None,
    ) -> Plan:
        plan = Plan(look=look)
        # before placement: a job the machine has no room for leaves its GPUs to the jobs behind it
        ready = list(self._room(snap, starting).admitted(ready, plan.waits))
        holdings, own_pids, cpu_lane = self._holdings(snap.running, busy)
        gate = None
        if self.turns is not None and mode == placement.GPUS:  # the machine policy's cap on this user's GPUs
            uuid_of = {gpu.index: gpu.uuid for gpu in look.gpus}
            held = frozenset(uuid_of.get(index, str(index)) for h in holdings for index in h.gpus)
            gate = self.turns.cap_gate(held, self._leased, uuid_of)
        if mode == placement.UNREADABLE:
            blocked = placement.unreadable(look)
            decisions = {j.id: blocked if request_of(j).gpus else Placement(()) for j in ready}
        else:
            requests = [(j.id, request_of(j)) for j in ready]
            decisions = placement.place_in_order(
                requests, look.gpus, self.allowed, holdings, own_pids, self.threshold, gpu_info.describe_pid,
                leased=self._leased, kept_for=kept_for, gate=gate,
            )  # fmt: skip
        for job in ready:
            decision = decisions[job.id]
            if isinstance(decision, Blocked):
                plan.waits[job.id] = scheduler.Wait(decision.reason, decision.forever)
                plan.for_gpus.add(job.id)
            elif not decision.gpus and cpu_lane is not None:
                plan.waits[job.id] = scheduler.Wait(f"waiting for the CPU lane (job #{cpu_lane})", False)
            else:
                share = request_of(job).gpu_mem_mib
                plan.starts.append((job, Assignment(",".join(map(str, decision.gpus)), decision.gpus, share)))
                if not decision.gpus:
                    cpu_lane = job.id
        if self.turns is not None and mode == placement.GPUS:  # other users' turns
            seen = [(g.index, g.uuid) for g in look.gpus]
            plan.starts = self.turns.hold_back(plan.starts, plan.waits, seen)
        if mode == placement.GPUS:
            served = kept_for[0] if kept_for is not None else None  # its preemptions were made: no more
            asking = [job for job in ready if job.id != served]
            self._victims(snap, asking, plan, holdings, own_pids, preempting, look)
        return plan

    def _room(self, snap: scheduler.QueueState, starting: Sequence[Job]) -> hostroom.Room:
        """The host memory and CPUs left: the cap less what running and starting jobs reserved."""
        running = {job.id for job in snap.running}
        holders = [*snap.running, *(job for job in starting if job.id not in running)]
        return hostroom.Room(self.host_cap, lambda: holders)

    def host_cap(self) -> hostroom.Cap:
        """What jobs may reserve of the machine (an out-of-memory retry's --mem grows up to it)."""
        if self.host is None:
            self.host = hostroom.cap(None, None)
        return self.host

    def _tree(self, pid: int) -> set[int]:
        if pid not in self._trees:
            self._trees[pid] = gpu_info.tree_pids([pid])
        return self._trees[pid]

    def _holdings(
        self, running: list[Job], busy: dict[int, Assignment]
    ) -> tuple[list[Holding], frozenset[int], Optional[int]]:
        """gpuq's jobs on the GPUs (running, starting or preempted), every pid of gpuq's jobs, and the
        job in the CPU lane."""
        holdings, pids, cpu_lane = [], set(), None
        running_ids = {j.id for j in running}
        for job in running:
            tree = self._tree(job.pid) if job.pid else set()
            pids |= tree
            held = job.gpus
            if held:
                since = parse_iso(job.started_at) or 0.0  # the reservation of the first in line weighs it
                holdings.append(Holding(job.id, tuple(held), job.gpu_mem_mib, frozenset(tree), since))
            elif held == [] and not job.adopted:
                cpu_lane = job.id
        for job_id, where in busy.items():
            if job_id in running_ids:
                continue
            if where.gpus:
                # its share while it starts (a preempted victim's leftovers: whole, until they are gone)
                holdings.append(Holding(job_id, where.gpus, where.gpu_mem_mib))
            elif where.gpus == ():
                cpu_lane = job_id
        return holdings, frozenset(pids), cpu_lane

    def _victims(
        self,
        snap: scheduler.QueueState,
        ready: list[Job],
        plan: Plan,
        holdings: list[Holding],
        own_pids: frozenset[int],
        preempting: AbstractSet[int],
        look: gpu_info.GpuLook,
    ) -> None:
        """As few running jobs to preempt as let an urgent job the GPUs hold back start: the first in
        line that some preemption serves (an `--urgent=force` one behind an `--urgent` one that none
        can serve), one urgent job at a time."""
        if preempting:
            return
        whole = max((gpu.memory_total_mib for gpu in look.gpus), default=victims.WHOLE_GPU_MIB)
        allowed = self.allowed

        def fits_without(urgent: Job, chosen: list[Job]) -> bool:
            ids = {victim.id for victim in chosen}
            theirs = {p for h in holdings if h.job_id in ids for p in h.pids}
            left = [h for h in holdings if h.job_id not in ids]
            gpus = [_without(gpu, theirs) for gpu in look.gpus]
            decision = placement.place(
                request_of(urgent), gpus, allowed, left, own_pids - theirs, self.threshold, leased=self._leased
            )
            return isinstance(decision, Placement)

        for urgent in ready:
            if not scheduler.may_preempt(urgent) or urgent.id not in plan.waits or plan.waits[urgent.id].forever:
                continue
            candidates = victims.candidates(urgent, snap.running)
            candidates = [j for j in candidates if allowed is None or set(j.gpus or ()) <= allowed]
            allowed_victims = victims.in_preference(candidates, urgent, whole)
            # as few as let it be placed, the first ones preferred; none where none would (someone else's memory)
            fits = partial(fits_without, urgent)
            chosen = victims.fewest(allowed_victims, fits)
            if chosen:
                plan.victims, plan.victims_for = chosen, urgent.id
                return
            if len(allowed_victims) < len(candidates) and victims.fewest(candidates, fits):
                wait = plan.waits[urgent.id]
                plan.waits[urgent.id] = scheduler.Wait(f"{wait.reason}; urgent, but {victims.NO_VICTIM}", False)


def _queue_without(
    snap: scheduler.QueueState, pending: set[int], running: frozenset[int] = frozenset()
) -> scheduler.QueueState:
    rest = scheduler.QueueState(
        snap.states,
        [job for job in snap.pending if job.id not in pending],
        [job for job in snap.running if job.id not in running],
        snap.now,
    )
    rest.ordered = snap.ordered
    return rest


def _ready(snap: scheduler.QueueState) -> Iterator[Job]:
    for job in snap.pending if snap.ordered else scheduler.queue_order(snap.pending):
        if scheduler.waiting_reason(job, snap.states, now=snap.now) is None:
            yield job


def _without(gpu: gpu_info.Gpu, pids: set[int]) -> gpu_info.Gpu:
    leaving = [p for p in gpu.processes if p.pid in pids]
    if not leaving:
        return gpu
    freed = sum(p.used_memory_mib or 0 for p in leaving)
    kept = tuple(p for p in gpu.processes if p.pid not in pids)
    return gpu._replace(memory_used_mib=max(0, gpu.memory_used_mib - freed), processes=kept)


def request_of(job: Job) -> Request:
    mem = job.gpu_mem_mib if job.gpu_request != 0 else None
    return Request(job.gpu_request, mem, largest=job.gpu_largest and mem is None)
