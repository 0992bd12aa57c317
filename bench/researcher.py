"""Issue 27's "researcher's spool": the queue a researcher has after some weeks, measured from
inside the git repository the experiments live in.

- a git repository of a few hundred tracked files, one of them changed since the last commit;
- thousands of finished jobs from a few commands and sweeps (mostly done, some failed), each a valid
  job file published through gpuq's own library (job files from real `gpuq add`s of those
  commands, then started and ended by gpuq's own transitions, with earlier times);
- two simulated GPUs (`GPUQ_FAKE_GPUS`), each running a real long job, and 20 jobs pending behind
  them, all queued by real `gpuq add`s.

`gpuq status`, `status --json`, `add`, `eta` and `history` are timed beside `python -c pass` of the
same interpreter; task-spooler and nq, with the same number of finished jobs, two jobs running
(nq: one, it runs one at a time) and 20 waiting, beside them: `tsp -l` / `tsp CMD` and
`fq -nq` / `nq CMD`. The samples take turns, the order rotating every round.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
from pathlib import Path
from typing import Any, Callable, Optional

from common import BenchError, timed_run, wait_for
from systems import Gpuq, Nq, System, Tsp, bare_python, forget_pending

# Finished jobs come in blocks of this pattern (by id): one sweep of 12, then single runs.
SWEEP = ("--sweep", "lr=1e-4,3e-4,1e-3", "--sweep", "seed=0,1,2,3")
SWEEP_WORDS = ("train.py", "--lr", "{lr}", "--seed", "{seed}")
SINGLES = {  # command -> (typical run time in seconds, how many per block)
    ("train.py", "--config", "configs/base.yaml"): (3600.0, 6),
    ("train.py", "--config", "configs/large.yaml"): (7200.0, 2),
    ("eval.py", "--ckpt", "runs/best"): (300.0, 3),
    ("prep.py", "--split", "train"): (600.0, 2),
}
SWEEP_SECONDS = 1800.0
SPACING = 300.0  # seconds between two finished jobs' ends: 10,000 jobs span about five weeks
FAILED_PERCENT = 7
LOG_TEXT = "epoch 1/3 [{n}/{n}] loss 0.41\nepoch 2/3 [{n}/{n}] loss 0.33\n"
FAILED_LOG = (
    'Traceback (most recent call last):\n  File "train.py", line 41\ntorch.OutOfMemoryError: CUDA out of memory.\n'
)
# The long jobs: a training script that shows tqdm-style progress, then works for an hour.
TRAIN_PY = """import sys, time
for i in range(1, 6):
    print(f"{i * 20}/1000 [00:{i:02d}<10:00, 1.6it/s] loss 0.{50 - i}", flush=True)
time.sleep(3600)
"""


def make_repo(work: Path, files: int) -> Path:
    """A repository as a researcher's: `files` tracked files (package, configs, scripts), one commit,
    then one tracked file changed and not committed."""
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "-C", str(work)]
    (work / "src").mkdir(parents=True, exist_ok=True)
    (work / "configs").mkdir(exist_ok=True)
    for script in ("train.py", "eval.py", "prep.py"):
        (work / script).write_text(TRAIN_PY)
    for name in ("base", "large"):
        (work / "configs" / f"{name}.yaml").write_text(f"model: {name}\nlr: 3e-4\n")
    for n in range(max(0, files - 5)):
        (work / "src" / f"module_{n:03d}.py").write_text(f'"""Module {n}."""\n\nVALUE = {n}\n' * 20)
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "experiments"], check=True)
    (work / "src" / "module_000.py").write_text('"""Module 0, being changed."""\n\nVALUE = -1\n')
    return work


def gpuq_add(gpuq: Gpuq, *words: str) -> str:
    return timed_run([*gpuq.cli, "add", "-q", *words], gpuq.env, gpuq.work)[1]


def templates(gpuq: Gpuq) -> dict[str, Any]:
    """Job files of real `gpuq add`s of each command (queued held, read, then removed): what the
    finished jobs are made of. Keys: the command's words, or "sweep" for the list of variants."""
    out: dict[str, Any] = {}
    for words in SINGLES:
        gpuq_add(gpuq, "--hold", *words)
        out[" ".join(words)] = gpuq.lib(take_held, str(gpuq.home))[0]
    gpuq_add(gpuq, "--hold", *SWEEP, *SWEEP_WORDS)
    out["sweep"] = gpuq.lib(take_held, str(gpuq.home))
    return out


