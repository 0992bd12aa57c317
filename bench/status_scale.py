"""`gpuq status` and `gpuq status -a` over many finished jobs, two checkouts side by side (issue 15).

    python bench/status_scale.py build /tmp/gpuq-s100k 100000
    python bench/status_scale.py measure /tmp/gpuq-s100k --old /work/main --new . --rounds 5

`build` writes finished jobs as bench/scenarios.py's fill_finished does (the same fields, each with
this shell's environment in `shell_env`), but with plain writes, not gpuq's fsynced publish: 100,000
fsyncs would take minutes and the files read back the same. It also keeps, in `journal.saved` beside
the spool's directories, the cache/finished-jobs.journal that gpuq's finishing path would have left:
each file's row appended by gpuq's own function (engine/lifecycle/ending.py, `landed`), as when a job
lands in done/; `measure` writes one per checkout (`journal.saved.old`, `.new`), each by that
checkout's own function (none for a gpuq without the journal).
`measure` runs each checkout's honest venv (bench/honest.py, built if missing) on the same spool,
turn by turn, output to a pipe as the benchmark does: the first `status -a` (its cache files removed
first) with the journal that publishing the jobs left (`first`; a checkout without the journal
ignores it) and without one (`first-nojournal`: files made by hand or lost appends, every file
read), later `status -a` calls, plain `status`, and `python -c pass`. It prints medians of wall and
CPU time (the child's getrusage), with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path


def build(home: Path, count: int) -> None:
    from gpuq.core import schema
    from gpuq.spool import Spool
    from gpuq.spool.store import encode

    spool = Spool(home).ensure()
    done = Path(spool.layout.state_dir("done"))
    have = len(spool.jobs.names("done"))
    first = spool.ids.allocate(count - have) if count > have else 0
    end = datetime.now().astimezone()
    for job_id in range(first, first + max(0, count - have)):
        job = schema.new_job(
            job_id=job_id,
            name=f"bench/train-{job_id}",
            cmd=[sys.executable, "train.py", "--lr", "3e-4", "--epochs", "3"],
            cwd=str(home),
            log=str(spool.layout.log_path(job_id)),
            shell_env=dict(os.environ),
        )
        began = (end - timedelta(seconds=3600 + job_id % 600)).isoformat(timespec="milliseconds")
        ended = end.isoformat(timespec="milliseconds")
        job.update(started_at=began, finished_at=ended, exit_code=0, attempts=1, rev=2)
        job["history"] = [{"attempt": 1, "started_at": began, "finished_at": ended, "exit_code": 0, "outcome": "done"}]
        fd = os.open(done / schema.filename(job_id, job["name"]), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write(encode(job))
    save_journal(home, spool)
    print(f"{home}: {len(spool.jobs.names('done'))} finished jobs")


def save_journal(home: Path, spool: object, name: str = "journal.saved") -> None:
    """journal.saved: the journal that gpuq's finishing path would have left for the jobs of done/."""
    try:
        from gpuq.engine.lifecycle.ending import landed
        from gpuq.spool.cache.journal import NAME
    except ImportError:
        return  # a gpuq without the journal
    path = home / "cache" / NAME
    path.unlink(missing_ok=True)
    for ref in spool.jobs.refs(("done",)):  # type: ignore[attr-defined]
        landed(spool, ref)  # type: ignore[arg-type]
    if path.exists():
        os.replace(path, home / name)


def honest(checkout: Path) -> Path:
    """The checkout's honest venv (bench/honest.py run with this interpreter, from that checkout)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(checkout / "bench" / "honest.py")], capture_output=True, text=True, check=True, env=env
    )
    return Path(proc.stdout.strip().splitlines()[-1])


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall and CPU seconds (user + system of the child and its forks) of one run, and its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-500:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, proc.stdout


def drop_caches(home: Path, journal: str) -> None:
    """No cache files; and cache/finished-jobs.journal as gpuq's ending left it when `journal` (a
    file name beside the spool's directories) is given."""
    for path in (home / "cache").glob("finished*"):
        path.unlink()
    if journal and (home / journal).exists():
        shutil.copyfile(home / journal, home / "cache" / "finished-jobs.journal")


def measure(home: Path, checkouts: dict[str, Path], rounds: int, later: int, what: set[str]) -> dict:
    venvs = {name: honest(path) for name, path in checkouts.items()}
    for name, venv in venvs.items():  # the journal as each measured code appends it (its rows name its files)
        subprocess.run([str(venv / "bin" / "python"), __file__, "journal", str(home), "--as", name], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["GPUQ_HOME"] = str(home)
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {name: {} for name in venvs}
    outputs: dict[str, dict[str, str]] = {name: {} for name in venvs}
    load = [os.getloadavg()[0]]
    names = list(venvs)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            gpuq, py = [str(venvs[name] / "bin" / "gpuq")], str(venvs[name] / "bin" / "python")
            tasks: list[tuple[str, list[str]]] = [("python -c pass", [py, "-c", "pass"])]
            if "first" in what:
                tasks.append(("status -a, first (fills the cache), journal", [*gpuq, "status", "-a"]))
            if "first-nojournal" in what:
                tasks.append(("status -a, first (fills the cache), no journal", [*gpuq, "status", "-a"]))
            if "later" in what:
                tasks += [("status -a, later", [*gpuq, "status", "-a"])] * later
            if "status" in what:
                tasks += [("status", [*gpuq, "status"])] * later
            for label, argv in tasks:
                if label.startswith("status -a, first"):
                    drop_caches(home, journal=f"journal.saved.{name}" if label.endswith(", journal") else "")
                wall, cpu, out = timed(argv, env)
                samples[name].setdefault(label, []).append((wall, cpu))
                outputs[name].setdefault(label, out)
        load.append(os.getloadavg()[0])
    report = {"home": str(home), "finished": len(os.listdir(home / "done")), "rounds": rounds, "load": load}
    for name, by_label in samples.items():
        report[name] = {
            label: {
                "wall_ms": round(statistics.median(w for w, _c in got) * 1000, 1),
                "cpu_ms": round(statistics.median(c for _w, c in got) * 1000, 1),
                "n": len(got),
            }
            for label, got in by_label.items()
        }
    same = {label: len({outputs[n].get(label) for n in names}) == 1 for label in outputs[names[0]]}
    report["same_output"] = same
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("home", type=Path)
    b.add_argument("count", type=int)
    m = sub.add_parser("measure")
    m.add_argument("home", type=Path)
    m.add_argument("--old", type=Path, default=Path("/work/main"))
    m.add_argument("--new", type=Path, default=Path(__file__).resolve().parent.parent)
    m.add_argument("--rounds", type=int, default=5)
    m.add_argument("--later", type=int, default=3, help="later calls per round")
    m.add_argument(
        "--what",
        default="first,first-nojournal,later,status",
        help="first, first-nojournal, later, status (comma-separated)",
    )
    j = sub.add_parser("journal", help="(re)write journal.saved for a spool built before the journal")
    j.add_argument("home", type=Path)
    j.add_argument("--as", dest="checkout", default="", help="write journal.saved.CHECKOUT")
    args = parser.parse_args()
    if args.cmd == "build":
        build(args.home, args.count)
    elif args.cmd == "journal":
        from gpuq.spool import Spool

        save_journal(
            args.home, Spool(args.home), f"journal.saved.{args.checkout}" if args.checkout else "journal.saved"
        )
    else:
        checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
        print(json.dumps(measure(args.home, checkouts, args.rounds, args.later, set(args.what.split(","))), indent=1))


if __name__ == "__main__":
    main()
