#!/usr/bin/env python3
"""Start-up of `gpuq status` and `gpuq add`, side by side (issue 15, bench/PROFILE.md section 1).

    python bench/startup.py OLD_VENV NEW_VENV [--finished 1000] [--rounds 21] [--git] [--dispatch 10]
    python bench/startup.py OLD_VENV NEW_VENV --researcher 2000,10000 [--rounds 21]

Each venv is one built by bench/honest.py (`python bench/honest.py` prints the path of the one for
its checkout). One spool with `--finished` finished jobs (written as bench/scenarios.py writes
them) is shared by all; every round runs, in an order that rotates, each venv's `python -c pass`,
`gpuq status` and `gpuq add -q true` (its job removed again, so that the queue does not grow).
Reported: medians of wall time and of CPU time (user + system of the child, which a loaded machine
inflates less), and each command's excess over its own venv's `python -c pass`. `--git` makes the
directory `add` runs in a git repository with one commit and an uncommitted change (`--git-files`
tracked files), so that `add` records the code's provenance as a user's would (also for
`--dispatch`). `--dispatch N` then also takes N samples per venv
of issue 15's end-to-end figure: an idle `gpuq run --watch` of that venv, `gpuq add` launched ->
the job's first instruction (bench/scenarios.py's dispatch, the venvs taking turns).

`--researcher 2000,10000` times, instead, `status`, `status --json`, `add`, `eta` and `history` of
each venv in issue 27's researcher's spool (bench/researcher.py: a git repository, two simulated GPUs
running, 20 pending) at each number of finished jobs; each venv has a spool of its own, with its own
worker and live jobs (in a shared one each gpuq would rebuild what the other cached).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import systems  # noqa: E402
from common import median  # noqa: E402
from scenarios import dispatch, fill_finished, rotated  # noqa: E402
from systems import REPO, Gpuq  # noqa: E402

sys.path.insert(0, str(REPO))


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """Wall and CPU seconds of one command, and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def make_git_work(work: Path, files: int = 1) -> None:
    """A repository as a user's: `files` tracked files in one commit, one of them changed since."""
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    (work / "train.py").write_text("print('train')\n")
    for n in range(1, files):
        (work / "src" / f"d{n % 10}").mkdir(parents=True, exist_ok=True)
        (work / "src" / f"d{n % 10}" / f"m{n}.py").write_text(f"VALUE = {n}\n")
    subprocess.run([*git, "-C", str(work), "add", "."], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-q", "-m", "first"], check=True)
    (work / "train.py").write_text("print('train, changed')\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("venvs", nargs="+", type=Path, help="venvs built by bench/honest.py")
    ap.add_argument("--finished", type=int, default=1000, help="finished jobs in the spool (default 1000)")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--git", action="store_true", help="`add` runs in a git repository with a change")
    ap.add_argument("--git-files", type=int, default=1, metavar="N", help="with --git: N tracked files (default 1)")
    ap.add_argument("--dispatch", type=int, default=0, metavar="N", help="also N dispatch samples per venv")
    ap.add_argument("--researcher", metavar="N,N", help="time issue 27's commands in the researcher's spool")
    args = ap.parse_args()
    labels = [f"{n}:{v.name}" for n, v in enumerate(args.venvs)]
    if args.researcher:
        sizes = sorted(int(n) for n in args.researcher.split(","))
        return researcher_side_by_side(labels, args.venvs, sizes, args.rounds)
    with tempfile.TemporaryDirectory(prefix="gpuq-startup-") as tmp:
        gpuq = Gpuq(Path(tmp))
        fill_finished(gpuq, args.finished)
        if args.git:
            make_git_work(gpuq.work, args.git_files)
        env = {k: v for k, v in gpuq.env.items() if k != "PYTHONPATH"}

        def add_and_forget(venv: Path) -> tuple[float, float, str]:
            wall, cpu, out = timed([str(venv / "bin" / "gpuq"), "add", "-q", "true"], env, gpuq.work)
            ref = gpuq.spool.jobs.find(int(out.strip()), ("pending",))
            if ref is not None:
                gpuq.spool.jobs.remove(ref)
            return wall, cpu, out

        tasks: list[tuple[str, Callable[[], tuple[float, float, str]]]] = []
        for label, venv in zip(labels, args.venvs):
            py, cli = str(venv / "bin" / "python"), str(venv / "bin" / "gpuq")
            tasks.append((f"{label} python -c pass", lambda py=py: timed([py, "-c", "pass"], env, gpuq.work)))
            tasks.append((f"{label} gpuq status", lambda cli=cli: timed([cli, "status"], env, gpuq.work)))
            tasks.append((f"{label} gpuq add", lambda venv=venv: add_and_forget(venv)))
        for _label, task in tasks:  # warm the page cache and the bytecode once
            task()
        samples: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label, _ in tasks}
        for n in range(args.rounds):
            for label, task in rotated(tasks, n):
                wall, cpu, _out = task()
                samples[label][0].append(wall)
                samples[label][1].append(cpu)
    print(f"{args.finished} finished jobs, {args.rounds} rounds, load average {os.getloadavg()[0]:.2f} at the end")
    print_table(labels, args.venvs, samples, ("python -c pass", "gpuq status", "gpuq add"))
    if args.dispatch:
        dispatch_side_by_side(labels, args.venvs, args.dispatch, args.git_files if args.git else 0)
    return 0


RESEARCHER_COMMANDS = {
    "gpuq status": ["status"],
    "gpuq status --json": ["status", "--json"],
    "gpuq eta": ["eta"],
    "gpuq history": ["history"],
}


def researcher_side_by_side(labels: list[str], venvs: list[Path], sizes: list[int], rounds: int) -> int:
    """Each venv's commands in a researcher's spool of its own, grown through `sizes`, in rotating
    turns. Not one spool for all: what one gpuq caches there (the finished rows, tagged with the
    stat of the code that made them; a running job's samples) another rebuilds, so every sample of
    each would pay for rebuilding the other's."""
    import researcher

    queues: list[tuple[Gpuq, Callable[[int], None]]] = []
    with tempfile.TemporaryDirectory(prefix="gpuq-researcher-") as tmp:
        try:
            for label, venv in zip(labels, venvs):
                systems.VENV["path"] = venv  # the worker, the running and the pending jobs: this venv's
                queues.append(researcher.build(Path(tmp) / label.replace(":", "-"), 300, sizes, 20))
            tasks = [
                task for label, venv, (gpuq, _grow) in zip(labels, venvs, queues) for task in _tasks(label, venv, gpuq)
            ]
            for size in sizes:
                for _gpuq, grow in queues:
                    grow(size)
                for _label, task in tasks:  # warm the page cache and the bytecode once
                    task()
                samples: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label, _ in tasks}
                for n in range(rounds):
                    for label, task in rotated(tasks, n):
                        wall, cpu, _out = task()
                        samples[label][0].append(wall)
                        samples[label][1].append(cpu)
                print(f"researcher's spool, {size} finished jobs, {rounds} rounds, load {os.getloadavg()[0]:.2f}")
                print_table(labels, venvs, samples, ("python -c pass", *RESEARCHER_COMMANDS, "gpuq add"))
        finally:
            for gpuq, _grow in queues:
                gpuq.stop()
    return 0