def take_held(home: str) -> list[dict[str, Any]]:
    """The held jobs of the spool at `home`, removed from it (in its gpuq's own library)."""
    from gpuq.core.states import HELD
    from gpuq.spool import Spool

    spool = Spool(Path(home))
    jobs = []
    for ref, job in sorted(spool.jobs.load_many(HELD), key=lambda pair: pair[1]["id"]):
        jobs.append(dict(job))
        spool.jobs.remove(ref)
    return jobs


def pattern(made: dict[str, Any]) -> list[tuple[dict[str, Any], float, int]]:
    """One block of finished jobs: (template, typical seconds, position in its sweep or -1)."""
    block = [(job, SWEEP_SECONDS, n) for n, job in enumerate(made["sweep"])]
    for words, (seconds, count) in SINGLES.items():
        block += [(made[" ".join(words)], seconds, -1)] * count
    return block


def finished_count(gpuq: Gpuq) -> int:
    from gpuq.core.states import FAILED

    return len(gpuq.spool.jobs.names("done")) + len(gpuq.spool.jobs.names(FAILED))


def fill(gpuq: Gpuq, made: dict[str, Any], total: int, epoch: float) -> None:
    """Grow the finished jobs to `total`, in gpuq's own library (fill_at)."""
    gpuq.lib(fill_at, str(gpuq.home), made, total, epoch)


