"""The queue's ETA: when each pending job is expected to start and end, behind the running ones
(whose ETAs are eta.py's), from the run times of its command's earlier runs."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from gpuq.core.job import Job
from gpuq.core.states import PENDING, RAY, RUNNING, SLURM
from gpuq.core.times import duration, median, parse_iso
from gpuq.core.words import lease_text, stopped_text
from gpuq.engine.schedule import diskguard, scheduler
from gpuq.engine.schedule.gpuview import of_this_queue
from gpuq.engine.tracking import eta
from gpuq.spool import Spool
from gpuq.spool.cache.index import RECENT_RUNS, Finished
from gpuq.spool.kept import summarise

CPU_LANE = "cpu"  # with GPUs, CPU jobs run one at a time beside them (engine/schedule/planner.py)
# placement.DEFAULT_FOREIGN_THRESHOLD_MIB, for views that do not say the worker's own
DEFAULT_FOREIGN_THRESHOLD_MIB = 1024
RUNS = RECENT_RUNS  # a pending job's run time: the median of the newest RUNS successful runs of its command


def past_durations(spool: Spool, keys: set[str], listing: Optional[Finished] = None) -> dict[str, list[float]]:
    """Run times of the newest RUNS successful runs of each command key, oldest first (`listing`: the
    finished index, if the caller has it)."""
    done = spool.finished.read() if listing is None else listing
    kept = summarise(done.kept)[0]
    found = {key: dict(kept.get(key, ())) for key in keys}  # id -> run time: a job in both counts once
    for key in keys:
        found[key].update(done.runs.get(key, ()))
    return {key: [run for _id, run in sorted(by_id.items())[-RUNS:]] for key, by_id in found.items() if by_id}


SOMETHING = "something before it has no ETA"  # a pending job's unknown start, when no job can be named
NO_WORKER = "no worker is running (`gpuq run`)"  # why a pending job has no start time without one


def worker_slots(workers: list[dict[str, Any]], gpus: Optional[list[int]] = None) -> list[Optional[str]]:
    """The slots live workers serve: with `gpus`, the GPUs they use and the CPU lane; without, [None]
    for a whole-machine worker, else their --gpus labels."""
    if not workers:
        return []
    whole = any(not w.get("gpus") for w in workers)
    if gpus:
        labels = {g for w in workers for g in w.get("gpus") or []}
        served: list[Optional[str]] = [str(i) for i in gpus if whole or str(i) in labels]
        return served + [CPU_LANE]
    if whole:
        return [None]
    return sorted({g for w in workers for g in w["gpus"]})


def _slots_of(job: Job, slots: list[Optional[str]]) -> list[Optional[str]]:
    if job.gpus is not None and CPU_LANE in slots:
        return [str(g) for g in job.gpus] or [CPU_LANE]
    if job.slot is None or slots == [None]:
        return list(slots)
    return [job.slot]


def _needs(job: Job, slots: list[Optional[str]]) -> tuple[list[Optional[str]], int]:
    if CPU_LANE not in slots:
        return list(slots), 1
    count = job.gpu_request
    if count == 0:
        return [CPU_LANE], 1
    return [s for s in slots if s != CPU_LANE], count


def _later(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else max(a, b)


class Outside:
    """What others hold of one GPU: `held` MiB of its `total` (processes not gpuq's, other parties'
    `leases` as lease_text says them); `unleased`: the processes in no lease. Not a named tuple:
    `status` compiles no source."""

    __slots__ = ("held", "total", "leases", "unleased")

    def __init__(self, held: int, total: int, leases: tuple[str, ...] = (), unleased: int = 0) -> None:
        self.held, self.total, self.leases, self.unleased = held, total, leases, unleased

    def holders(self, threshold: int) -> str:
        """Who holds it: the leases, then the processes where they hold more than the threshold."""
        parts = list(self.leases)
        if not parts or self.unleased > threshold:
            mib = self.unleased if parts else self.held
            parts.append(f"{mib / 1024:.1f} GiB held by processes that are not gpuq's")
        return ", ".join(parts)


def _held_off(
    need: Optional[int], usable: list[Optional[str]], outside: dict[str, Outside], threshold: int
) -> dict[Optional[str], Outside]:
    """The GPUs among `usable` that others' memory keeps a job off (slot -> what they hold), as
    placement's gate decides: a whole GPU (`need` None) past the threshold, a share that does not fit."""
    out = {}
    for slot in usable:
        found = outside.get(str(slot))
        if found and found.held and (found.held > threshold if need is None else found.total - found.held < need):
            out[slot] = found
    return out


