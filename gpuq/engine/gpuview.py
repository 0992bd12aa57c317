"""The GPUs as `gpuq status` and `gpuq gpus` show them: each GPU with its memory, the gpuq jobs that
hold it and the processes of others that use it. The worker writes its last view into the spool
(workers/gpus-PID.json) whenever it looks, so that `gpuq status` need not wake NVML itself; only
without such a file does a command look at the GPUs."""

from __future__ import annotations

from gpuq.system.gpu_presence import may_have_gpus

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional

    from gpuq.spool import Spool
    from gpuq.system.gpus import GpuLook

# system/gpus.py is imported where a look is taken or shown: on a machine without GPUs, `gpuq
# status` needs neither.


def view(look: GpuLook, running: list[dict[str, Any]]) -> dict[str, Any]:
    """{"at", "source", "problem", "gpus": [...]}: per GPU its index, name, uuid, memory, the ids of
    the gpuq jobs holding it, and every other process on it (pid, MiB, who)."""
    from gpuq.system import gpus as gpu_info

    own: set[int] = set()
    holders: dict[int, list[int]] = {}
    pids = [job["pid"] for job in running if job.get("pid")]
    if pids and look.gpus:
        own = gpu_info.tree_pids(pids)
    for job in running:
        for index in job.get("gpus") or []:
            holders.setdefault(index, []).append(job["id"])
    shown = []
    for gpu in look.gpus:
        foreign = [p for p in gpu.processes if p.pid not in own]
        shown.append(
            {
                "index": gpu.index,
                "name": gpu.name,
                "uuid": gpu.uuid,
                "memory_total_mib": gpu.memory_total_mib,
                "memory_used_mib": gpu.memory_used_mib,
                "jobs": sorted(holders.get(gpu.index, [])),
                "foreign": [
                    {"pid": p.pid, "used_memory_mib": p.used_memory_mib, "who": gpu_info.describe_pid(p.pid)}
                    for p in foreign
                ],
            }
        )
    return {"at": look.at, "source": look.source, "problem": look.problem, "gpus": shown}


def current(
    spool: Spool, running: list[dict[str, Any]], views: Optional[list[dict[str, Any]]] = None
) -> Optional[dict[str, Any]]:
    """What the workers last saw of the GPUs (the newest view; `views` if already read), else a
    look of our own. None on a machine without GPUs (and no simulated ones)."""
    views = [v for v in (spool.workers.gpu_views() if views is None else views) if isinstance(v.get("gpus"), list)]
    if views:
        newest = max(views, key=lambda v: v.get("at") or 0)
        return None if _none(newest.get("gpus"), newest.get("source"), newest.get("problem")) else newest
    if not may_have_gpus():  # what a look would say here: no driver, no GPUs
        return None
    from gpuq.system import gpus as gpu_info

    look = gpu_info.look()
    return None if _none(look.gpus, look.source, look.problem) else view(look, running)


def _none(gpus: Any, source: Any, problem: Any) -> bool:
    """No GPUs here, benignly (no driver, or none installed): nothing to show."""
    return not gpus and (source == "none" or problem is None)


def never_fits(spool: Spool, count: int, mem_mib: Optional[int]) -> Optional[str]:
    """Why a job asking for `count` GPUs (with `mem_mib` on each) can never run on this machine,
    or None. Only a request beyond one whole GPU needs the GPUs looked at; on a machine without
    GPUs every job runs in a slot, as gpuq always did."""
    if count <= 1 and mem_mib is None:
        return None
    shown = current(spool, [])
    if shown is None or not shown["gpus"]:
        return None
    totals = sorted((g["memory_total_mib"] for g in shown["gpus"]), reverse=True)
    if count > len(totals):
        return f"needs {count} GPUs; this machine has {len(totals)}"
    if mem_mib is not None and totals[count - 1] < mem_mib:
        from gpuq.system.gpus import mib_text

        largest = mib_text(totals[0])
        return f"needs {mib_text(mem_mib)} on each GPU; the largest here has {largest}"
    return None
