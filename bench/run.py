#!/usr/bin/env python3
"""gpuq benchmark: `python bench/run.py` measures gpuq beside task-spooler and nq and writes
bench/RESULTS.md. `--smoke` is the seconds-long version CI runs (tiny sizes, no peers).

The `week` step replays bench/week.py's week through gpuq and task-spooler (about 12 minutes of a
full run); `--smoke` replays the trace's first 8 jobs, short, crash included (a few seconds), so
only its wiring is tested. `--only week` runs that step alone.

Run as root on Debian/Ubuntu and it installs the peers it compares against (`apt-get install
task-spooler nq`); elsewhere a missing peer is skipped and the results say so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import honest  # noqa: E402
import report  # noqa: E402
import researcher  # noqa: E402
import scenarios  # noqa: E402
import systems  # noqa: E402
import variants  # noqa: E402
import week  # noqa: E402
from common import filesystem_of, machine_info  # noqa: E402

FULL = {
    "dispatch": 20,
    "pairs": 10,
    "jobs": 500,
    "tp_rounds": 3,
    "cli_sizes": [0, 1000, 10000],
    "cli_reps": 15,
    "idle_seconds": 60.0,
    "pending": 1000,
    "idle_pause": 5.0,
    "log_bytes": 2**30,
    "log_reps": 15,
    "scale": 100000,
    "scale_reps": 5,
    "git_files": 300,
    "dispatch_idle": variants.IDLE_ROUND_SECONDS,  # quiet before each round of dispatch_git
    "researcher_finished": [2000, 10000],
    "researcher_pending": 20,
    "researcher_reps": 15,
    "researcher_peer_max": 2000,
    "week_scale": 1.0,  # bench/week.py's trace as it is: about 12 minutes for the two systems
    "week_jobs": None,  # all of the trace's jobs
}
SMOKE = {
    "dispatch": 3,
    "pairs": 2,
    "jobs": 20,
    "tp_rounds": 1,
    "cli_sizes": [0, 50],
    "cli_reps": 3,
    "idle_seconds": 2.0,
    "pending": 20,
    "idle_pause": 1.0,
    "log_bytes": 2**30,
    "log_reps": 3,
    "scale": 300,
    "scale_reps": 2,
    "git_files": 20,
    "dispatch_idle": 0.25,
    "researcher_finished": [40, 80],
    "researcher_pending": 4,
    "researcher_reps": 2,
    "researcher_peer_max": 40,
    "week_scale": 0.05,  # the wiring only: the trace's first jobs, short, with the crash (seconds)
    "week_jobs": 8,
}
STEPS = ("dispatch", "back_to_back", "throughput", "cli", "idle", "log", "scale")
STEPS += ("dispatch_git", "back_to_back_gpus", "researcher")  # issue 27: where users are
STEPS += ("week",)  # issue 42: a researcher's week replayed, gpuq and task-spooler
WEEK_SEED = 7  # bench/week.py's default: the trace WEEK.md's runs replay
COMPARED_STEPS = ("dispatch", "dispatch_git", "back_to_back", "throughput", "cli", "researcher")  # issue 40's budgets


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, no peers: seconds, for CI")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "RESULTS.md")
    p.add_argument("--raw", type=Path, help="also write the raw samples as JSON here")
    p.add_argument("--peers", default=None, help="comma-separated peers (default: tsp,nq; none with --smoke)")
    p.add_argument("--no-install", action="store_true", help="never run apt-get; skip missing peers")
    p.add_argument("--only", default=",".join(STEPS), help=f"comma-separated steps (default all: {','.join(STEPS)})")
    p.add_argument("--idle-seconds", type=float, help="length of each idle-cost window")
    p.add_argument("--keep", action="store_true", help="keep the temporary queues for inspection")
    p.add_argument(
        "--compare",
        metavar="REV",
        help="also measure gpuq of git revision REV (e.g. pre40), as `gpuq@REV`: its own venv (`pip install .` "
        f"of that tree), spool and worker, in the same rounds; steps {','.join(COMPARED_STEPS)}",
    )
    p.add_argument(
        "--no-venv",
        action="store_true",
        help="run `python -m gpuq` of this interpreter instead of the entry point of a venv holding only gpuq "
        "and its dependencies (bench/honest.py): faster to start, but not the baseline a user has",
    )
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    sizes: dict[str, Any] = dict(SMOKE if args.smoke else FULL)
    if args.idle_seconds:
        sizes["idle_seconds"] = args.idle_seconds
    peers = [p for p in (args.peers if args.peers is not None else ("" if args.smoke else "tsp,nq")).split(",") if p]
    unknown = [p for p in peers if p not in systems.PEERS]
    if unknown:
        print(f"bench: unknown peer(s): {', '.join(unknown)} (known: {', '.join(systems.PEERS)})", file=sys.stderr)
        return 2
    steps = [s for s in args.only.split(",") if s]
    if any(s not in STEPS for s in steps):
        print(f"bench: --only takes {','.join(STEPS)}", file=sys.stderr)
        return 2
    skipped = systems.install_peers(peers, allow_install=not args.no_install)
    peers = [p for p in peers if p not in skipped]
    names = ["gpuq", *peers]
    root = Path(tempfile.mkdtemp(prefix="gpuq-bench-"))
    began = time.monotonic()
    load_before = os.getloadavg()
    systems.snapshot_gpuq(root)
    baseline = _honest_baseline(args.no_venv)
    if args.compare:
        try:
            compared = _compared_venv(args.compare)
        except (OSError, honest.subprocess.CalledProcessError) as exc:
            print(f"bench: could not build the venv of {args.compare}: {exc}", file=sys.stderr)
            return 2
        systems.COMPARED[compared[0]] = compared[1]
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    try:
        run_steps(steps, names, root, sizes, results, errors)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    meta = {
        "smoke": args.smoke,
        "skipped": skipped,
        "errors": errors,
        "facts": {**facts([*names, *systems.COMPARED], root, time.monotonic() - began, argv, load_before), **baseline},
        "compared": next(iter(systems.COMPARED), None),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report.render(results, meta, sizes))
    if args.raw:
        args.raw.write_text(json.dumps({"meta": meta, "sizes": sizes, "results": results}, indent=1, default=str))
    print(f"bench: wrote {args.out} in {time.monotonic() - began:.0f}s")
    return 1 if errors else 0


def _honest_baseline(skip: bool) -> dict[str, str]:
    """Build (or reuse) the venv gpuq is measured in; what the report says about the baseline."""
    if not skip:
        print("bench: the venv holding only gpuq and its dependencies (built once per checkout)...", flush=True)
        try:
            systems.VENV["path"] = honest.honest_venv(log=Path(tempfile.gettempdir()) / "gpuq-bench-venv.log")
        except (OSError, honest.subprocess.CalledProcessError) as exc:
            print(f"bench: could not build it ({exc}); measuring `python -m gpuq` instead", file=sys.stderr)
    venv = systems.VENV["path"]
    if venv is None:
        return {
            "baseline": f"`{sys.executable} -c pass`, gpuq as `python -m gpuq` of that interpreter: NOT the "
            "honest baseline (this interpreter's own site-packages slow both)"
        }
    return {
        "baseline": f"`{venv}/bin/python -c pass` of a fresh venv holding only gpuq (`pip install .` of this "
        "checkout) and its runtime dependencies; gpuq runs as that venv's `gpuq` entry point",
        "venv packages": honest.packages(venv),
    }


def _compared_venv(rev: str) -> tuple[str, Path]:
    """("gpuq@REV", the venv of that revision's tree), built once per tree like the checkout's."""
    print(f"bench: the venv of {rev} (`pip install .` of `git archive {rev}`, built once)...", flush=True)
    venv = honest.revision_venv(rev, log=Path(tempfile.gettempdir()) / "gpuq-bench-venv.log")
    return f"gpuq@{rev}", venv


def run_steps(
    steps: list[str], names: list[str], root: Path, sizes: dict[str, Any], results: dict, errors: dict
) -> None:
    """Each step in turn; a failing step is reported and the others still run. The compared gpuqs
    (systems.COMPARED) take part, beside gpuq and the peers, in COMPARED_STEPS."""
    cli_gpuq = systems.Gpuq(root / "cli-gpuq")  # grows from 0 to 10,000 and then to the scale size
    every = [names[0], *systems.COMPARED, *names[1:]]  # gpuq, gpuq@REV, the peers
    plan: list[tuple[str, Callable[[], Any]]] = [
        ("dispatch", lambda: _with_started(every, root / "dispatch", scenarios.dispatch, sizes["dispatch"])),
        ("back_to_back", lambda: _with_started(every, root / "b2b", scenarios.back_to_back, sizes["pairs"])),
        ("throughput", lambda: scenarios.throughput(systems.make, every, root, sizes["jobs"], sizes["tp_rounds"])),
        ("cli", lambda: _cli(cli_gpuq, names[1:], root, sizes)),
        ("idle", lambda: scenarios.idle_cost(systems.make, names, root, *_idle_sizes(sizes))),
        ("log", lambda: scenarios.log_size(root, sizes["log_bytes"], sizes["log_reps"])),
        ("scale", lambda: scenarios.scale(cli_gpuq, sizes["scale"], sizes["scale_reps"])),
        ("dispatch_git", lambda: variants.dispatch_git(every, root / "dgit", sizes)),
        ("back_to_back_gpus", lambda: variants.back_to_back_gpus(names, root / "b2b-gpus", sizes["pairs"])),
        ("researcher", lambda: researcher.researcher(root / "researcher", names[1:], sizes, systems.COMPARED)),
        ("week", lambda: _week(names, sizes)),
    ]
    for name, step in plan:
        if name not in steps:
            continue
        t0 = time.monotonic()
        print(f"bench: {name}...", flush=True)
        try:
            results[name] = step()
        except Exception as exc:  # one broken step must not hide the others' results
            errors[name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        print(f"bench: {name} took {time.monotonic() - t0:.1f}s", flush=True)


def _idle_sizes(sizes: dict[str, Any]) -> tuple[float, int, float]:
    return sizes["idle_seconds"], sizes["pending"], sizes["idle_pause"]


def _with_started(names: list[str], root: Path, measure: Callable[..., Any], samples: int) -> Any:
    queues = [systems.make(name, root / name) for name in names]
    try:
        scenarios.started(queues)
        systems.settle(1.0)
        return measure(queues, root, samples)
    finally:
        for queue in queues:
            queue.stop()


def _cli(gpuq: systems.Gpuq, peers: list[str], root: Path, sizes: dict[str, Any]) -> Any:
    """The CLI step; the compared gpuqs' spools are grown beside gpuq's (which `scale` grows on)."""
    compared = [systems.Gpuq(root / f"cli-{name}", venv, name) for name, venv in systems.COMPARED.items()]
    queues = [systems.make(name, root / f"cli-{name}") for name in peers]
    try:
        return scenarios.cli_latency([gpuq, *compared], queues, sizes["cli_sizes"], sizes["cli_reps"])
    finally:
        for queue in queues:
            queue.stop()


def _week(names: list[str], sizes: dict[str, Any]) -> dict[str, Any]:
    """bench/week.py's trace, replay and figures, for gpuq and (where it is a peer of this run)
    task-spooler, with gpuq's compiled copy this run measures."""
    jobs = week.trace(WEEK_SEED, sizes["week_scale"])[: sizes["week_jobs"]]
    ran = week.run_week(jobs, [n for n in names if n in ("gpuq", "tsp")], src=systems.SOURCE["parent"])
    data = {"trace": week.describe(jobs), "seed": WEEK_SEED, "scale": sizes["week_scale"], "first": sizes["week_jobs"]}
    return {**data, "systems": ran}


def facts(names: list[str], root: Path, seconds: float, argv: list[str], load: tuple) -> dict[str, str]:
    info = machine_info()
    after = os.getloadavg()
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": info["machine"],
        "os": info["os"],
        "python": f"{info['python']} ({sys.executable})",
        "filesystem of the queues": f"{filesystem_of(root)} ({root.parent})",
        "versions": ", ".join(systems.version_of(n) for n in names),
        "command": "python bench/run.py" + (" " + " ".join(argv) if argv else ""),
        "wall time of the whole run": f"{seconds:.0f} s",
        "load average (1 min) before / after the run": f"{load[0]:.2f} / {after[0]:.2f} (other work on the "
        "machine shows up in every number)",
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