def outside_memory(gpus: list[dict[str, Any]], home: Optional[str] = None) -> dict[str, Outside]:
    """Slot -> what others hold of it, from a GPU view (an older worker's has no `foreign_mib`: its
    listed processes then): processes not gpuq's, and other parties' leases (a whole one all of it,
    a memory one its size beyond what its processes use, which `foreign_mib` counts)."""
    out = {}
    for gpu in gpus:
        held = gpu.get("foreign_mib")
        if not isinstance(held, int):
            held = sum(p.get("used_memory_mib") or 0 for p in gpu.get("foreign") or [])
        total, unleased, leases = gpu.get("memory_total_mib") or 0, held, []
        for lease in gpu.get("leases") or []:
            if of_this_queue(lease, home):
                continue  # this spool's own jobs: the running ones of the plan
            using = sum(p.get("used_memory_mib") or 0 for p in gpu["foreign"] if p.get("lease") == lease.get("file"))
            held = total if lease.get("whole") else held + max(0, (lease.get("mem_mib") or 0) - using)
            unleased -= using
            mem = None if lease.get("whole") else lease.get("mem_mib") or 0
            leases.append(lease_text(str(lease.get("who")), mem, parse_iso(lease.get("since")) or 0.0, using))
        out[str(gpu["index"])] = Outside(min(held, total), total, tuple(leases), max(0, unleased))
    return out


def gpu_cap(shown: Optional[dict[str, Any]], home: Optional[str]) -> Optional[int]:
    """How many GPUs this spool's jobs may hold under the policy's cap (`max_gpus` of the GPU view;
    None: no cap), less those the user's leases elsewhere hold (other spools, `gpuq lease`)."""
    cap = shown.get("max_gpus") if shown else None
    if not isinstance(cap, int) or isinstance(cap, bool) or shown is None:
        return None
    me = os.geteuid()
    leases = [lease for gpu in shown["gpus"] for lease in gpu.get("leases") or [] if isinstance(lease, dict)]
    elsewhere = sum(1 for lease in leases if lease.get("uid") == me and not of_this_queue(lease, home))
    return max(0, cap - elsewhere)


class Turn:
    """Another user's waiting ticket (lease_layout.md section 7): `count` of the GPUs it wants
    (`slots`) go to `who` once free, for a time no one here knows. `after`: this queue's job whose
    ticket is older, which goes first (None: none)."""

    __slots__ = ("who", "count", "mem_mib", "since", "slots", "after")

    def __init__(self, who: str, count: int, mem_mib: Optional[int], since: float) -> None:
        self.who, self.count, self.mem_mib, self.since = who, count, mem_mib, since
        self.slots: list[Optional[str]] = []
        self.after: Optional[int] = None


