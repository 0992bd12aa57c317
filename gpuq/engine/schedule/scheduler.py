"""Scheduling decisions as plain functions over a snapshot of the spool (no files, no processes):
which jobs wait for what, in which order the ready ones go, which slots are taken.
"""

# Real annotations, no future import: see test_the_everyday_commands_compile_no_source.
import time
from typing import Any, Callable, NamedTuple, Optional

from gpuq.core import states
from gpuq.core.job import Job
from gpuq.core.states import FINISHED, NEEDS_USER, URGENT_FORCE
from gpuq.core.times import parse_iso


class Wait(NamedTuple):
    """Why a pending job waits; `forever`: it cannot start unless a person acts; `heard`: for a
    running job's end, which the worker hears of (no look for free room is needed)."""

    reason: str
    forever: bool
    heard: bool = False


# How a reason that waits for good is shown (`gpuq status`, `show`, `triage`).
BLOCKED = "blocked: "

# Why a pending job does not start while every worker drains (`gpuq status`, `show`, `eta`, `add`).
DRAINING = "the worker is draining (`gpuq stop --drain`): it starts nothing new; `gpuq run --daemon` once it has exited"

# How placement starts the reason of a GPU job that waits behind the first in line (it fits only on
# the GPUs kept for that job): `gpuq status` adds what that job needs.
BEHIND = "waiting behind job #"


class QueueState:
    """The pending and running jobs of one look (not a dataclass: `status` does not import it)."""

    def __init__(
        self,
        states: dict[int, str],  # id -> state of every job in the tree
        pending: Optional[list[Job]] = None,
        running: Optional[list[Job]] = None,
        now: Optional[float] = None,  # when it was taken (for --begin times); None: times are not looked at
    ) -> None:
        self.states = states
        self.pending = [] if pending is None else pending
        self.running = [] if running is None else running
        self.now = now
        self.ordered = False  # True: `pending` is already in queue_order (engine/schedule/queue_view.py keeps it so)


def _dependency_wait(
    job_id: int, dep: int, state: Optional[str], any_result: bool, stuck: frozenset = frozenset()
) -> Optional[Wait]:
    if state == states.DONE or (any_result and state in FINISHED):
        return None
    wait = _unmet(job_id, dep, state, stuck)
    # --after-any is said apart from --after, which starts only after a success
    return Wait("after-any" + wait.reason[len("after") :], wait.forever) if any_result else wait


def _unmet(job_id: int, dep: int, state: Optional[str], stuck: frozenset) -> Wait:
    if dep in stuck:
        return Wait(f"after #{dep} (blocked itself)", True)
    if state is None:
        return Wait(f"after #{dep}: no such job", True)
    if state in (states.FAILED, states.CANCELLED):
        return Wait(f"after #{dep} ({state}): will not start; `gpuq retry {dep}` or `gpuq cancel {job_id}`", True)
    if state == states.PREEMPTED:  # same id after resume: this job then waits for the continuation
        return Wait(f"after #{dep} (preempted): runs after `gpuq resume {dep}` completes it", True)
    if state == states.HELD:
        return Wait(f"after #{dep} (held): runs after `gpuq release {dep}`", True)
    if state in NEEDS_USER:
        return Wait(f"after #{dep} ({state}): `gpuq recover --jobs {dep}` or `gpuq resume {dep}`", True)
    where = {states.RUNNING: " (running)", states.SLURM: " (on Slurm)"}.get(state, "")
    return Wait(f"after #{dep}{where}", False)


def waiting_reason(
    job: Job, state_of: dict[int, str], stuck: frozenset = frozenset(), now: Optional[float] = None
) -> Optional[Wait]:
    """Why a pending job cannot start yet (its dependencies; given `now`, its --begin time), or None.
    `stuck`: pending jobs blocked for good, so that their dependents are too."""
    if states.handing_over(job):  # marked by a hand-over to Slurm (engine/lifecycle/slurm_handover.py): never run here
        return Wait(f"being handed to Slurm; if that was cut short, `gpuq slurm submit {job.id}` finishes it", True)
    waits = [_dependency_wait(job.id, d, state_of.get(d), False, stuck) for d in job.after]
    waits += [_dependency_wait(job.id, d, state_of.get(d), True, stuck) for d in job.after_any]
    found = [w for w in waits if w is not None]
    if now is not None and job.begin_at:
        begin = parse_iso(job.begin_at) or 0.0
        if begin > now:  # `02:00`, or `Dec 03 02:00` when it is not within a day
            when = time.strftime("%H:%M" if begin - now < 86400 else "%b %d %H:%M", time.localtime(begin))
            found.append(Wait(f"starts at {when} (--begin)", False))
    # the first that blocks for good, else the first
    return next((w for w in found if w.forever), found[0] if found else None)


def next_begin(pending: list[Job], now: float) -> Optional[float]:
    """The earliest --begin time still to come among pending jobs (the worker wakes for it)."""
    times = [parse_iso(job.begin_at) or 0.0 for job in pending if job.begin_at]
    return min((t for t in times if t > now), default=None)


def queue_order(pending: list[Job]) -> list[Job]:
    return sorted(pending, key=queue_key)


def queue_key(job: Job) -> tuple[bool, bool, int, int]:
    """Urgent jobs first, then resumed continuations (`queue_front`), then priority, then id."""
    return (not job.urgent, not job.queue_front, -job.priority, job.id)


