"""Fair share between the users of one machine (lease_layout.md sections 7-9), kept in the lease
directory: no daemon decides. A job that waits for GPUs another user holds (or for its turn) leaves
a waiting ticket there, held by its worker (a stopped holder's counts for nothing); the oldest ticket
that wants a GPU has its turn there, ties (TIE_SECONDS) going to the user with the fewest recent
GPU-hours for their policy weight. One user alone meets no ticket. The policy's caps hold a user's
jobs back as placement goes down the line (`CapGate`).
"""

from __future__ import annotations

import os
import time
from typing import AbstractSet, Any, Callable, Iterable, NamedTuple, Optional, Sequence

from gpuq.core.job import Job
from gpuq.core.times import clock
from gpuq.core.words import cap_text
from gpuq.engine.schedule import scheduler
from gpuq.engine.schedule.placement import Blocked, Decision, Leased, Placement, Request
from gpuq.spool import Spool
from gpuq.system import policy as machine_policy
from gpuq.system.lease_io import user_name
from gpuq.system.leases import HeldTicket, LeaseDir, LeaseDirProblem, Ticket, say_once, spool_ids
from gpuq.system.policy import Policy

# Tickets posted this close together wait "since the same moment": several users that waited for
# one job to end. Far below a job's length, so that a user whose job just ended, waiting again at
# once, never ties with the one that waited all through that job.
TIE_SECONDS = 0.5
TURN_RESCAN_SECONDS = 0.25  # a worker holding a ticket looks this often: the GPU waits for it meanwhile
# A ticket that kept a start off a free GPU this long has let it go (`Patience`); a holder that
# waits for the GPU takes it within a second or two.
TURN_GRACE_SECONDS = 30.0


def first_in_line(
    tickets: Sequence[Ticket], usage: Callable[[Iterable[int]], dict[int, float]], policy: Policy
) -> Ticket:
    """Whose turn it is among `tickets` (not empty): the oldest, a tie going to the least recent use."""
    earliest = min(t.since for t in tickets)
    tied = [t for t in tickets if t.since - earliest < TIE_SECONDS]
    if len({t.uid for t in tied}) < 2:
        return min(tied, key=lambda t: (t.since, t.file))
    used = usage({t.uid for t in tied})
    return min(tied, key=lambda t: (used.get(t.uid, 0.0) / policy.of(t.user).weight, t.since, t.file))


def turn_reason(ticket: Ticket, gpu_index: int) -> str:
    since = clock(ticket.since)
    return f"waiting for its turn on GPU {gpu_index}: {ticket.who(os.geteuid())} has waited since {since}"


class Patience:
    """A turn must be taken: a ticket that has kept this program off a free GPU (no live lease on it)
    for TURN_GRACE_SECONDS is passed over there for as long as it lives. A ticket waiting for more
    GPUs than are free runs no clock: it waits for their holders, not for its own."""

    def __init__(self) -> None:
        self.since: dict[tuple[str, str], float] = {}  # (ticket file, GPU uuid) -> when it first could start
        self.forfeit: set[tuple[str, str]] = set()  # turns not taken in time
        self.leased: frozenset[str] = frozenset()
        self.gpus: tuple[str, ...] = ()  # every GPU's uuid, to count those a ticket could start on
        self.now = 0.0

    def look(self, tickets: Iterable[Ticket], leased: Iterable[str], now: float, gpus: Iterable[str] = ()) -> None:
        """Before a decision: the live tickets (the others' clocks go), the GPUs leased, the monotonic
        time, every GPU's uuid."""
        live = {ticket.file for ticket in tickets}
        self.since = {key: at for key, at in self.since.items() if key[0] in live}
        self.forfeit = {key for key in self.forfeit if key[0] in live}
        self.leased, self.now, self.gpus = frozenset(leased), now, tuple(gpus)

    def passed(self, ticket: Ticket, uuid: str) -> bool:
        key = (ticket.file, uuid)
        if key in self.forfeit:
            return True
        free = [u for u in self.gpus if ticket.wants(u) and u not in self.leased]
        whole = ticket.mem_mib is None and bool(self.gpus)  # a share may fit beside a lease: not counted
        if uuid in self.leased or (whole and len(free) < ticket.gpus):  # its holder could not have started
            self.since.pop(key, None)
            return False
        if self.now - self.since.setdefault(key, self.now) < TURN_GRACE_SECONDS:
            return False
        self.forfeit.add(key)
        return True


