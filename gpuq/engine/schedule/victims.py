"""Which running job an urgent job may preempt: one that can go on afterwards (`--preemptible`, or a
complete checkpoint of its own); preempting any other throws its whole run away, so only
`--urgent=force` does. Among those that can, the one that throws away the least work since its
newest checkpoint.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

from gpuq.core.job import Job
from gpuq.core.states import URGENT_FORCE
from gpuq.core.times import parse_iso
from gpuq.engine.schedule.scheduler import victim_key
from gpuq.engine.tracking import checkpoints

WHOLE_GPU_MIB = 81920  # a whole GPU's share where the GPUs' sizes are not at hand
NO_VICTIM = "no running job can be preempted without losing its progress (`--urgent=force` takes one anyway)"


def no_victim(urgent: Job, running: list[Job]) -> str:
    """Why an urgent job that a preemption would serve preempts none of `running`: what only
    `--urgent=force` may take, else what no urgent job ever takes (an adopted or urgent job)."""
    if urgent.urgent != URGENT_FORCE and any(j.pid and not (j.urgent or j.adopted) for j in running):
        return NO_VICTIM
    never = [f"#{j.id} is {'adopted (started outside gpuq)' if j.adopted else 'urgent'}" for j in running]
    never = [text for text, j in zip(never, running) if j.adopted or j.urgent]
    if never and len(never) == len(running):
        return f"{', '.join(never)}: never preempted"
    return "no running job can be preempted yet (one is starting, or preempted for an urgent job ahead)"


def how_it_continues(job: Job) -> Optional[str]:
    """How a running job would go on after a preemption ("from checkpoint-400", ...), or None when
    it would start over."""
    if job.no_resume:
        return None
    found = checkpoints.latest_checkpoint(job)
    if found is not None:
        return f"from {os.path.basename(found.path.rstrip('/'))}"
    if job.preemptible:
        return "from the checkpoint it saves when preempted (--preemptible)"
    return None


def in_preference(candidates: list[Job], urgent: Job, whole_mib: int = WHOLE_GPU_MIB) -> list[Job]:
    """Those that can continue, the lowest priority first and, among equals, the one whose
    preemption throws away the least work (`lost_work`), then in the order given; for an
    `--urgent=force` job, then the others."""
    able: list[Job] = []
    others: list[Job] = []
    for job in candidates:
        (able if how_it_continues(job) else others).append(job)
    now = time.time()
    able.sort(key=lambda job: (job.priority, lost_work(job, now, whole_mib)))
    return able + others if urgent.urgent == URGENT_FORCE else able


def lost_work(job: Job, now: float, whole_mib: int = WHOLE_GPU_MIB) -> float:
    """What preempting a running job now throws away, in MiB-seconds of GPU: the time its attempt
    has run since its newest complete checkpoint, times its share (`whole_mib` for each whole GPU).
    A --preemptible job saves when it is stopped: nothing."""
    if job.preemptible:
        return 0.0
    found = checkpoints.latest_checkpoint(job)
    since = max(checkpoints.written_at(found.path) if found else 0.0, parse_iso(job.started_at) or 0.0)
    share = job.gpu_mem_mib if job.gpu_mem_mib is not None else max(1, job.gpu_request) * whole_mib
    return max(0.0, now - since) * share


def candidates(urgent: Job, running: list[Job]) -> list[Job]:
    """The running jobs `urgent` may preempt, lowest priority (then started last) first; where jobs
    hold GPUs only GPU jobs, for a GPU job (the CPU lane is not made room in)."""
    found = [j for j in running if j.pid and not j.urgent and not j.adopted]
    if any(j.gpus is not None for j in found):
        found = [j for j in found if j.gpus] if urgent.gpu_request != 0 else []
    return sorted(found, key=victim_key)


def foreseen(urgent: Job, running: list[Job]) -> str:
    """What `gpuq add --urgent` says will happen if no slot is free: whom the worker would preempt."""
    choices = candidates(urgent, running)
    if not choices:
        # an adopted job has no supervisor of gpuq's to save and stop it, and was not started by gpuq
        adopted = [job for job in running if job.adopted]
        named = ", ".join(f"#{job.id} {job.name}" for job in adopted)
        whose = f": {named} {'is' if len(adopted) == 1 else 'are'} adopted, not gpuq's to preempt" if adopted else ""
        return f"urgent: first in line (nothing running that it could preempt{whose})"
    chosen = next(iter(in_preference(choices, urgent)), None)
    if chosen is None:
        first = choices[0]  # a --no-resume job may have checkpoints, but never continues from them
        why = "does not resume (--no-resume)" if first.no_resume else "has no checkpoint and is not --preemptible"
        return (
            f"urgent: first in line; {NO_VICTIM.split(' (')[0]} (#{first.id} {first.name} {why}), "
            "so it waits for a free slot; `--urgent=force` preempts one anyway"
        )
    if urgent.gpu_request and urgent.gpu_mem_mib is None:  # whole GPUs: the jobs on each GPU it empties
        emptying = _emptying(urgent, in_preference(choices, urgent), running)
        if len(emptying) > 1:
            named = ", ".join(f"#{job.id} {job.name}" for job in emptying)
            gpus = ",".join(sorted({str(g) for job in emptying for g in job.gpus or ()}))
            over = [job for job in emptying if not how_it_continues(job)]
            then = "; those that cannot resume start over (--urgent=force)" if over else ""
            return f"urgent: if no GPU is free, jobs {named} (on GPU {gpus}) are preempted and resumed after{then}"
        chosen = emptying[0] if emptying else chosen
    how = how_it_continues(chosen)
    lacks = "--no-resume" if chosen.no_resume else "no checkpoint"
    then = f"it continues {how}" if how else f"it starts over ({lacks}: --urgent=force)"
    return f"urgent: if no slot is free, job #{chosen.id} {chosen.name} is preempted and resumed after; {then}"


def _emptying(urgent: Job, preferred: list[Job], running: list[Job]) -> list[Job]:
    """The jobs the worker would preempt to empty as many whole GPUs as `urgent` asks for, or [] (GPUs
    free now are not known here)."""
    on: dict[int, set[int]] = {}
    for job in running:
        for gpu in job.gpus or ():
            on.setdefault(gpu, set()).add(job.id)

    def empties(chosen: list[Job]) -> bool:
        ids = {job.id for job in chosen}
        return sum(1 for jobs in on.values() if jobs <= ids) >= urgent.gpu_request

    return fewest(preferred, empties)


def fewest(preferred: list[Job], enough: Callable[[list[Job]], bool]) -> list[Job]:
    """As few of `preferred` as are `enough`: the first ones until they are, then each dropped that
    is not needed; [] when all of them are not enough."""
    chosen: list[Job] = []
    for victim in preferred:
        chosen.append(victim)
        if enough(chosen):
            for job in chosen[:-1]:
                fewer = [other for other in chosen if other is not job]
                if enough(fewer):
                    chosen = fewer
            return chosen
    return []
