"""Taking GPUs for a start under the machine-wide lease protocol (lease_layout.md): `claim_gpus`
decides and leases together, under the placing locks of the candidate GPUs, so that two parties that
claim at once, whoever they are, are serialised per GPU.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Iterable, Optional, Sequence, Union

from gpuq.engine.schedule import placement
from gpuq.engine.schedule.placement import GPUS, Blocked, Placement, Request, mode_of
from gpuq.system import gpus, policy, procs
from gpuq.system.gpus import GpuLook
from gpuq.system.leases import Held, Lease, LeaseDir, LeaseDirProblem, say_once

# (the placement, the GPUs seen, the live leases, their directory) -> why the start must wait, or None
Admit = Callable[[Placement, GpuLook, Sequence[Lease], LeaseDir], Optional[Blocked]]


class Claim(list):
    """The leases taken (`Held`, one per GPU; none while leases are off), and `gpus` chosen, ascending."""

    def __init__(self, held: Iterable[Held], gpus: tuple[int, ...]) -> None:
        super().__init__(held)
        self.gpus = gpus

    def release(self) -> None:
        for held in self:
            held.release()


def _say(line: str) -> None:
    sys.stderr.write(f"gpuq: {line}\n")


def claim_gpus(
    request: Request,
    *,
    candidates: Optional[Iterable[int]] = None,
    exclude: Callable[[Lease], bool] = lambda lease: False,
    threshold: int = placement.DEFAULT_FOREIGN_THRESHOLD_MIB,
    job: Optional[int],
    name: str,
    spool: Optional[str],
    mine: Sequence[str] = (),
    lease_dir: Optional[str] = None,
    look: Callable[[], GpuLook] = gpus.look,
    describe: Optional[placement.Describe] = gpus.describe_pid,
    log: Callable[[str], None] = _say,
    admit: Optional[Admit] = None,
) -> Union[Claim, Blocked]:
    """Choose GPUs among `candidates` (None: all) for `request` and lease them to `job` of `spool`
    (None, None for `gpuq lease`), held by this process, or say why it must wait, `mine` (spool_ids)
    telling the user's jobs of their own queue from another's. Every live lease counts but those
    `exclude` names. `admit` may still hold back the GPUs chosen (under their placing locks)."""
    if request.gpus == 0:
        return Claim([], ())
    allowed = None if candidates is None else sorted(set(candidates))
    first = look()
    if mode_of(first) != GPUS:
        return _no_gpus(first)

    def decide(seen: GpuLook, others: Sequence[placement.Leased]) -> Union[Placement, Blocked]:
        return placement.place(request, seen.gpus, allowed, (), frozenset(), threshold, describe, others)

    try:
        directory = LeaseDir.open(lease_dir)
        uuids = [g.uuid for g in first.gpus if allowed is None or g.index in allowed]
        with directory.placing(uuids):
            seen = look()
            if mode_of(seen) != GPUS:
                return _no_gpus(seen)
            seen = seen._replace(gpus=tuple(g for g in seen.gpus if g.uuid in uuids))  # only GPUs we locked
            live = directory.live()
            for problem in directory.problems:
                say_once(problem, log)
            # a holder's tree only tells which listed process is whose: not read where none is listed
            listed = any(g.processes for g in seen.gpus)
            counted = [lease for lease in live if not exclude(lease)]
            trees = [_holder_tree(lease) if listed else frozenset() for lease in counted]
            others = [placement.Leased(lease, tree, tuple(mine)) for lease, tree in zip(counted, trees)]
            decision = decide(seen, others)
            if isinstance(decision, Blocked):
                return decision
            refused = admit(decision, seen, live, directory) if admit is not None else None
            if refused is not None:
                return refused
            return Claim(_take(directory, seen, decision, request, job, name, spool), decision.gpus)
    except LeaseDirProblem as exc:
        say_once(str(exc), log)
    seen = look()
    decision = decide(seen, ()) if mode_of(seen) == GPUS else _no_gpus(seen)
    return decision if isinstance(decision, Blocked) else Claim([], decision.gpus)


def record_usage(leases: Iterable[Held], log: Callable[[str], None]) -> None:
    """The GPU-hours these leases held, added to this user's recent usage beside the leases (whose
    ties it breaks when several users wait: turns.py). A shared lease counts its part of its GPU's hours."""
    now = time.time()
    hours = sum(max(0.0, now - held.lease.since) * held.share for held in leases) / 3600.0
    if not hours:
        return
    try:
        # a problem with the policy file is said once per process, as everywhere it is read
        LeaseDir.open().add_usage(hours, now, policy.load(lambda line: say_once(line, log)).half_life)
    except (LeaseDirProblem, OSError) as exc:
        log(f"recent GPU usage not recorded: {exc}")


def _no_gpus(seen: GpuLook) -> Blocked:
    if mode_of(seen) == placement.CPU_ONLY:
        return Blocked(f"no GPU to lease here: {seen.problem or 'none found'}", forever=True)
    return placement.unreadable(seen)


def _holder_tree(lease: Lease) -> frozenset[int]:
    """A lease holder's pid and descendants, if that pid is still the process that took the lease."""
    if lease.pid_start and not procs.is_same_process(lease.pid, lease.pid_start, None):
        return frozenset()
    return frozenset(gpus.tree_pids([lease.pid]))


def _take(
    directory: LeaseDir,
    seen: GpuLook,
    decision: Placement,
    request: Request,
    job: Optional[int],
    name: str,
    spool: Optional[str],
) -> list[Held]:
    """A lease per GPU of the decision; none at all if one cannot be written (LeaseDirProblem)."""
    by_index = {g.index: g for g in seen.gpus}
    held: list[Held] = []
    try:
        for index in decision.gpus:
            gpu = by_index[index]
            mem = None if gpu.exclusive else request.gpu_mem_mib  # one process at a time: it is had whole
            held.append(directory.take(gpu.uuid, index, mem, job=job, name=name, spool=spool))
            held[-1].share = min(1.0, mem / max(1, gpu.memory_total_mib)) if mem else 1.0
    except LeaseDirProblem:
        for lease in held:
            lease.release()
        raise
    return held
