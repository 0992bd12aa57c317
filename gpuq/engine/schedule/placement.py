"""Which GPUs a job may start on now, or why it waits: pure decisions over one look at the GPUs, the
gpuq jobs holding GPUs (with their process trees) and other parties' live leases.

A GPU's memory is committed (gpuq's jobs and memory leases), outside (processes of no holding or
lease, plus used memory no listed process explains: hidden processes, so counting it errs towards
waiting), or free. A whole-GPU request takes GPUs nothing of gpuq's and no lease holds, with outside
memory at most `foreign_threshold_mib`; a shared one takes the best fit among GPUs without a whole
holding, so that big GPUs stay free for big jobs. A GPU in an exclusive compute mode takes one process.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence, Union

from gpuq.core.words import lease_text, memory_too_small
from gpuq.engine.schedule.scheduler import BEHIND
from gpuq.system.gpus import Gpu, GpuLook, mib_text
from gpuq.system.leases import Lease

# Outside memory a whole-GPU job tolerates: a bare CUDA context (0.3-0.6 GiB) or a desktop does
# not hold a GPU; a process that allocated a GiB or more does.
DEFAULT_FOREIGN_THRESHOLD_MIB = 1024

# Unexplained memory is named in a reason from this size on even when listed processes block alone.
UNEXPLAINED_NAMED_MIB = 1024

GPUS = "gpus"
CPU_ONLY = "cpu-only"
UNREADABLE = "unreadable"


@dataclass(frozen=True)
class Request:
    """gpus=0: a CPU job. gpu_mem_mib=None: its GPUs whole; else MiB on each, shared."""

    gpus: int = 1
    gpu_mem_mib: Optional[int] = None
    largest: bool = False  # only the GPUs with the most memory (a whole-GPU job's out-of-memory retry)

    def __post_init__(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 0:
            raise ValueError(f"--gpus: expected a whole number >= 0, got {self.gpus!r}")
        if self.gpu_mem_mib is not None:
            if isinstance(self.gpu_mem_mib, bool) or not isinstance(self.gpu_mem_mib, int) or self.gpu_mem_mib < 1:
                raise ValueError(f"--gpu-mem: expected a size of at least 1 MiB, got {self.gpu_mem_mib!r}")
            if self.gpus == 0:
                raise ValueError("--gpu-mem needs --gpus 1 or more (--gpus 0 is a CPU job)")


@dataclass(frozen=True)
class Holding:
    job_id: int
    gpus: tuple[int, ...]
    gpu_mem_mib: Optional[int]
    pids: frozenset[int] = frozenset()
    since: float = math.inf  # when it started (seconds since the epoch); inf: starting now


@dataclass(frozen=True)
class Leased:
    lease: Lease
    pids: frozenset[int] = frozenset()
    mine: tuple[str, ...] = ()  # the deciding party's spool_ids: its own jobs there are "your job #N"


@dataclass(frozen=True)
class Placement:
    gpus: tuple[int, ...]  # ascending; () for a CPU job


@dataclass(frozen=True)
class Blocked:
    reason: str  # one line, for `gpuq status`
    forever: bool  # True: cannot start on this worker whatever finishes; the scheduler skips it


Decision = Union[Placement, Blocked]
Describe = Callable[[int], str]
# (job, its request, where it would start or why not) -> the decision that stands: a last word on
# each job in line before it holds GPUs or is first in line (turns.py's cap)
Gate = Callable[[int, Request, Decision], Decision]


@dataclass
class _GpuState:
    gpu: Gpu
    jobs: list[int] = field(default_factory=list)  # gpuq jobs holding it
    whole: bool = False  # one of them holds it whole
    committed: int = 0
    outside: list[tuple[int, Optional[int]]] = field(default_factory=list)  # (pid, MiB or None)
    unexplained: int = 0
    leases: list[Leased] = field(default_factory=list)  # other parties' leases of it
    leased_mib: int = 0  # what its memory leases commit

    @property
    def outside_mib(self) -> int:
        return sum(mib or 0 for _, mib in self.outside) + self.unexplained

    @property
    def free_mib(self) -> int:
        return max(0, self.gpu.memory_total_mib - self.committed - self.leased_mib - self.outside_mib)


def mode_of(look: GpuLook) -> str:
    if look.gpus:
        return GPUS
    if look.source == "none" or look.problem is None:
        return CPU_ONLY
    return UNREADABLE


def unreadable(look: GpuLook) -> Blocked:
    return Blocked(f"waiting for the GPUs to be readable: {look.problem}", forever=False)


def place(
    request: Request,
    gpus: Sequence[Gpu],
    allowed: Optional[Iterable[int]] = None,
    holdings: Iterable[Holding] = (),
    own_pids: Iterable[int] = frozenset(),
    foreign_threshold_mib: int = DEFAULT_FOREIGN_THRESHOLD_MIB,
    describe: Optional[Describe] = None,
    leased: Sequence[Leased] = (),
) -> Decision:
    """Where `request` can start now among `gpus` restricted to `allowed` (None: all), or why not.
    `own_pids`: every process of a gpuq job; `describe(pid)` gives "python, user alice"."""
    if request.gpus == 0:
        return Placement(())
    wanted = None if allowed is None else set(allowed)
    candidates = _candidates(request, gpus, wanted)
    if request.gpus > len(candidates):
        have = ",".join(str(g.index) for g in candidates)
        why = f"needs {request.gpus} GPU{'s' if request.gpus != 1 else ''}; this worker has {len(candidates)}"
        why += f" ({have})" if have else ""
        missing = (wanted or set()) - {g.index for g in gpus}
        if missing:
            why += f"; GPU {','.join(str(i) for i in sorted(missing))} not found on this machine"
        return Blocked(why, forever=True)
    holdings = list(holdings)
    # every gpuq process -> the job holding GPUs it belongs to (None: one without GPUs)
    owners: dict[int, Optional[int]] = {pid: None for pid in own_pids}
    owners.update({pid: h.job_id for h in holdings for pid in h.pids})
    states = _states(candidates, holdings, leased)
    text = _Texts(describe, owners)
    if request.gpu_mem_mib is None:
        return _place_whole(request.gpus, states, foreign_threshold_mib, text)
    return _place_shared(request.gpus, request.gpu_mem_mib, states, text)


def place_in_order(
    requests: Sequence[tuple[int, Request]],
    gpus: Sequence[Gpu],
    allowed: Optional[Iterable[int]] = None,
    holdings: Iterable[Holding] = (),
    own_pids: Iterable[int] = frozenset(),
    foreign_threshold_mib: int = DEFAULT_FOREIGN_THRESHOLD_MIB,
    describe: Optional[Describe] = None,
    leased: Sequence[Leased] = (),
    kept_for: Optional[tuple[int, frozenset[int]]] = None,
    gate: Optional[Gate] = None,
) -> dict[int, Decision]:
    """`place` for ready jobs in queue order, each placement a holding for the jobs after it. Once a
    GPU job waits, the GPUs it would get first are kept for it (`reserve`): a job behind it starts
    only on other GPUs (backfill), else waits behind it; so a stream of small jobs never keeps a big
    one waiting forever. A job that can never fit holds no one up. `kept_for`: (job, GPUs) no other
    job may take (an urgent job's, emptied by its preemptions). `gate` has the last word on each GPU
    job: one it blocks for good holds nothing, one it holds back is first in line as any waiting job.
    A job may still take a GPU kept for a first in line that asks for memory (`_leaves_room`)."""
    allowed = None if allowed is None else set(allowed)
    everyone = {g.index for g in gpus if allowed is None or g.index in allowed}
    own = frozenset(own_pids)
    held = list(holdings)
    text = _Texts(describe, {})  # its describe() looks each pid up once for the whole step
    first_waiting: Optional[int] = None
    first: Optional[Request] = None  # its request
    others: Optional[set[int]] = None  # the GPUs a job behind the first in line may start on
    decisions: dict[int, Decision] = {}
    for job_id, request in requests:
        decision = place(request, gpus, allowed, held, own, foreign_threshold_mib, text.describe, leased)
        fence, why = _fence(job_id, everyone, others, first_waiting, kept_for)
        if isinstance(decision, Placement) and decision.gpus and fence is not None and not fence >= set(decision.gpus):
            elsewhere = place(request, gpus, fence, held, own, foreign_threshold_mib, text.describe, leased)
            if isinstance(elsewhere, Placement):
                decision = elsewhere
            else:
                taking = Holding(job_id, decision.gpus, request.gpu_mem_mib)
                on_kept = set(decision.gpus) - fence
                urgent = kept_for is not None and bool(on_kept & kept_for[1])
                if urgent or not _leaves_room(first, on_kept, gpus, [*held, taking], leased):
                    decision = Blocked(why, forever=False)
        if gate is not None and request.gpus:
            decision = gate(job_id, request, decision)
        if isinstance(decision, Placement) and decision.gpus:
            held.append(Holding(job_id, decision.gpus, request.gpu_mem_mib))
        elif isinstance(decision, Blocked) and not decision.forever and first_waiting is None:
            first_waiting, first = job_id, request
            if kept_for is not None and job_id == kept_for[0]:
                kept = set(kept_for[1])  # what its preemptions empty, not what `reserve` would choose
            else:
                kept = reserve(request, gpus, allowed, held, leased, foreign_threshold_mib)
            others = everyone - kept
        decisions[job_id] = decision
    return decisions


def _fence(
    job_id: int,
    everyone: set[int],
    others: Optional[set[int]],
    first_waiting: Optional[int],
    kept_for: Optional[tuple[int, frozenset[int]]],
) -> tuple[Optional[set[int]], str]:
    """The GPUs a job may start on while some are kept for another job (None: any), and why it
    waits if it fits only on kept ones."""
    if kept_for is not None and job_id != kept_for[0]:
        free = (everyone if others is None else others) - kept_for[1]
        return free, f"{BEHIND}{kept_for[0]} (urgent: the GPUs its preemptions empty are kept for it)"
    if kept_for is not None and others is not None:  # the job they are kept for: those are its
        return others | kept_for[1], f"{BEHIND}{first_waiting} (first in line for a GPU)"
    return others, f"{BEHIND}{first_waiting} (first in line for a GPU)"


def _leaves_room(
    first: Optional[Request], kept: set[int], gpus: Sequence[Gpu], holdings: list[Holding], leased: Sequence[Leased]
) -> bool:
    """Whether the jobs of `holdings` on the `kept` GPUs leave the first in line's memory free of
    them and of leases: then it waits only for memory that is not gpuq's, and starting them there
    never delays it. A whole-GPU first in line keeps its GPUs."""
    if first is None or first.gpu_mem_mib is None:
        return False
    states = _states([g for g in gpus if g.index in kept], holdings, leased)
    return all(
        not s.whole and not _taken(s) and s.gpu.memory_total_mib - s.leased_mib - s.committed >= first.gpu_mem_mib
        for s in states
    )


def reserve(
    request: Request,
    gpus: Sequence[Gpu],
    allowed: Optional[Iterable[int]],
    holdings: Sequence[Holding],
    leased: Sequence[Leased] = (),
    foreign_threshold_mib: int = DEFAULT_FOREIGN_THRESHOLD_MIB,
) -> set[int]:
    """The GPUs a waiting job keeps, to get them once gpuq's jobs there end: among those it may use,
    those where it would fit then (others' memory and leases counted), whose newest gpuq job started
    longest ago; then the freest. The choice stands while jobs start elsewhere (their start is newer)
    and changes only to GPUs whose jobs started earlier still: no job starts on a kept GPU, so the
    first in line gets one once the jobs there have ended, however many small jobs come behind it."""
    candidates = _candidates(request, gpus, None if allowed is None else set(allowed))
    newest: dict[int, float] = {}
    for holding in holdings:
        for index in holding.gpus:
            newest[index] = max(newest.get(index, -math.inf), holding.since)

    def unusable(state: _GpuState) -> bool:  # what others hold there keeps it from fitting even once ours end
        if request.gpu_mem_mib is None:
            return bool(state.leases) or _outside_blocks(state, foreign_threshold_mib)
        others = state.outside_mib + state.leased_mib
        return _taken(state) or state.gpu.memory_total_mib - others < request.gpu_mem_mib

    states = _states(candidates, list(holdings), leased)
    order = sorted(states, key=lambda s: (unusable(s), newest.get(s.gpu.index, -math.inf), -s.free_mib, s.gpu.index))
    return {s.gpu.index for s in order[: request.gpus]}


def _candidates(request: Request, gpus: Sequence[Gpu], wanted: Optional[set[int]]) -> list[Gpu]:
    """The GPUs `wanted` (None: all) by index; for a `largest` request, the largest of them."""
    found = [g for g in sorted(gpus, key=lambda g: g.index) if wanted is None or g.index in wanted]
    most = max((g.memory_total_mib for g in found), default=0)
    return [g for g in found if g.memory_total_mib == most] if request.largest else found


def _states(candidates: list[Gpu], holdings: list[Holding], leased: Sequence[Leased]) -> list[_GpuState]:
    states = []
    for gpu in candidates:
        state = _GpuState(gpu, leases=[held for held in leased if held.lease.gpu_uuid == gpu.uuid])
        here = [h for h in holdings if gpu.index in h.gpus]
        using = {h.job_id: 0 for h in here}
        holder_of = {pid: h.job_id for h in here for pid in h.pids}
        leaseholders = {pid for held in state.leases for pid in held.pids}
        for proc in gpu.processes:
            if proc.pid in leaseholders:
                continue  # counted with its lease below
            if proc.pid in holder_of:
                using[holder_of[proc.pid]] += proc.used_memory_mib or 0
            else:
                state.outside.append((proc.pid, proc.used_memory_mib))
        listed = sum(p.used_memory_mib or 0 for p in gpu.processes)
        state.unexplained = max(0, gpu.memory_used_mib - listed)
        for holding in here:
            state.jobs.append(holding.job_id)
            state.whole = state.whole or holding.gpu_mem_mib is None or gpu.exclusive
            state.committed += max(holding.gpu_mem_mib or 0, using[holding.job_id])
        for held in state.leases:  # a memory lease commits its size, or what its holder uses if more
            state.leased_mib += 0 if held.lease.whole else max(held.lease.mem_mib or 0, _using(held, gpu))
        state.outside.sort(key=lambda item: (-(item[1] or 0), item[0]))
        states.append(state)
    return states


def _place_whole(count: int, states: list[_GpuState], threshold: int, text: _Texts) -> Decision:
    usable = [s.gpu.index for s in states if not s.jobs and not s.leases and not _outside_blocks(s, threshold)]
    if len(usable) >= count:
        return Placement(tuple(usable[:count]))
    outside = [s for s in states if s.leases or (not s.jobs and _outside_blocks(s, threshold))]
    busy = [s for s in states if s.jobs and s not in outside]
    if not outside:
        wanted = "a free GPU" if count == 1 else f"{count} free GPUs"
        return Blocked(f"waiting for {wanted} ({', '.join(text.jobs_on(s) for s in busy)})", forever=False)
    parts = [f"GPU {s.gpu.index}: {text.others(s, threshold)}" for s in outside]
    parts += [f"GPU {s.gpu.index}: {text.jobs(s)}" for s in busy]
    return Blocked("waiting for " + "; ".join(parts), forever=False)


def _place_shared(count: int, need: int, states: list[_GpuState], text: _Texts) -> Decision:
    big_enough = [s for s in states if s.gpu.memory_total_mib >= need]
    never = memory_too_small(need, count, [(s.gpu.index, s.gpu.memory_total_mib) for s in states])
    if never:
        return Blocked(never, forever=True)
    fits = [s for s in big_enough if not s.whole and s.free_mib >= need and not _taken(s)]
    if len(fits) >= count:
        best = sorted(fits, key=lambda s: (s.free_mib - need, s.gpu.index))[:count]
        return Placement(tuple(sorted(s.gpu.index for s in best)))
    short = [s for s in big_enough if s not in fits]
    # Blame each GPU it does not fit on on the larger of outside memory and gpuq's commitments.
    outside = [s for s in short if s.leases or (not s.whole and s.outside_mib > s.committed)]
    if outside:
        parts = [f"GPU {s.gpu.index}: {text.others(s, 0)}" for s in outside]
        parts += [f"GPU {s.gpu.index}: {text.jobs(s)}" for s in short if s not in outside and s.jobs]
        return Blocked("waiting for " + "; ".join(parts), forever=False)
    sharable = [s for s in short if not s.whole]
    if not sharable:
        return Blocked(f"waiting for a free GPU ({', '.join(text.jobs_on(s) for s in short)})", forever=False)
    most = max(sharable, key=lambda s: (s.free_mib, -s.gpu.index))
    most_free = f"GPU {most.gpu.index}, {mib_text(most.free_mib)}"
    if count == 1:
        return Blocked(f"waiting for {mib_text(need)} on a GPU (most free: {most_free})", forever=False)
    fit_now = f"{len(fits)} fit{'s' if len(fits) == 1 else ''} now; " if fits else ""
    return Blocked(
        f"waiting for {mib_text(need)} on each of {count} GPUs ({fit_now}most free of the others: {most_free})",
        forever=False,
    )


def _outside_blocks(state: _GpuState, threshold: int) -> bool:
    return state.outside_mib > threshold or (state.gpu.exclusive and bool(state.outside))


def _taken(state: _GpuState) -> bool:  # in an exclusive compute mode, or leased whole, it is someone's
    return any(held.lease.whole for held in state.leases) or (
        state.gpu.exclusive and bool(state.outside or state.leases)
    )


class _Texts:
    """The pieces of the reasons, describing each pid once."""

    def __init__(self, describe: Optional[Describe], owners: dict[int, Optional[int]]):
        self.describe: Describe = functools.cache(describe or (lambda pid: ""))
        self.owners = owners

    def who(self, pid: int) -> str:
        if pid in self.owners:
            job = self.owners[pid]
            return f"pid {pid} (gpuq job #{job})" if job is not None else f"pid {pid} (a gpuq job)"
        about = self.describe(pid)
        return f"pid {pid} ({about})" if about else f"pid {pid}"

    def holders(self, state: _GpuState, threshold: int) -> str:
        """'9.1 GiB held by pid 4242 (python, user alice), 2.0 GiB by pid 77 (...)': the two
        largest, then a count; the unexplained memory when the listed ones do not block alone."""
        shown: list[str] = []
        for pid, mib in state.outside[:2]:
            size = mib_text(mib) if mib is not None else "an unreported amount"
            shown.append(f"{size} {'held ' if not shown else ''}by {self.who(pid)}")
        if len(state.outside) > 2:
            shown.append(f"and {len(state.outside) - 2} more")
        listed = state.outside_mib - state.unexplained
        if state.unexplained and (listed <= threshold or state.unexplained >= UNEXPLAINED_NAMED_MIB):
            shown.append(f"{mib_text(state.unexplained)} in use by no listed process (hidden from this container?)")
        return ", ".join(shown)

    def others(self, state: _GpuState, threshold: int) -> str:
        """What other parties hold of a GPU: their leases, then the outside memory past `threshold`
        (the holders), with gpuq's own jobs there named between when it is leased."""
        parts = [_lease_text(held, state.gpu) for held in state.leases]
        if state.leases and state.jobs:
            parts.append(self.jobs(state))
        if state.outside_mib > threshold or not parts:
            parts.append(self.holders(state, threshold))
        return ", ".join(parts)

    @staticmethod
    def jobs(state: _GpuState) -> str:
        return ", ".join(f"job #{j}" for j in state.jobs)

    def jobs_on(self, state: _GpuState) -> str:
        return f"{state.gpu.index}: {self.jobs(state)}"


def _using(held: Leased, gpu: Gpu) -> int:
    """The MiB a lease holder's processes use on this GPU."""
    return sum(p.used_memory_mib or 0 for p in gpu.processes if p.pid in held.pids)


def _lease_text(held: Leased, gpu: Gpu) -> str:
    # the viewer is whoever decides: the reason tells them "your job" or another user's, and "in
    # another queue" for a job of theirs in no queue of `mine` (a worker's own are not counted)
    lease = held.lease
    return lease_text(lease.who(os.geteuid(), held.mine), lease.mem_mib, lease.since, _using(held, gpu))