def others_turns(gpus: list[dict[str, Any]], home: Optional[str]) -> list[Turn]:
    """Other users' live tickets for these GPUs, oldest first, after our own ticket's job if older."""
    me, found, ours = os.geteuid(), {}, []  # type: tuple[int, dict[str, Turn], list[tuple[float, int]]]
    for gpu in gpus:
        for ticket in gpu.get("tickets") or ():
            since = parse_iso(ticket.get("since")) or 0.0
            if ticket.get("uid") != me:
                count = ticket.get("gpus") if isinstance(ticket.get("gpus"), int) else 1
                turn = found.setdefault(
                    ticket.get("file"), Turn(str(ticket.get("who")), count, ticket.get("mem_mib"), since)
                )
                turn.slots.append(str(gpu["index"]))
            elif of_this_queue(ticket, home) and isinstance(ticket.get("job"), int):
                ours.append((since, ticket["job"]))  # turns between users: only this queue's own ticket orders them
    first = min(ours, default=None)
    for turn in found.values():
        turn.after = first[1] if first is not None and first[0] < turn.since else None
    return sorted(found.values(), key=lambda turn: turn.since)


def plan_queue(
    running: list[tuple[Job, Optional[float]]],
    pending: list[tuple[Job, Any]],
    slots: list[Optional[str]],
    durations: dict[str, list[float]],
    now: Optional[float] = None,
    outside: Optional[dict[str, Outside]] = None,
    threshold: int = DEFAULT_FOREIGN_THRESHOLD_MIB,
    cap: Optional[int] = None,
    no_slots: str = NO_WORKER,
    turns: Sequence[Turn] = (),
) -> dict[int, eta.Estimate]:
    """Expected start and end (seconds from now, None: unknown) of each pending job, (job, wait) in
    queue order, behind `running` (job, seconds until it ends), played forward (`_Play`); whatever
    depends on an unknown is unknown. `no_slots`: why nothing starts without `slots`."""
    if not slots:  # a job no worker would start says so first
        return {j.id: eta.Estimate(None, None, _no_start(w) or f"unknown: {no_slots}") for j, w in pending}
    play = _Play(slots, running, durations, outside or {}, threshold, cap)
    waiting: list[tuple[Job, Optional[float]]] = []
    for job, wait in pending:
        never = _no_start(wait)
        if never:
            play.out[job.id] = eta.Estimate(None, None, never)
            play.ends[job.id] = None
            continue
        ready: Optional[float] = 0.0
        begin = parse_iso(job.begin_at)
        if begin is not None and now is not None:
            ready = max(0.0, begin - now)  # --begin: not before
        waiting.append((job, _later(ready, _host_room_at(job, wait, running))))
    ids = {job.id for job, _ready in waiting}
    line: list[tuple[Any, Optional[float]]] = [(turn, 0.0) for turn in turns if turn.after not in ids]
    for job, ready in waiting:  # each other user's turn in its place: first, or after our older ticket's job
        line += [(job, ready)] + [(turn, 0.0) for turn in turns if turn.after == job.id]
    play.run(line)
    return play.out


def _no_start(wait: Any) -> str:
    """Why a job waiting for `wait` has no start time ('' if it may have one): a person or disk room must."""
    if wait is not None and getattr(wait, "forever", False):
        return f"will not start by itself: {wait.reason}"
    if diskguard.holds(wait):
        return f"start unknown: {wait.reason}"
    return ""


