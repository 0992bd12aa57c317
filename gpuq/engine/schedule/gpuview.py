"""The GPUs as `gpuq status` and `gpuq gpus` show them. The worker writes its view into the spool
whenever it looks, so that `gpuq status` need not wake NVML itself; a command looks for itself only
when no view is younger than STALE_SECONDS. system/gpus.py (which brings pathlib) is imported only
where GPUs are looked at or shown: a `status` without GPUs never needs it.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from gpuq.core.errors import Refused
from gpuq.core.job import Job
from gpuq.core.states import PENDING
from gpuq.core.times import iso_of
from gpuq.core.words import cap_text, memory_too_small
from gpuq.spool import Spool
from gpuq.system import procs
from gpuq.system.gpu_presence import may_have_gpus

STALE_SECONDS = 3.0  # a view older than this is looked at again (a waiting job makes the worker look every 2 s)


def view(
    look: Any, running: list[Job], home: str, starting: Optional[Mapping[int, Sequence[int]]] = None
) -> dict[str, Any]:
    """{"at", "source", "problem", "gpus": [...]} of a system/gpus.GpuLook seen from the spool at
    `home`: per GPU the gpuq jobs holding it (`running`, and `starting`: job id -> GPUs), every other
    process on it and `foreign_mib`, the memory held by others (placement's "outside")."""
    from gpuq.system import gpus as gpu_info  # the GPUs are shown

    pids = [job.pid for job in running if job.pid]
    # psutil is imported only to tell processes apart, where there are some
    own = gpu_info.tree_pids(pids) if pids and any(gpu.processes for gpu in look.gpus) else set()
    held = {job_id: list(gpus or ()) for job_id, gpus in (starting or {}).items()}
    held.update((job.id, job.gpus or []) for job in running)
    shown = []
    for gpu in look.gpus:
        foreign = [p for p in gpu.processes if p.pid not in own]
        unexplained = max(0, gpu.memory_used_mib - sum(p.used_memory_mib or 0 for p in gpu.processes))
        # each field of the GPU but its processes (`utilization_gpu`: what `gpuq top` shows, None: not known)
        entry = {key: value for key, value in gpu._asdict().items() if key != "processes"}
        entry["jobs"] = sorted(job_id for job_id, indices in held.items() if gpu.index in indices)
        entry["foreign"] = [
            {"pid": p.pid, "used_memory_mib": p.used_memory_mib, "who": gpu_info.describe_pid(p.pid)} for p in foreign
        ]
        entry["foreign_mib"] = sum(p.used_memory_mib or 0 for p in foreign) + unexplained
        shown.append(entry)
    out = {"at": look.at, "source": look.source, "problem": look.problem, "gpus": shown}
    return add_leases(out, home) if shown else out


def add_leases(shown: dict[str, Any], home: str) -> dict[str, Any]:
    """`shown` with the leases live now, as the spool at `home` tells them (`this_queue`: of its own
    jobs; a job of another spool of this user's says so): per GPU `leases` and the waiting `tickets`
    that want it, each `foreign` process's `lease` (the lease whose holder's tree it is in, or None),
    `lease_problems`, and `max_gpus`, this user's cap in the machine's policy (None: none)."""
    from gpuq.system import gpus, leases  # the GPUs are shown, with their leases

    problems: list[str] = []  # a policy file that is not sound is said here too, as the worker says it
    shown["max_gpus"] = my_cap(problems.append)
    live: list[Any] = []
    waiting: list[Any] = []
    try:
        # A view never creates a GPUQ_LEASE_DIR that is missing: whoever creates it owns it.
        if os.path.lexists(leases.default_dir()):
            directory = leases.LeaseDir.open()
            live = directory.live()
            waiting = directory.tickets()  # adds its problems to live()'s
            problems += directory.problems
    except leases.LeaseDirProblem as exc:
        problems.append(str(exc))
    viewer, mine = os.geteuid(), leases.spool_ids(home, Spool(home).lease_id.read())
    tree = functools.cache(lambda pid: gpus.tree_pids([pid]))  # a holder's process tree, looked up once
    for gpu in shown["gpus"]:
        here = [lease for lease in live if lease.gpu_uuid == gpu["uuid"]]
        gpu["leases"] = [lease_entry(lease, viewer, mine) for lease in here]
        gpu["tickets"] = [ticket_entry(t, viewer, mine) for t in waiting if t.wants(gpu["uuid"])]
        for proc in gpu["foreign"]:
            proc["lease"] = next((lease.file for lease in here if proc["pid"] in tree(lease.pid)), None)
    shown["lease_problems"] = problems
    return shown


def my_cap(say: Callable[[str], None]) -> Optional[int]:
    """This user's cap in the machine's policy as its file says now (None: none); `say` is told why a
    file is ignored."""
    from gpuq.system import lease_io, policy  # the policy's cap on GPUs (tomllib)

    return policy.load(say).of(lease_io.user_name(os.geteuid())).max_gpus


# What views show of a ticket and of a lease, in this order (`gpuq gpus --json`).
TICKET_KEYS = ("file", "who", "user", "uid", "job", "gpus", "mem_mib", "since", "spool", "host")
LEASE_KEYS = ("file", "who", "user", "uid", "job", "name", "whole", "mem_mib", "since", "pid", "spool", "host")


def ticket_entry(ticket: Any, viewer_uid: int, mine: Sequence[str]) -> dict[str, Any]:
    """A system/leases.Ticket as views show it: whose job waits, for what, since when; `mine`: the
    viewer's spool_ids."""
    shown = {key: getattr(ticket, key) for key in TICKET_KEYS}
    ours = ticket.spool is not None and ticket.spool in mine
    return dict(shown, who=ticket.who(viewer_uid, mine), since=iso_of(ticket.since), this_queue=ours)


def lease_entry(lease: Any, viewer_uid: int, mine: Sequence[str]) -> dict[str, Any]:
    """A system/leases.Lease as views show it (a name only for a `gpuq lease`: a job's is not in it)."""
    shown = {key: getattr(lease, key) for key in LEASE_KEYS}
    ours = lease.spool is not None and lease.spool in mine
    who, name = lease.who(viewer_uid, mine), lease.name if lease.job is None else None
    return dict(shown, who=who, name=name, since=iso_of(lease.since), this_queue=ours)


def current(
    spool: Spool,
    running: list[Job],
    views: Optional[list[dict[str, Any]]] = None,
    stale_after: Optional[float] = STALE_SECONDS,
) -> Optional[dict[str, Any]]:
    """The newest view the workers wrote (`views` if already read), unless older than `stale_after`
    seconds (None: any age): then a look of our own. None on a machine without GPUs."""
    views = [v for v in (spool.workers.gpu_views() if views is None else views) if isinstance(v.get("gpus"), list)]
    newest = max(views, key=lambda v: v.get("at") or 0) if views else None
    if newest is not None and (stale_after is None or time.time() - (newest.get("at") or 0) <= stale_after):
        if _none(newest.get("gpus"), newest.get("source"), newest.get("problem")):
            return None
        return _without_ended(spool, newest, running)
    if not may_have_gpus():  # what a look would say here: no driver, no GPUs
        return None
    from gpuq.system import gpus as gpu_info  # the GPUs are looked at

    look = gpu_info.look()
    if _none(look.gpus, look.source, look.problem):
        return None
    # A job in running/ whose process has ended holds no GPU, though nothing recorded its end yet (no
    # worker; an adopted job). A pid that is gone is told without psutil; a job not started has none.
    holding = [job for job in running if not job.pid or (procs.pid_alive(job.pid) and procs.job_alive(job))]
    shown = view(look, holding, spool.home)
    if newest is not None and "foreign_threshold_mib" in newest:  # the gate the worker applies
        shown["foreign_threshold_mib"] = newest["foreign_threshold_mib"]
    return shown


def _without_ended(spool: Spool, shown: dict[str, Any], running: list[Job]) -> dict[str, Any]:
    """A worker's view less the jobs that ended since it was written, and their leases (`gpuq cancel`
    returns before the worker's next view)."""
    live = {job.id for job in running}
    listed = {j for gpu in shown["gpus"] if isinstance(gpu, dict) for j in gpu.get("jobs") or ()}
    ended = {j for j in listed - live if isinstance(j, int) and spool.jobs.find(j, (PENDING,)) is None}
    if not ended:
        return shown
    gpus = []
    for gpu in shown["gpus"]:
        gpu = dict(gpu, jobs=[j for j in gpu.get("jobs") or () if j not in ended])
        if isinstance(gpu.get("leases"), list):
            gpu["leases"] = [
                lease for lease in gpu["leases"] if not (of_this_queue(lease, spool.home) and lease.get("job") in ended)
            ]
        gpus.append(gpu)
    return dict(shown, gpus=gpus)


def of_this_queue(lease: Any, home: Optional[str]) -> bool:
    """Whether a lease or ticket of a view is of the jobs of the spool at `home` (an older worker's view
    names its spool by its path)."""
    return isinstance(lease, dict) and bool(lease.get("this_queue", lease.get("spool") == home))


def listed(shown: Optional[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """`gpuq gpus --json`: one object per GPU, with when and by whom (a worker's pid, or null) it was seen.
    Refused when the look failed (a script must not take that for a machine without GPUs)."""
    if shown is None:
        return []
    if failed(shown):
        raise Refused(f"the GPUs could not be read: {shown['problem']}")
    at = shown.get("at")
    when = {"seen_at": iso_of(at) if at else None, "seen_seconds_ago": round(max(0.0, now - at), 1) if at else None}
    extra = dict(when, seen_by_worker=shown.get("worker"), lease_problems=shown.get("lease_problems", []))
    return [dict(gpu, **extra) for gpu in shown["gpus"]]


def failed(shown: dict[str, Any]) -> bool:
    """Whether a view of `current` is a failed look: no GPUs, and a problem (else it is None)."""
    return not shown["gpus"]


def _none(gpus: Any, source: Any, problem: Any) -> bool:
    return not gpus and (source == "none" or problem is None)


def never_fits(
    spool: Spool, count: int, mem_mib: Optional[int], views: Optional[list[dict[str, Any]]] = None
) -> Optional[str]:
    """Why a job asking for `count` GPUs (`mem_mib` on each) can never run on this machine, or
    under its user's cap in the machine's policy while that stays (`add` refuses it), or None."""
    if count <= 1 and mem_mib is None:
        return None
    shown = current(spool, [], views, stale_after=None)  # the totals, which do not change, and the cap
    if shown is None or not shown["gpus"]:
        return None
    totals = [(g["index"], g["memory_total_mib"]) for g in shown["gpus"]]
    never = ": this job could never start"
    if count > len(totals):
        return f"needs {count} GPUs; this machine has {len(totals)}{never}"
    too_small = memory_too_small(mem_mib, max(count, 1), totals) if mem_mib is not None else None
    if too_small:  # worded as the worker's reason for the job that waits: the GPU that bounds it named
        return too_small + never
    cap = my_cap(lambda _line: None)  # as the file is now: a worker's view may be hours old, and root's edit after it
    if cap is not None and count > cap:
        return f"{cap_text(cap, count)}, set by the machine's policy: this job could not start unless that changes"
    return None