class HeldBack(NamedTuple):
    reason: str
    forever: bool
    capped: bool  # by this user's cap (it takes no one's turn), else by another user's turn


def held_back(
    chosen: Sequence[int],
    uuid_of: dict[int, str],
    tickets: Sequence[Ticket],
    directory: LeaseDir,
    policy: Policy,
    cap: Optional[int],
    held: frozenset[str],
    patience: Optional[Patience] = None,
) -> Optional[HeldBack]:
    """Why a start on the GPUs `chosen` (indexes; `uuid_of` names them) must wait, this user
    holding the GPUs `held` (uuids; two shares of one GPU hold one): their cap, or another user's
    turn on one of them (one `patience` has waited out is passed over); None if it may start. A
    worker's jobs and `gpuq lease` are held back alike."""
    if not chosen:
        return None
    if cap is not None and len(held | {uuid_of.get(index, str(index)) for index in chosen}) > cap:
        return HeldBack(cap_text(cap, len(chosen)), len(chosen) > cap, True)
    usage = lambda uids: directory.usage(uids, half_life=policy.half_life)  # noqa: E731
    me, why = os.geteuid(), None
    for index in chosen:  # every one: the clocks of all the GPUs it waits for run together
        uuid = uuid_of.get(index, "")
        wanting = [t for t in tickets if t.wants(uuid)]
        while wanting:
            first = first_in_line(wanting, usage, policy)
            if first.uid == me:
                break
            if patience is None or not patience.passed(first, uuid):
                why = why or HeldBack(turn_reason(first, index), False, False)
                break
            wanting.remove(first)
    return why


class CapGate:
    """This user's cap as placement applies it to each GPU job in line (a placement.Gate): one asking
    for more GPUs than the cap is blocked for good; one that would hold more than the cap with the
    GPUs already held waits for one of their jobs to end, and the GPU jobs behind it wait too, so that
    smaller ones do not take the room it waits for. The jobs it holds back go to `capped`."""

    def __init__(self, cap: int, held: frozenset[str], uuid_of: dict[int, str], capped: set[int]) -> None:
        self.cap, self.held, self.uuid_of, self.capped = cap, held, uuid_of, capped
        self.full = False  # a job waits for the cap: none behind it takes what frees under it

    def __call__(self, job_id: int, request: Request, decision: Decision) -> Decision:
        # GPUs held, not jobs: a share on a GPU already held takes none more; one not placed yet may need its own
        if isinstance(decision, Placement):
            after = self.held | {self.uuid_of.get(i, str(i)) for i in decision.gpus}
            over = len(after) > self.cap
        else:
            after, over = self.held, len(self.held) + request.gpus > self.cap
        if request.gpus > self.cap or self.full or over:
            self.capped.add(job_id)
            forever = request.gpus > self.cap
            self.full = self.full or not forever
            return Blocked(cap_text(self.cap, request.gpus), forever)
        self.held = after
        return decision