class _Play:
    """The queue played forward as the worker's steps start jobs: whenever a slot frees or a wait
    ends, the ready jobs take the free slots they can use in queue order. A GPU job that must wait
    holds up the GPU jobs behind it (placement.place_in_order), as does one past the user's cap
    (turns.CapGate); one not ready holds up nobody. Another user's `Turn` keeps the GPUs it wants
    from the jobs behind it until it takes them, for good as far as the play knows."""

    def __init__(
        self,
        slots: list[Optional[str]],
        running: list[tuple[Job, Optional[float]]],
        durations: dict[str, list[float]],
        outside: dict[str, Outside],
        threshold: int,
        cap: Optional[int] = None,
    ) -> None:
        self.slots, self.durations, self.outside, self.threshold = slots, durations, outside, threshold
        self.free: dict[Optional[str], Optional[float]] = {s: 0.0 for s in slots}  # None: frees when unknown
        self.ends: dict[int, Optional[float]] = {}  # running jobs, pending ones once placed; None: unknown
        self.out: dict[int, eta.Estimate] = {}
        self.turned: dict[Optional[str], str] = {}  # slot -> whose turn took it, for as long as no one knows
        self.cap = cap if CPU_LANE in slots else None  # without GPUs no job holds any
        self.holding: list[tuple[set[str], Optional[float]]] = []  # (GPUs, until) of the jobs counted against the cap
        self.unknown: list[tuple[Optional[str], Job]] = []  # (slot, job on it that ends when no one knows)
        for job, until in running:
            self.ends[job.id] = until
            if job.gpus:
                self.holding.append(({str(g) for g in job.gpus}, until))
            for slot in _slots_of(job, slots):
                if slot in self.free:
                    self.free[slot] = _later(self.free[slot], until)
                    if until is None:
                        self.unknown.append((slot, job))

    def run(self, waiting: list[tuple[Any, Optional[float]]]) -> None:
        """Place each (job, when its --begin or host room allows it; None: unknown), turns among them."""
        unplaced = {job.id for job, _r in waiting if isinstance(job, Job)}
        # when anything can change: a slot frees (a dependency's end among them), a wait is over
        moments = {t for t in self.free.values() if t is not None} | {r for _j, r in waiting if r is not None}
        at, left = 0.0, waiting
        while left:
            left, placed = self._step(at, left, unplaced)
            if placed:
                moments.update(t for t in (self.ends[job.id] for job in placed) if t is not None)
                continue  # a job that ran for no time may have made another ready now
            moments = {t for t in moments if t > at}
            if not moments:
                break
            at = min(moments)
        for job, _ready in left:
            if isinstance(job, Turn):
                continue
            usable, _count = _needs(job, self.slots)
            held_off = _held_off(job.gpu_mem_mib, usable, self.outside, self.threshold)
            unknown_elsewhere = all(self.free[s] is None or s in held_off for s in usable)
            turned = {s: self.turned[s] for s in usable if s in self.turned and s not in held_off}
            held = _held_text(held_off, self.threshold, turned)
            note = _queue_note(
                None, *self._run_time(job), held, None if unknown_elsewhere else [], self._before(job, usable)
            )
            self.out[job.id] = eta.Estimate(None, None, note)

    def _step(
        self, at: float, left: list[tuple[Any, Optional[float]]], unplaced: set[int]
    ) -> tuple[list[tuple[Any, Optional[float]]], list[Job]]:
        """The jobs of `left` that start at `at`, placed; (the others, those placed)."""
        open_now = [s for s in self.slots if (free := self.free[s]) is not None and free <= at]
        behind, placed, still = False, [], []  # type: tuple[bool, list[Job], list[tuple[Any, Optional[float]]]]
        for n, (job, own) in enumerate(left):
            if not open_now:  # every slot taken: nothing else starts now
                return still + left[n:], placed
            if isinstance(job, Turn):
                if job.after not in unplaced and self._take_turn(job, open_now):
                    open_now = [s for s in open_now if self.free[s] is not None]
                    continue
                still.append((job, own))
                if job.after not in unplaced:  # their turn on these GPUs comes first: ours wait
                    open_now = [s for s in open_now if s not in job.slots]
                continue
            ready = self._ready(job, own, unplaced)
            if ready is None or ready > at:
                still.append((job, own))
                continue
            usable, count = _needs(job, self.slots)
            gpu_job = CPU_LANE in self.slots and CPU_LANE not in usable
            held_off = _held_off(job.gpu_mem_mib, usable, self.outside, self.threshold)
            can = [s for s in open_now if s in usable and s not in held_off]
            if len(can) < count or (behind and gpu_job) or (gpu_job and self._over_cap(count, at)):
                behind = behind or gpu_job
                still.append((job, own))
                continue
            taken = can[:count]
            open_now = [s for s in open_now if s not in taken]
            self._place(job, at, taken, held_off)
            unplaced.discard(job.id)
            placed.append(job)
        return still, placed

    def _take_turn(self, turn: Turn, open_now: list[Optional[str]]) -> bool:
        """Whether another user's turn takes the free GPUs it wants now, theirs for a time no one knows."""
        held_off = _held_off(turn.mem_mib, turn.slots, self.outside, self.threshold)
        can = [s for s in open_now if s in turn.slots and s not in held_off]
        if len(can) < turn.count:
            return False
        for slot in can[: turn.count]:
            self.free[slot], self.turned[slot] = None, turn.who
        return True

    def _over_cap(self, count: int, at: float) -> bool:
        """Whether `count` GPUs more at `at` would be more than the cap lets this spool's jobs hold."""
        if self.cap is None:
            return False
        # GPUs held, not jobs (turns.CapGate): shares on one GPU count it once. A modelled job takes
        # only free slots, none of which a job still held is on, so its `count` GPUs add to them.
        held = set().union(*(gpus for gpus, until in self.holding if until is None or until > at))
        return len(held) + count > self.cap

    def _ready(self, job: Job, own: Optional[float], unplaced: set[int]) -> Optional[float]:
        """When `job`'s dependencies allow it to start (None: one is unplaced or ends when unknown)."""
        ready = own
        for dep in {*job.after, *job.after_any}:
            if dep in unplaced:
                return None
            ready = _later(ready, self.ends.get(dep, 0.0))
        return ready

    def _place(self, job: Job, at: float, taken: list[Optional[str]], held_off: dict[Optional[str], Outside]) -> None:
        run, runs = self._run_time(job)
        end = None if run is None else at + run
        for slot in taken:
            self.free[slot] = end
            if end is None:
                self.unknown.append((slot, job))
        if CPU_LANE not in taken:
            self.holding.append(({str(s) for s in taken}, end))
        self.ends[job.id] = end
        note = _queue_note(at, run, runs, _held_text(held_off, self.threshold), taken)
        self.out[job.id] = eta.Estimate(None, end, note, starts_in=at)

    def _before(self, job: Job, usable: list[Optional[str]]) -> str:
        """Which job before `job` has no ETA: a dependency, else one on the slots it may use."""
        ahead = {j.id: j for _s, j in self.unknown}
        deps = [ahead[d] for d in sorted({*job.after, *job.after_any}) if d in ahead]
        found = deps or list({j.id: j for s, j in self.unknown if s in usable and self.free[s] is None}.values())
        if not found:
            return SOMETHING
        first = found[0]
        named = f"#{first.id} {first.get('name', '')}".rstrip() + (", adopted," if first.adopted else "")
        return f"{named} and {len(found) - 1} more have no ETA" if len(found) > 1 else f"{named} has no ETA"

    def _run_time(self, job: Job) -> tuple[Optional[float], int]:
        past = self.durations.get(eta.command_key(job), [])[-RUNS:]
        return (median(past) if past else None), len(past)


