#!/usr/bin/env python3
"""The CPU a spare supervisor costs: a new `python -S` that imports the supervisor, against a fork
of a process that has imported it (the zygote's way, run/zygote.py). Each child's own CPU from
wait4's rusage, medians.

    python bench/spare_cost.py [CHECKOUT ...]   (default: this one)

The child of a fork here only calls setsid() and exits: what it costs beyond that (setting room
aside, waiting for its order) is the same for both kinds of spare.
"""

from __future__ import annotations

import gc
import importlib
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROUNDS = 15


def _module(root: str) -> str:
    """The supervisor's module in that checkout (a package since issue 25, a module before)."""
    return (
        "gpuq.run.supervisor.main"
        if os.path.isdir(os.path.join(root, "gpuq/run/supervisor"))
        else "gpuq.run.supervisor"
    )


def _cpu_ms(pid: int) -> float:
    _pid, _status, usage = os.wait4(pid, 0)
    return (usage.ru_utime + usage.ru_stime) * 1000


def new_interpreters(root: str) -> list[float]:
    path = [root] + [p for p in sys.path if p and p != root]
    boot = f"import sys; sys.path[:0] = sys.argv[1:]; import psutil, {_module(root)}"
    return [_cpu_ms(subprocess.Popen([sys.executable, "-S", "-c", boot, *path]).pid) for _ in range(ROUNDS)]


def forks(root: str) -> list[float]:
    """In a child of ours, so that the checkout's modules are imported fresh."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        sys.path[:0] = [root]
        importlib.import_module("psutil")
        importlib.import_module(_module(root))
        for part in ("control", "journal", "logs", "reports"):
            importlib.import_module(f"gpuq.spool.{part}")
        gc.freeze()
        costs = []
        for _ in range(ROUNDS):
            child = os.fork()
            if child == 0:
                os.setsid()
                os._exit(0)
            costs.append(_cpu_ms(child))
        os.write(write, " ".join(map(str, costs)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        costs = [float(v) for v in fh.read().split()]
    os.waitpid(pid, 0)
    return costs


def main() -> int:
    roots = sys.argv[1:] or [str(Path(__file__).resolve().parent.parent)]
    for root in roots:
        fresh, forked = statistics.median(new_interpreters(root)), statistics.median(forks(root))
        print(f"{root}: new interpreter {fresh:.1f} ms CPU, fork {forked:.2f} ms CPU (medians of {ROUNDS})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
