"""`gpuq run --mem SIZE --cpus N`: what a worker lets jobs reserve of the machine in all (issue 31;
engine/schedule/hostroom.py). Here rather than in cli/commands.py, which is at its size limit."""

from __future__ import annotations

from gpuq.cli.options import Opt
from gpuq.core.timespec import parse_size_mib


def cpu_total(text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{flag}: expected a number of CPUs (1 or more), got {text!r}")
    return int(text)


RUN_OPTIONS = (
    Opt(
        "--mem",
        metavar="SIZE",
        setting="host_mem_mib",
        read=parse_size_mib,
        help="host memory jobs may reserve in all with `add --mem` (default: the machine's, less GPUQ_HOST_MEM_MARGIN)",
    ),
    Opt(
        "--cpus",
        metavar="N",
        setting="host_cpus",
        read=cpu_total,
        help="CPUs jobs may reserve in all with `add --cpus` (default: those the worker may run on)",
    ),
)