def _host_room_at(job: Job, wait: Any, running: list[tuple[Job, Optional[float]]]) -> Optional[float]:
    """A job held back for host memory or CPUs starts when a running job holding some ends (None: unknown)."""
    reason = getattr(wait, "reason", "")
    asked = [
        field
        for field, word in (("mem_mib", "host memory"), ("cpus", "CPUs"))
        if word in reason and getattr(job, field)
    ]
    if not asked:
        return 0.0
    ends = [until for held, until in running if until is not None and any(getattr(held, f) for f in asked)]
    return min(ends) if ends else None


def _held_text(held_off: dict[Optional[str], Outside], threshold: int, turned: Optional[dict[Any, str]] = None) -> str:
    """What keeps a job off GPUs for a time no one knows: others' memory and (`turned`) their turns."""
    held = [f"GPU {slot}: {holder.holders(threshold)}" for slot, holder in held_off.items()]
    return "; ".join(held + [f"GPU {slot}: {who} takes its turn first" for slot, who in (turned or {}).items()])


def _queue_note(
    start: Optional[float],
    run: Optional[float],
    runs: int,
    held: str = "",
    taken: Optional[list[Any]] = None,
    before: str = SOMETHING,
) -> str:
    """How the start and run time were found. `held`: what keeps it off GPUs; `taken`: the GPUs it is
    expected on instead (None: none frees at a known time); `before`: what before it has no ETA."""
    if held and taken is None:
        when = f"start unknown: {held} (no telling when they free it), and no other GPU frees at a known time"
    elif start is None:
        when = f"start unknown ({before})"
    elif held:
        on = ",".join(map(str, taken or ()))
        when = f"starts in ~{duration(start)} on GPU {on} ({held}, no telling when they free it)"
    else:
        when = f"starts in ~{duration(start)}"
    if run is None:
        return f"{when}; run time unknown (no earlier successful run of this command here)"
    return f"{when}; runs ~{duration(run)} (median of {runs} earlier run{'s' if runs > 1 else ''})"


