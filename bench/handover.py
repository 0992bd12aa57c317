#!/usr/bin/env python3
"""The hand-over between jobs, old against new, side by side (issue 15).

Runs the benchmark's own back-to-back and throughput scenarios (bench/scenarios.py) for two gpuq
trees at once, and task-spooler when it is installed, in interleaved rounds (the order rotates
every round, so a slow moment hurts every system alike), and prints medians. Each tree is copied
and compiled first (as bench/systems.snapshot_gpuq does), so edits made during the run do not leak
in, and each runs as `python -m gpuq` of this interpreter with PYTHONPATH at its copy.

    python bench/handover.py --old /work/main --new . --pairs 10 --jobs 500 --rounds 3

Besides the rates it prints the CPU the whole machine spent per job during each throughput run
(from /proc/stat: other users' work counts too, so compare old and new only within one run) and
the load average.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios  # noqa: E402
import systems  # noqa: E402
from common import BenchError  # noqa: E402


def copy_tree(source: Path, target: Path) -> Path:
    """A compiled copy of `source`/gpuq under `target`; returns the directory to put on the path."""
    shutil.copytree(source / "gpuq", target / "gpuq", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if not compileall.compile_dir(str(target / "gpuq"), quiet=1):
        raise BenchError(f"could not compile {target}")
    return target


def gpuq_at(name: str, parent: Path) -> type:
    """A Gpuq system that runs the gpuq found in `parent`."""

    class At(systems.Gpuq):
        def __init__(self, root: Path):
            super().__init__(root)
            self.name = name
            self.env.pop("PYTHONPATH", None)
            self.env["PYTHONPATH"] = str(parent)
            self.cli = [sys.executable, "-m", "gpuq"]

    At.name = name
    return At


def machine_cpu() -> float:
    """CPU seconds the whole machine has spent busy (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:8]]
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6]
    return busy / os.sysconf("SC_CLK_TCK")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", type=Path, required=True, help="checkout whose gpuq/ is 'old'")
    p.add_argument("--new", type=Path, required=True, help="checkout whose gpuq/ is 'new'")
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-tsp", action="store_true")
    p.add_argument("--dispatch", type=int, default=15, help="samples of queued -> start with an idle worker")
    p.add_argument("--idle-seconds", type=float, default=60.0)
    p.add_argument("--only", default="back_to_back,throughput", help="also: dispatch, idle")
    p.add_argument("--json", type=Path, help="write the raw samples here")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="gpuq-handover-"))
    made: dict[str, Any] = {}
    try:
        made["old"] = gpuq_at("old", copy_tree(args.old.resolve(), root / "old"))
        made["new"] = gpuq_at("new", copy_tree(args.new.resolve(), root / "new"))
        if not args.no_tsp and shutil.which("tsp"):
            made["tsp"] = systems.Tsp
        names = list(made)
        out: dict[str, Any] = {"load_start": os.getloadavg()}
        steps = args.only.split(",")
        if "back_to_back" in steps:
            sys_list = [made[n](root / f"b2b-{n}") for n in names]
            try:
                scenarios.started(sys_list)
                out["gap_ms"] = {
                    k: [v * 1000 for v in vs] for k, vs in scenarios.back_to_back(sys_list, root, args.pairs).items()
                }
            finally:
                for s in sys_list:
                    s.stop()
        if "dispatch" in steps:
            sys_list = [made[n](root / f"dispatch-{n}") for n in names]
            try:
                scenarios.started(sys_list)
                got = scenarios.dispatch(sys_list, root, args.dispatch)
                out["queued_to_start_ms"] = {k: [v * 1000 for v in d["queued"]] for k, d in got.items()}
            finally:
                for s in sys_list:
                    s.stop()
        if "idle" in steps:
            got = scenarios.idle_cost(lambda n, path: made[n](path), names, root, args.idle_seconds, 1000, 5.0)
            out["idle"] = got
        if "throughput" in steps:
            out["jobs_per_s"], out["cpu_ms_per_job"] = _throughput(made, names, root, args.jobs, args.rounds)
        out["load_end"] = os.getloadavg()
        _print(out)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _throughput(made: dict[str, Any], names: list[str], root: Path, jobs: int, rounds: int) -> tuple[dict, dict]:
    """scenarios.throughput's run, with the machine's CPU per job over the timed part."""
    rates: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in scenarios.rotated(names, r):
            system = made[name](root / f"tp-{name}-{r}")
            try:
                system.start()
                gate = system.root / "go"
                scenarios._block(system, gate)
                last = scenarios._queue_many(system, ["true"], jobs)
                systems.settle(1.0)  # as scenarios.throughput: the worker has seen the jobs
                cpu0, t0 = machine_cpu(), time.perf_counter()
                gate.touch()
                system.wait_all_done(last, jobs + 1)
                elapsed = time.perf_counter() - t0
                rates[name].append(jobs / elapsed)
                cpu[name].append((machine_cpu() - cpu0) / jobs * 1000)
            finally:
                system.stop()
    return rates, cpu


def _print(out: dict[str, Any]) -> None:
    print(f"load average at start {out['load_start']}, at end {out['load_end']}")
    for phase, rows in out.get("idle", {}).items():
        for name, row in rows.items():
            cpu, rss, procs = row["cpu_s_per_min"], row["rss_mb"], row["processes"]
            print(f"idle {phase:7} {name:16} {cpu:.3f} CPU-s/min  {rss:.1f} MB  {procs} processes")
    units = (("gap_ms", "ms"), ("queued_to_start_ms", "ms"), ("jobs_per_s", "jobs/s"), ("cpu_ms_per_job", "ms CPU/job"))
    for key, unit in units:
        if key not in out:
            continue
        for name, values in out[key].items():
            shown = ", ".join(f"{v:.1f}" for v in values)
            print(f"{key:16} {name:4} median {statistics.median(values):8.1f} {unit}   [{shown}]")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