def preemption_victims(
    snapshot: QueueState,
    free_slots: list[Optional[str]],
    slots: list[Optional[str]],
    preempting: set[int],
    continues: Callable[[Job], Any],
) -> tuple[list[Job], list[Job]]:
    """Running jobs to preempt so that ready urgent jobs can start (one for each that neither a free
    slot nor a preemption under way serves), and the urgent jobs left without one. A victim must be
    able to continue unless the urgent job is `--urgent=force`; the lowest priority goes first, then
    the one started last (it loses the least work)."""
    urgent = [j for j in snapshot.pending if j.urgent]  # few or none: filter before the costly part
    if not any(map(may_preempt, urgent)):
        return [], []
    urgent = queue_order([j for j in urgent if waiting_reason(j, snapshot.states, now=snapshot.now) is None])
    need = len(urgent) - len(free_slots) - len(preempting)
    # the free slots and preemptions under way serve those ahead; the others may preempt
    unserved = [j for j in urgent[max(0, len(urgent) - need) :] if may_preempt(j)] if need > 0 else []
    need = len(unserved)
    if need == 0:
        return [], []
    victims: list[Job] = []
    would_lose: list[Job] = []
    # never urgent or adopted jobs, jobs of other workers' slots, or jobs without a process yet
    candidates = [j for j in snapshot.running if j.id not in preempting and j.pid and not (j.urgent or j.adopted)]
    for job in sorted((j for j in candidates if slots == [None] or j.slot in slots), key=victim_key):
        if len(victims) == need:
            break
        (victims if continues(job) else would_lose).append(job)
    forced = sum(1 for j in unserved if j.urgent == URGENT_FORCE)
    victims += would_lose[: max(0, min(forced, need - len(victims)))]
    return victims, unserved[len(victims) :]


def may_preempt(job: Job) -> bool:
    """An urgent job that was never preempted itself: else two urgent jobs could take turns."""
    return bool(job.urgent) and not job.preemptions


def victim_key(job: Job) -> tuple[int, float]:
    return job.priority, -(parse_iso(job.started_at) or 0.0)


def occupied_slots(running: list[Job], slots: list[Optional[str]]) -> set[Optional[str]]:
    """Slots taken by running jobs; one with slot None (whole machine, or adopted) takes all."""
    if running and (slots == [None] or any(job.slot is None for job in running)):
        return set(slots)
    return {job.slot for job in running} & set(slots)


def waiting_reasons(snapshot: QueueState, extra: Optional[dict[int, Wait]] = None) -> dict[int, Optional[Wait]]:
    """waiting_reason for every pending job, blockage passed down dependency chains. `extra`: reasons
    beyond dependencies (the GPUs a ready job waits for). A job that waits for itself through other
    pending jobs is blocked: none of them would ever start (they came by hand or by `gpuq import`,
    not by `gpuq edit`, which refuses a loop); the jobs after it are then blocked by it."""
    extra = extra or {}
    # a loop goes only through pending jobs (a held one blocks its dependents already; others end)
    pending = {job.id for job in snapshot.pending}
    waits = {job.id: [d for d in job.after + job.after_any if d in pending] for job in snapshot.pending}
    loops = {i: Wait(loop_reason(chain), True) for i, chain in dependency_loops(waits).items()}
    stuck = frozenset(i for i, w in extra.items() if w.forever) | frozenset(loops)
    while True:
        reasons = {
            j.id: loops.get(j.id) or waiting_reason(j, snapshot.states, stuck, snapshot.now) or extra.get(j.id)
            for j in snapshot.pending
        }
        now_stuck = frozenset(i for i, w in reasons.items() if w is not None and w.forever)
        if now_stuck == stuck:
            return reasons
        stuck = now_stuck


def has_startable_future(snapshot: QueueState, extra: Optional[dict[int, Wait]] = None) -> bool:
    return any(w is None or not w.forever for w in waiting_reasons(snapshot, extra).values())


def dependency_loops(waits: dict[int, list[int]]) -> dict[int, list[int]]:
    """Jobs that wait for themselves: each one found, with its loop (`[1, 2, 1]`: #1 after #2 after
    #1). `waits`: each waiting job's dependencies (ids not in it wait for nothing). One depth-first
    search that enters each job once, so it finds at least one job of every loop, and always the
    first key of `waits` when that one waits for itself (the search starts there); a job it does
    not name still reaches a named one, so `waiting_reasons` blocks it through that one."""
    loops: dict[int, list[int]] = {}
    done: set[int] = set()
    for root in waits:
        if root in done:
            continue
        path, on_path, todo = [root], {root: 0}, [iter(waits[root])]
        while todo:
            dep = next(todo[-1], None)
            if dep is None:  # every dependency of the job on top looked at
                todo.pop()
                done.add(path[-1])
                del on_path[path.pop()]
            elif dep in on_path:  # back to a job on the path: the path from there is a loop
                loop = path[on_path[dep] :]
                for i, job_id in enumerate(loop):
                    loops.setdefault(job_id, loop[i:] + loop[:i] + [job_id])
            elif dep not in done and dep in waits:
                on_path[dep] = len(path)
                path.append(dep)
                todo.append(iter(waits[dep]))
    return loops


def loop_reason(loop: list[int]) -> str:
    return "waits for itself (" + " after ".join(f"#{i}" for i in loop) + ")"