def _tasks(label: str, venv: Path, gpuq: Gpuq) -> list[tuple[str, Callable[[], tuple[float, float, str]]]]:
    """One venv's timed commands in its own researcher's spool."""
    import researcher

    env, work = gpuq.env, gpuq.work
    add_words = list(next(iter(researcher.SINGLES)))

    def add_and_forget() -> tuple[float, float, str]:
        wall, cpu, out = timed([str(venv / "bin" / "gpuq"), "add", "-q", *add_words], env, work)
        ref = gpuq.spool.jobs.find(int(out.strip()), ("pending",))
        if ref is not None:
            gpuq.spool.jobs.remove(ref)
        return wall, cpu, out

    py, cli = str(venv / "bin" / "python"), str(venv / "bin" / "gpuq")
    tasks: list[tuple[str, Callable[[], tuple[float, float, str]]]] = []
    tasks.append((f"{label} python -c pass", lambda: timed([py, "-c", "pass"], env, work)))
    for what, argv in RESEARCHER_COMMANDS.items():
        tasks.append((f"{label} {what}", lambda argv=argv: timed([cli, *argv], env, work)))
    tasks.append((f"{label} gpuq add", add_and_forget))
    return tasks


def print_table(labels: list[str], venvs: list[Path], samples: dict, commands: tuple[str, ...]) -> None:
    """Medians of wall and CPU time, and each command's excess over its venv's `python -c pass`."""
    for label, venv in zip(labels, venvs):
        print(f"{label} = {venv}")
    print(f"{'command':<44} {'wall':>8} {'over':>8} {'CPU':>8} {'over':>8}  (ms, medians)")
    for label in labels:
        base_wall, base_cpu = (median(v) for v in samples[f"{label} python -c pass"])
        for what in commands:
            wall, cpu = (median(v) for v in samples[f"{label} {what}"])
            print(
                f"{label + ' ' + what:<44} {wall * 1e3:8.1f} {(wall - base_wall) * 1e3:+8.1f}"
                f" {cpu * 1e3:8.1f} {(cpu - base_cpu) * 1e3:+8.1f}"
            )


def dispatch_side_by_side(labels: list[str], venvs: list[Path], samples: int, git_files: int = 0) -> None:
    """`gpuq add` launched -> the job's first instruction, each venv with its own idle worker
    (`git_files`: in a git repository of that many tracked files, one changed, as with --git)."""
    with tempfile.TemporaryDirectory(prefix="gpuq-dispatch-") as tmp:
        queues = []
        try:
            for label, venv in zip(labels, venvs):
                systems.VENV["path"] = venv  # read when the queue is made: its commands are this venv's
                queue = Gpuq(Path(tmp) / label.replace(":", "-"))
                queue.name = label
                if git_files:
                    make_git_work(queue.work, git_files)
                queue.start()
                queues.append(queue)
            out = dispatch(queues, Path(tmp), samples)
        finally:
            for queue in queues:
                queue.stop()
    print(f"dispatch, {samples} samples each, load average {os.getloadavg()[0]:.2f} at the end (ms, medians)")
    for label in labels:
        submitted, queued = (median(out[label][k]) for k in ("submitted", "queued"))
        print(f"{label:<40} add launched -> job's first instruction {submitted * 1e3:6.1f}")
        print(f"{label:<40} add returned -> job's first instruction {queued * 1e3:6.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
