#!/usr/bin/env python3
"""`gpuq top`'s start (issue 29, bench/PROFILE.md section 9): curses against Textual, and launch
-> first frame.

    python bench/top_start.py [--textual-python /tmp/tx/bin/python] [--rounds 21]

In one spool with two simulated GPUs, three pending jobs and no worker, each round takes, in an
order that rotates: the import of `curses` and of `textual.app` (a fresh interpreter each, measured
inside it; Textual from the interpreter given, a scratch venv outside the repository, since gpuq
does not depend on it), `python -c pass` and `gpuq top --once` run to their end, and `gpuq top` in
a pseudo-terminal from launch to the first frame on it (then `q`). Medians, milliseconds; the
target is launch -> first frame well under a second (TARGET_MS). Exits 1 if the median misses it.
CPU time (user + system) is given beside wall time where it can be told apart: a loaded machine
inflates it less.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import resource
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from common import md_table, median, ms

TARGET_MS = 500.0  # launch -> first frame, median
IMPORT = (
    "import time; t, c = time.perf_counter(), time.process_time(); import {module}; "
    "print(time.perf_counter() - t, time.process_time() - c)"
)
GPUS = {
    "gpus": [
        {
            "index": i,
            "name": "Fake H100",
            "uuid": f"GPU-bench-{i}",
            "memory_total_mib": 81559,
            "memory_used_mib": 0,
            "utilization_gpu": 50,
            "processes": [],
        }
        for i in range(2)
    ]
}


def import_seconds(python: str, module: str) -> tuple[float, float]:
    """Wall and CPU seconds of the import, inside a fresh interpreter."""
    out = subprocess.run([python, "-c", IMPORT.format(module=module)], capture_output=True, text=True, check=True)
    wall, cpu = map(float, out.stdout.split())
    return wall, cpu


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def once_seconds(env: dict[str, str], cwd: Path, argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of this interpreter run with `argv` to its end."""
    cpu, start = children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True, check=True)
    return time.perf_counter() - start, children_cpu() - cpu


def first_frame_seconds(env: dict[str, str], cwd: Path) -> tuple[float, None]:
    """Launch -> the title line of the first frame read from the terminal `gpuq top` draws on."""
    master, slave = pty.openpty()
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuq", "top"],
        env=dict(env, TERM="xterm", LINES="30", COLUMNS="100"),
        cwd=cwd,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    seen, took = b"", None
    try:
        while took is None and time.perf_counter() - start < 30:
            if select.select([master], [], [], 1.0)[0]:
                seen += os.read(master, 65536)
                if b"gpuq top" in seen and b"help" in seen:
                    took = time.perf_counter() - start
        os.write(master, b"q")
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    if took is None:
        raise SystemExit(f"no frame within 30 s; the terminal showed: {seen[-500:]!r}")
    return took, None  # its CPU would count the `q` too


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--textual-python", default="/tmp/tx/bin/python", help="an interpreter with textual")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuq-top-bench-") as tmp:
        work = Path(tmp)
        (work / "gpus.json").write_text(json.dumps(GPUS))
        env = dict(os.environ, GPUQ_HOME=str(work / "spool"), GPUQ_FAKE_GPUS=str(work / "gpus.json"))
        env["GPUQ_LEASE_DIR"] = str(work / "leases")
        for n in range(3):
            argv = [sys.executable, "-m", "gpuq", "add", "-q", "--name", f"job{n}", "true"]
            subprocess.run(argv, env=env, check=True, capture_output=True)
        takes = {
            "python -c pass": lambda: once_seconds(env, work, ["-c", "pass"]),
            "import curses": lambda: import_seconds(sys.executable, "curses"),
            "import textual.app": lambda: import_seconds(args.textual_python, "textual.app"),
            "gpuq top --once, to its end": lambda: once_seconds(env, work, ["-m", "gpuq", "top", "--once"]),
            "gpuq top, launch -> first frame": lambda: first_frame_seconds(env, work),
        }
        samples: dict[str, list[tuple[float, Optional[float]]]] = {name: [] for name in takes}
        names = list(takes)
        for round_ in range(args.rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                samples[name].append(takes[name]())
    rows = []
    for name, pairs in samples.items():
        walls, cpus = [w for w, _c in pairs], [c for _w, c in pairs if c is not None]
        rows.append([name, ms(median(walls)), ms(median(cpus)), ms(min(walls)), ms(max(walls))])
    print("\n".join(md_table(["", "wall ms, median", "CPU ms, median", "wall min", "wall max"], rows)))
    frame = (median([w for w, _c in samples["gpuq top, launch -> first frame"]]) or 0) * 1000
    print(f"\nlaunch -> first frame: {frame:.0f} ms median (target: under {TARGET_MS:.0f} ms)")
    return 0 if frame < TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
