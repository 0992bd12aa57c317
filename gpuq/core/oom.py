"""Out-of-memory retries with more room: an attempt that died of CUDA out-of-memory, or at its
`--mem` reservation, goes back with a larger share (as Flyte, Nextflow and Cromwell retry), since the
same request would die again at the same allocation: a `--gpu-mem` share doubles up to a whole GPU, a
whole-GPU job goes to the GPUs with the most memory, `--mem` doubles up to the worker's cap. The next
attempt finds `GPUQ_OOM_RETRY=k` in its environment (a script may shrink its batch) and continues
from its newest checkpoint. Pure decisions: the caller (run/supervisor/end.py) knows the sizes.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from gpuq.core.job import Job
from gpuq.core.words import size_text

ENV = "GPUQ_OOM_RETRY"
GPU_REASONS = ("CUDA out of memory", "GPU out of memory")  # core/failure.py's reasons for a GPU's


class Growth(NamedTuple):
    """What the next attempt gets: the job fields that change, and the words for it (`40G`)."""

    changes: dict[str, Any]
    text: str


def gpu_oom(reason: Optional[str]) -> bool:
    return bool(reason) and str(reason).startswith(GPU_REASONS)


def grow(
    job: Job, reason: Optional[str], host_memory: Optional[str], largest_gpu_mib: Optional[int], cap_mib: Optional[int]
) -> Optional[Growth]:
    """The larger share after an out-of-memory failure, or None: not an out-of-memory failure, or
    there is no more room to give (a whole GPU already the largest is still given again: the
    script can shrink its batch on GPUQ_OOM_RETRY). `host_memory`: the --mem limit it reached."""
    if host_memory is not None and job.mem_mib:
        if cap_mib is None or cap_mib <= job.mem_mib:
            return None
        mem = min(cap_mib, job.mem_mib * 2)
        return Growth({"mem_mib": mem}, f"{size_text(mem)} host memory")
    if not gpu_oom(reason) or not job.gpu_request:
        return None
    if job.gpu_mem_mib is not None:
        doubled = job.gpu_mem_mib * 2
        if largest_gpu_mib is None or doubled < largest_gpu_mib:
            return Growth({"gpu_mem_mib": doubled}, size_text(doubled))
        return Growth({"gpu_mem_mib": None}, "a whole GPU")
    where = f" ({size_text(largest_gpu_mib)})" if largest_gpu_mib else ""
    return Growth({"gpu_largest": True}, f"the GPU with the most memory{where}")


def retries_this_round(job: Job) -> int:
    """Out-of-memory retries among the attempts since it was queued, retried or recovered (its
    `attempts` count; their history entries say `change`). `oom_retries` counts them all, as
    GPUQ_OOM_RETRY does: the share a person's `gpuq retry` keeps is still the grown one."""
    earlier = job.history[-(job.attempts - 1) :] if job.attempts > 1 else []
    return sum(1 for entry in earlier if entry.get("change"))


def extra_attempts(job: Job) -> int:
    """The attempts --retry-oom paid for: they do not count against --retries."""
    return min(retries_this_round(job), job.retry_oom)


def retry_left(job: Job) -> bool:
    """Whether the attempt that has just ended (job.attempts of them) may be followed by an
    out-of-memory retry: --retry-oom has some left, or --retries has."""
    return retries_this_round(job) < job.retry_oom or job.attempts - extra_attempts(job) <= job.retries


def retry(job: Job, growth: Growth) -> dict[str, Any]:
    """The changes that send the job back with `growth`: its larger share and the retry's count."""
    return {**growth.changes, "oom_retries": job.oom_retries + 1}


def note(growth: Growth) -> str:
    return f"retrying after out-of-memory with {growth.text}"


def would_get(growth: Growth) -> str:
    """What a failed job's reason adds when no retry is left."""
    return f"with a retry left (--retry-oom N) it would have been retried with {growth.text}"