class Turns:
    """A worker's part in the turns: holding its jobs back for others' turns and its user's cap, and
    the ticket of its first job that waits for another user."""

    def __init__(self, spool_home: str, say: Callable[[str], None], lease_dir: Optional[str] = None):
        self.spool_home, self.say, self.lease_dir = spool_home, say, lease_dir
        self.lease_id = Spool(spool_home).lease_id  # how its tickets name the spool
        self.me = os.geteuid()
        self.user = user_name(self.me)
        self.ticket: Optional[HeldTicket] = None
        self.turn_waits: set[int] = set()  # jobs held back for another user's turn at this plan
        self.capped: set[int] = set()  # jobs held back by the cap at this plan
        self.paused = False  # the worker starts nothing (stopping, draining): it waits for no turn
        self.patience = Patience()

    def _dir(self) -> Optional[LeaseDir]:
        try:
            return LeaseDir.open(self.lease_dir)
        except LeaseDirProblem as exc:
            say_once(str(exc), self.say)
            return None

    def cap_gate(
        self, held_here: frozenset[str], leased: Sequence[Leased], uuid_of: dict[int, str]
    ) -> Optional[CapGate]:
        """This user's cap for one placement (None: no cap); `held_here`: the GPUs (uuids) this
        spool's jobs hold or are starting on, to which their leases of other spools add."""
        self.capped = set()
        cap = self.cap()
        if cap is None:
            return None
        elsewhere = {held.lease.gpu_uuid for held in leased if held.lease.uid == self.me}
        return CapGate(cap, held_here | elsewhere, uuid_of, self.capped)

    def cap(self) -> Optional[int]:
        """This user's cap in the machine's policy (None: none)."""
        return self._policy().of(self.user).max_gpus

    def _policy(self) -> Policy:
        return machine_policy.load(lambda line: say_once(line, self.say))

    def hold_back(
        self,
        starts: list[tuple[Job, Any]],
        waits: dict[int, scheduler.Wait],
        gpus: Sequence[tuple[int, str]],
    ) -> list[tuple[Job, Any]]:
        """The planned starts (job, Assignment) less those another user's turn forbids, which go to
        `waits`. `gpus`: (index, uuid) of the GPUs seen. (The cap was kept as they were placed.)"""
        self.turn_waits = set()
        if not any(where.gpus for _job, where in starts):
            return starts
        directory = self._dir()
        if directory is None:
            return starts
        policy = self._policy()
        leased = [lease.gpu_uuid for lease in directory.live()]
        tickets = directory.tickets()
        for problem in directory.problems:
            say_once(problem, self.say)
        uuid_of = dict(gpus)
        self.patience.look(tickets, leased, time.monotonic(), uuid_of.values())
        kept = []
        for job, where in starts:
            why = held_back(where.gpus or (), uuid_of, tickets, directory, policy, None, frozenset(), self.patience)
            if why is None:
                kept.append((job, where))
            else:
                self.turn_waits.add(job.id)
                waits[job.id] = scheduler.Wait(why.reason, why.forever)
        return kept

    def upkeep(
        self,
        pending: Sequence[Job],
        waits: dict[int, scheduler.Wait],
        for_gpus: AbstractSet[int],
        busy: Iterable[int],
        gpus: Sequence[tuple[int, str]],
        allowed: Optional[set[int]],
        leased: Sequence[Leased],
    ) -> None:
        """Keep a ticket for the first pending job that waits for another user (their lease on a GPU it
        may use, or their turn), until that job is running; release it otherwise. `for_gpus`: the jobs
        of `waits` that wait for GPUs, not for the host's memory or CPUs (which no GPU's turn brings)."""
        if self.paused:
            self.release()
            return
        candidates = [uuid for index, uuid in gpus if allowed is None or index in allowed]
        others_hold = any(lease.lease.uid != self.me and lease.lease.gpu_uuid in candidates for lease in leased)
        waiting = None
        for job in pending:
            wait = waits.get(job.id)
            if wait is None or job.id in self.capped or not job.gpu_request:
                continue
            if job.id in self.turn_waits or (others_hold and job.id in for_gpus and not wait.forever):
                waiting = job
                break
        held = self.ticket.ticket.job if self.ticket is not None else None
        if held is not None and (held in set(busy) or (waiting is not None and waiting.id == held)):
            return  # still waiting, or starting: its place is kept until its lease is taken
        self.release()
        if waiting is None:
            return
        directory = self._dir()
        if directory is None:
            return
        try:
            self.ticket = directory.post_ticket(
                job=waiting.id, spool=spool_ids(self.spool_home, self.lease_id.get())[0], gpus=waiting.gpu_request,
                mem_mib=waiting.gpu_mem_mib, gpu_uuids=None if allowed is None else candidates,
            )  # fmt: skip
        except LeaseDirProblem as exc:
            say_once(str(exc), self.say)

    def release(self) -> None:
        if self.ticket is not None:
            self.ticket.release()
            self.ticket = None


def others_waiting(uuids: Iterable[str]) -> Optional[Ticket]:
    """The oldest live ticket of another user that wants one of these GPUs (a supervisor then hands
    them to no next job of its own), or None; None also where the lease directory cannot be used."""
    wanted = set(uuids)
    if not wanted:
        return None
    try:
        tickets = LeaseDir.open().tickets()
    except LeaseDirProblem:
        return None
    me = os.geteuid()
    return next((t for t in tickets if t.uid != me and any(t.wants(u) for u in wanted)), None)
