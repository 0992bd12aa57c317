"""What a job handed to Ray asks Ray for, and the larger share an out-of-memory failure there gets:
core/oom.py's rule in Ray's terms.

- A `--gpu-mem` share is a fraction of the cluster's smallest GPU, rounded up, so that it fits
  whichever GPU Ray picks (Ray does not divide a GPU's memory; the fraction only keeps it from
  stacking more shares than fit). Sizes: the dashboard's, else this machine's (the head), else a
  share is a whole GPU.
- A whole-GPU job retried on the largest GPUs asks for their node type (`accelerator_type:NAME`)
  where the cluster's GPUs differ in size.
- `--mem` is `entrypoint_memory`, reserved but not enforced by Ray: an attempt ran out of host
  memory when its log says so or SIGKILL gpuq did not send ended it (the OOM killer, likely); it
  gets twice its `--mem`, up to the largest live node's memory.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

from gpuq.core import failure, oom
from gpuq.core.job import Job
from gpuq.engine.schedule import gpuview
from gpuq.spool import Spool
from gpuq.system import rayjobs as client

MIB = 1 << 20
HOST_REASONS = ("out of CPU memory",)  # core/failure.py's reason for PyTorch's CPU allocator
GRAIN = 10_000  # Ray keeps fractional resources to four decimals
TYPE_PREFIX = "accelerator_type:"


class Room(NamedTuple):
    """What the cluster has, as far as gpuq can tell."""

    gpu_mib: list[int]  # every GPU's memory (empty: unknown)
    largest_type: Optional[str]  # the `accelerator_type:` resource of the largest GPUs, where sizes differ
    node_mem_mib: Optional[int]  # the largest live node's memory


def look(spool: Spool, address: str) -> Room:
    """The cluster's GPU sizes and largest node (two requests; made only for the jobs that need them)."""
    nodes = [node for node in client.nodes(address) if node.alive]
    mem = max((int(node.total.get("memory", 0)) // MIB for node in nodes), default=0) or None
    try:
        by_node = client.gpu_memory(address)
    except client.RayError:
        by_node = {}  # the dashboard's summary is not a stable API: sizes unknown, as without NVML
    if not by_node:  # this machine's GPUs, as `gpuq add` checks a share against them (the workers' view)
        here = gpuview.current(spool, [], stale_after=None)
        return Room([gpu["memory_total_mib"] for gpu in (here or {}).get("gpus") or []], None, mem)
    sizes = [size for node_sizes in by_node.values() for size in node_sizes]
    largest_type = None
    if min(sizes) < max(sizes):
        for node in nodes:
            if max(by_node.get(node.node_id, [0])) == max(sizes):
                largest_type = next((name for name in node.total if name.startswith(TYPE_PREFIX)), None)
                break
    return Room(sizes, largest_type, mem)


def needs_look(job: Job) -> bool:
    return bool(job.gpu_request and (job.gpu_mem_mib is not None or job.gpu_largest))


def num_gpus(job: Job, room: Optional[Room]) -> float:
    """`entrypoint_num_gpus`: the share as a fraction of the smallest GPU, else its GPUs."""
    gpus = float(job.gpu_request or 0)
    if job.gpu_mem_mib is None or gpus != 1 or room is None or not room.gpu_mib:
        return gpus
    return min(1.0, math.ceil(job.gpu_mem_mib * GRAIN / min(room.gpu_mib)) / GRAIN)


def resources(job: Job, room: Optional[Room]) -> Optional[dict[str, float]]:
    """`entrypoint_resources`: the node type with the largest GPUs, for a job retried there."""
    if job.gpu_largest and job.gpu_mem_mib is None and room is not None and room.largest_type:
        return {room.largest_type: 0.001}  # a sliver of the node's one unit: any number of jobs fit
    return None


def host_oom(reason: Optional[str]) -> bool:
    return bool(reason) and (str(reason).startswith(HOST_REASONS) or failure.OOM_KILLER_HINT in str(reason))


def growth(spool: Spool, job: Job, reason: Optional[str], address: str) -> Optional[oom.Growth]:
    """The larger share after an out-of-memory failure on Ray (core/oom.py's rule), or None."""
    host = oom.size_text(job.mem_mib) if job.mem_mib and host_oom(reason) else None
    if host is None and not (oom.gpu_oom(reason) and job.gpu_request):
        return None
    room = look(spool, address)
    # Sizes unknown: a share was sent as a whole GPU, so doubling it is a whole GPU.
    largest = max(room.gpu_mib) if room.gpu_mib else job.gpu_mem_mib
    return oom.grow(job, reason, host, largest, room.node_mem_mib)