def fill_at(home: str, made: dict[str, Any], total: int, epoch: float, processes: int = 2) -> None:
    """`fill` for the spool at `home`: ids reserved the way `gpuq add` takes them; each file is
    published by spool.jobs.publish (written, fsynced, renamed, recorded in the derived data of
    finished jobs) in one of two processes. Job `id` ends at epoch + id * SPACING, so ids and ends
    go together."""
    import multiprocessing

    from gpuq.core.states import FAILED
    from gpuq.spool import Spool

    spool = Spool(Path(home))
    count = total - len(spool.jobs.names("done")) - len(spool.jobs.names(FAILED))
    if count <= 0:
        return
    first = spool.ids.allocate(count)
    bounds = [first + count * n // processes for n in range(processes + 1)]
    block = pattern(made)
    args = [(home, block, lo, hi, epoch) for lo, hi in zip(bounds, bounds[1:])]
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        pool.starmap(_publish_range, args)


def _publish_range(home: str, block: list, first: int, stop: int, epoch: float) -> None:
    from gpuq.core import transitions
    from gpuq.core.job import Job
    from gpuq.core.times import iso_of
    from gpuq.spool import Spool

    spool = Spool(Path(home))
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    for job_id in range(first, stop):
        template, seconds, in_sweep = block[job_id % len(block)]
        rng = random.Random(job_id)
        failed = rng.randrange(100) < FAILED_PERCENT
        ran = seconds * rng.uniform(0.8, 1.2) * (0.3 if failed else 1.0)
        end = epoch + job_id * SPACING
        job = Job(template, id=job_id, log=str(spool.layout.log_path(job_id)), rev=template["rev"] + 2)
        if in_sweep >= 0:
            job["sweep"] = dict(template["sweep"], id=job_id - in_sweep)
        job.created_at = iso_of(end - ran - rng.uniform(10, 3000))
        gpu = job_id % 2
        job.update(
            transitions.start(job, slot=str(gpu), gpus=[gpu], boot_id=boot, host=os.uname().nodename, log=job.log)
        )
        job.update(started_at=iso_of(end - ran), ckpt_since=iso_of(end - ran), pid=20000 + job_id % 30000)
        job.update(pid_create_time=round(end - ran, 2))
        state, note = transitions.destination(job, 1 if failed else 0, None, False)
        job.update(
            transitions.end_attempt(
                job, state, exit_code=1 if failed else 0, signal=None, note=note, finished_at=iso_of(end)
            )
        )
        with open(job.log, "w") as log:  # the log a real run leaves (not fsynced: not a spool file)
            log.write(LOG_TEXT.format(n=job_id % 900 + 100) + (FAILED_LOG if failed else ""))
        spool.jobs.publish(job, state)


def queue_live(gpuq: Gpuq, pending: int) -> None:
    """Two long jobs running, one per simulated GPU, then `pending` jobs queued behind them (a
    sweep of 12 and single runs), each by a real `gpuq add`."""
    from gpuq.core.states import PENDING, RUNNING

    for _ in range(2):
        gpuq_add(gpuq, *next(iter(SINGLES)))
    wait_for(lambda: len(gpuq.spool.jobs.names(RUNNING)) == 2, 30, "two gpuq jobs to run")
    if pending >= 12:
        gpuq_add(gpuq, *SWEEP, *SWEEP_WORDS)
    singles = list(SINGLES)
    while len(gpuq.spool.jobs.names(PENDING)) < pending:
        gpuq_add(gpuq, *singles[len(gpuq.spool.jobs.names(PENDING)) % len(singles)])


def queue_peer(system: System, finished: int, pending: int) -> None:
    """The same situation in a peer: `finished` real runs of `true`, then long jobs running (tsp:
    two slots, two jobs; nq runs one job at a time) and jobs waiting behind them."""
    last = ""
    for _ in range(finished):
        last = system.add(["true"])
    if last:
        system.wait_all_done(last, finished)
    running = 2 if isinstance(system, Tsp) else 1
    for _ in range(running):
        system.add(["sleep", "3600"])
    for _ in range(pending + 2 - running):
        system.add(["python3", *next(iter(SINGLES))])


def forget_peer_job(system: System, out: str) -> None:
    """Take a job a timed add queued out again, so that the next sample sees the same queue: tsp
    removes it (`tsp -r`); nq's is a process waiting for the earlier jobs, which is killed by its pid
    (the job file's name ends in it) and its file removed."""
    job = out.strip().splitlines()[-1].strip()
    if isinstance(system, Tsp):
        subprocess.run(["tsp", "-r", job], env=system.env, capture_output=True, timeout=30)
        return
    pid = int(job.rsplit(".", 1)[1])
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    Path(system.env["NQDIR"], job).unlink(missing_ok=True)


def time_round(gpuqs: list[Gpuq], peers: list[System], reps: int) -> dict[str, list[float]]:
    """`reps` rounds of every command, the order rotating each round; the baseline is the first
    gpuq's venv's (the one under test)."""
    add_words = list(next(iter(SINGLES)))
    first = gpuqs[0]
    tasks: list[tuple[str, Callable[[], float]]] = [
        ("python -c pass", lambda: timed_run(bare_python(), first.env, first.work)[0]),
    ]
    for gpuq in gpuqs:
        for words in (["status"], ["status", "--json"], ["add"], ["eta"], ["history"]):
            label = " ".join([gpuq.name, *words])
            if words == ["add"]:
                tasks.append((label, lambda g=gpuq: _gpuq_add_and_forget(g, add_words)))
            else:
                tasks.append((label, lambda g=gpuq, w=words: timed_run([*g.cli, *w], g.env, g.work)[0]))
    for system in peers:
        listing = " ".join(system.list_argv())
        tasks.append((listing, lambda s=system: timed_run(s.list_argv(), s.env, s.work)[0]))
        tasks.append((f"{system.name} add", lambda s=system: _peer_add_and_forget(s, add_words)))
    samples: dict[str, list[float]] = {label: [] for label, _ in tasks}
    for n in range(reps):
        for label, task in tasks[n % len(tasks) :] + tasks[: n % len(tasks)]:
            samples[label].append(task())
    return samples


def _gpuq_add_and_forget(gpuq: Gpuq, words: list[str]) -> float:
    elapsed, out = timed_run([*gpuq.cli, "add", "-q", *words], gpuq.env, gpuq.work)
    if not gpuq.lib(forget_pending, str(gpuq.home), int(out.strip())):
        raise BenchError(f"{gpuq.name} job {out.strip()} was not pending after its add")
    return elapsed


def _peer_add_and_forget(system: System, words: list[str]) -> float:
    elapsed, out = timed_run(system.add_argv(["python3", *words]), system.env, system.work)
    forget_peer_job(system, out)
    return elapsed


def build(
    root: Path, files: int, sizes: list[int], pending: int, venv: Optional[Path] = None, name: str = "gpuq"
) -> tuple[Gpuq, Callable[[int], None]]:
    """The researcher's gpuq queue with `sizes[0]` finished jobs, its worker running (the caller
    stops it: `gpuq.stop()`), and the function that grows it to a later size of `sizes`. `venv`,
    `name`: a compared gpuq's (systems.Gpuq)."""
    import time

    gpuq = Gpuq(root / "gpuq", venv, name)
    gpuq.simulate_gpus(2)
    gpuq.work = make_repo(root / "repo", files)
    # the newest finished job of the largest size ends some hours ago; ids above the largest size
    # are the live jobs' and the timed adds' (about 100 of them)
    epoch = time.time() - (max(sizes) + 200) * SPACING
    try:
        gpuq.start()
        made = templates(gpuq)

        def grow(total: int) -> None:
            fill(gpuq, made, total, epoch)
            if finished_count(gpuq) != total:
                raise BenchError(f"the researcher's spool holds {finished_count(gpuq)} finished jobs, not {total}")

        grow(sizes[0])
        queue_live(gpuq, pending)
    except BaseException:
        gpuq.stop()
        raise
    return gpuq, grow


def researcher(
    root: Path, peer_names: list[str], sizes: dict[str, Any], compared: Optional[dict[str, Path]] = None
) -> dict[str, Any]:
    """The scenario: for each size of `researcher_finished`, every command timed `researcher_reps`
    times; the peers only up to `researcher_peer_max` finished jobs (they get finished jobs only by
    running them). `compared`: other gpuqs ({"gpuq@REV": venv}), each with a spool, repository and
    worker of its own, timed in the same rounds. Returns {"finished": {finished: {command: samples}},
    "failed": {finished: how many of them failed}, "tracked files": the repository's}."""
    from gpuq.core.states import FAILED

    finished, pending = sizes["researcher_finished"], sizes["researcher_pending"]
    gpuqs: list[Gpuq] = []
    grows: list[Callable[[int], None]] = []
    peers: list[System] = []
    out: dict[str, Any] = {"finished": {}, "failed": {}}
    try:
        for name, venv in [("gpuq", None), *(compared or {}).items()]:
            queue, grow = build(root / name, sizes["git_files"], finished, pending, venv, name)
            gpuqs.append(queue)
            grows.append(grow)
        gpuq = gpuqs[0]
        peers = [(Tsp if name == "tsp" else Nq)(root / name) for name in peer_names]
        for system in peers:
            system.work = gpuq.work
            if isinstance(system, Tsp):
                system.env["TS_SLOTS"] = "2"
            system.start()
            queue_peer(system, min(finished[0], sizes["researcher_peer_max"]), pending)
        for total in finished:
            for grow in grows:
                grow(total)
            live = peers if total <= sizes["researcher_peer_max"] else []
            out["finished"][total] = time_round(gpuqs, live, sizes["researcher_reps"])
            out["failed"][total] = len(gpuq.spool.jobs.names(FAILED))
        listed = subprocess.run(["git", "-C", str(gpuq.work), "ls-files"], capture_output=True, text=True).stdout
        out["tracked files"] = len(listed.split())
    finally:
        for system in [*gpuqs, *peers]:
            system.stop()
    return out


__all__ = ["researcher", "build", "make_repo", "fill"]