def _no_slots(workers: list[dict[str, Any]], asleep: list[int]) -> str:
    """Why no worker takes a pending job: none runs, every one is stopped (Ctrl-Z), or they drain."""
    if asleep and len(asleep) == len(workers):
        are = "worker is" if len(asleep) == 1 else "workers are"
        return f"the {are} stopped (Ctrl-Z or SIGSTOP); {stopped_text(asleep)}"
    return scheduler.DRAINING if workers else NO_WORKER


def annotate(
    spool: Spool,
    rows: list[Any],
    workers: list[dict[str, Any]],
    now: float,
    gpus: Optional[dict[str, Any]] = None,
    finished: Optional[Any] = None,
) -> None:
    """Set `row.estimate` for every running, pending, Slurm- and Ray-run row of a status listing
    (`gpus`: the GPU view, when there are GPUs; `finished`: the listing the status was made from)."""
    running = [r for r in rows if r.state == RUNNING]
    for row in rows:  # a job run by Slurm or Ray writes the same log (Ray's is fetched): read the same way
        handed = {SLURM: row.job.slurm, RAY: row.job.ray}.get(row.state) or {}
        if row.state == RUNNING or handed.get("state") == "RUNNING":
            row.estimate = eta.running_estimate(spool, row.job, now)
    in_order = scheduler.queue_order([r.job for r in rows if r.state == PENDING])
    order = {j.id: n for n, j in enumerate(in_order)}
    pending = sorted((r for r in rows if r.state == PENDING), key=lambda r: order[r.job.id])
    if not pending:
        return
    durations = past_durations(spool, {eta.command_key(r.job) for r in pending}, finished)
    shown = gpus["gpus"] if gpus else []
    threshold = gpus.get("foreign_threshold_mib") if gpus else None
    # a stopped worker (Ctrl-Z, SIGSTOP: status's `stopped`) or a draining one starts nothing new
    taking = [w for w in workers if not w.get("draining") and not w.get("stopped")]
    asleep = [w["pid"] for w in workers if w.get("stopped")]
    plan = plan_queue(
        [(r.job, r.estimate.eta_seconds) for r in running],
        [(r.job, _wait_of(r)) for r in pending],
        worker_slots(taking, [g["index"] for g in shown]),
        durations,
        now,
        outside_memory(shown, spool.home),
        threshold if isinstance(threshold, int) else DEFAULT_FOREIGN_THRESHOLD_MIB,
        gpu_cap(gpus, spool.home),
        _no_slots(workers, asleep),
        others_turns(shown, spool.home),
    )
    for row in pending:
        row.estimate = plan.get(row.job.id)


def _wait_of(row: Any) -> Any:
    """A pending row's wait; the disk guard's where the job still waits for space after it."""
    if row.disk_wait is not None and not (row.wait is not None and row.wait.forever):
        return row.disk_wait
    return row.wait
