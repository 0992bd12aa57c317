"""A researcher's week, replayed (compressed to minutes): the same trace through gpuq and through
task-spooler with one slot per GPU, one after the other in one run, on 4 simulated 80 GB GPUs.

The trace (seeded, so every run replays the same week): about 60 training jobs queued at the start
(one after another, the worker already running, as a service keeps one),
each asking for a share of a GPU (10-80 GB; 80: a whole GPU) and running 10 steps of a few seconds
to a minute in all, a checkpoint every 2 steps; some are evaluations that start after the job they
evaluate; 10% of them need twice what they ask and die of CUDA out-of-memory at 30% of their steps
unless they get more room; five urgent evaluations arrive while it runs; the worker crashes once
(SIGKILL; task-spooler's server likewise) and is started again at once, as a service manager would.
`--crash machine` replays a harsher week than the issue's: the whole machine goes down instead (the
worker, every supervisor and every job killed) and comes back.

gpuq: `--gpu-mem` shares, `--retry-oom 2`, `--after`, `--urgent` (preempting a job with a
checkpoint, resumed after), `gpuq run --recover` after the crash (the running jobs' supervisors
outlive a worker; after a machine crash each job goes on from its checkpoint).
task-spooler: one slot per GPU, each job a whole GPU (so none runs out of memory), `-D` for
dependencies, `-u` for the urgent ones, and after the crash (its queue is in its server's memory) the
jobs that neither ended nor still run queued again from scratch, as its user would (one that waits
for a job still running from before the crash is queued once that one has ended: the new server
cannot wait for it). A job that finds every GPU taken (by jobs still running from before the crash)
waits for one to free before it starts.

Reported: the makespan against its lower bound (the trace's GPU-seconds over the GPUs, each job's
seconds times its share of a GPU, and the longest dependency chain), the share of GPU time a GPU
sat idle while a job that could run waited, and the GPU-seconds lost to work done twice (steps run
again, and steps cut short by the crash or a preemption), in the trace's GPU-seconds. Each job
writes what it did to a journal (one JSON line per event); every figure is computed from it.

    python bench/week.py [--scale 1.0] [--seed 7] [--out bench/WEEK.md]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

GPUS, GPU_GB, STEPS, CKPT_EVERY = 4, 80, 10, 2
# The gpuq under test: a copy of the checkout's package with its bytecode compiled, as an installed
# package has it (systems.snapshot_gpuq); None: `python -m gpuq` as this interpreter finds it.
SNAPSHOT: dict[str, Optional[Path]] = {"src": None}
OOM_AT_STEP = 3  # 30% of its steps
SIZES = (10, 20, 40, 80)

# The job: 10 steps, a checkpoint every 2 (HF's checkpoint-N with trainer_state.json), each step's
# start and end in the journal; dies of out-of-memory at step 3 when it needs more than it has.
JOB = (
    r"""import fcntl, json, os, signal, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
journal, job, seconds = args["--journal"], int(args["--id"]), float(args["--seconds"])
need, asked = int(args["--need"]), int(args["--asked"])
out = args["--output_dir"]
gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
held = None
while gpu is None:  # task-spooler: the first free of the GPUs (it runs at most as many jobs as GPUs)
    for index in range(int(args["--gpus"])):
        held = open(os.path.join(args["--locks"], f"gpu{index}"), "w")
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            gpu = str(index)
            break
        except OSError:
            held.close()
    else:  # all taken by jobs still running from before a crash of its server
        time.sleep(0.05)
def say(event, **more):
    line = json.dumps({"t": time.time(), "job": job, "event": event, "gpu": gpu, **more}) + "\n"
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, line.encode())
    os.close(fd)
step = 0
resume = args.get("--resume_from_checkpoint")
if resume:
    step = int(os.path.basename(resume.rstrip("/")).split("-")[1])
now = {"step": step}
def cut(signum, frame):
    say("cut", step=now["step"])
    sys.exit(143)
signal.signal(signal.SIGTERM, cut)
k = int(os.environ.get("GPUQ_OOM_RETRY") or 0)
say("start", step=step, room=asked * 2 ** k)
while step < %(steps)d:
    now["step"] = step
    if step == %(oom)d and need > asked * 2 ** k:
        say("oom", step=step)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", flush=True)
        sys.exit(1)
    say("begin", step=step)
    time.sleep(seconds / %(steps)d)
    say("end", step=step)
    step += 1
    if step % %(every)d == 0:
        d = os.path.join(out, f"checkpoint-{step}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "trainer_state.json"), "w") as fh:
            json.dump({"global_step": step}, fh)
say("done", step=step)
""".replace("%(steps)d", str(STEPS))
    .replace("%(oom)d", str(OOM_AT_STEP))
    .replace("%(every)d", str(CKPT_EVERY))
)


class Job:
    def __init__(
        self, jid: int, seconds: float, need: int, asked: int, after: Optional[int], urgent_at: Optional[float]
    ):
        self.id, self.seconds, self.need, self.asked, self.after, self.urgent_at = (
            jid,
            seconds,
            need,
            asked,
            after,
            urgent_at,
        )

    @property
    def share(self) -> float:
        return self.need / GPU_GB


def trace(seed: int, scale: float) -> list[Job]:
    """About 60 jobs queued at once, 10% of them needing twice what they ask, some evaluations after
    the job they evaluate, and five urgent evaluations arriving later."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    sizes = [rng.choice(SIZES) for _ in range(55)]
    short = [i for i, size in enumerate(sizes) if size < GPU_GB]
    tight = set(rng.sample(short, 6))  # 10% of the 60 need twice what they ask
    for jid in range(1, 56):
        asked = sizes[jid - 1]
        need = asked * 2 if jid - 1 in tight else asked  # runs out of memory with what it asks
        after = None
        if jobs and rng.random() < 0.2:
            after = rng.choice(jobs[-8:]).id
        jobs.append(Job(jid, round(rng.uniform(4, 60) * scale, 2), need, asked, after, None))
    for n in range(5):
        jobs.append(Job(56 + n, round(rng.uniform(3, 8) * scale, 2), 10, 10, None, (0.15 + 0.15 * n)))
    return jobs


def lower_bound(jobs: list[Job]) -> tuple[float, float, float]:
    """(GPU-seconds of the trace, their spread over the GPUs, the longest dependency chain)."""
    total = sum(j.seconds * j.share for j in jobs)
    chain: dict[int, float] = {}
    for j in jobs:  # ids ascend along dependencies
        chain[j.id] = j.seconds + (chain[j.after] if j.after else 0.0)
    return total, total / GPUS, max(chain.values())


# -- the two systems -------------------------------------------------------------------------------


class Runner:
    name = ""

    def ready(self) -> None:
        """Return once it takes jobs as a running service does (its first look at the GPUs made)."""

    def __init__(self, root: Path, journal: Path) -> None:
        self.root, self.journal = root, journal
        self.work = root / "work"
        self.work.mkdir(parents=True)
        (self.work / "job.py").write_text(JOB)
        self.ids: dict[int, Any] = {}
        self.queued: dict[int, float] = {}  # when each job's first queueing returned: it waits from then
        self.crash_kind = "worker"  # or "machine": what `crash` takes down

    def tick(self) -> None:
        """Called between looks while the trace runs (task-spooler's user queues what had to wait)."""

    def queued_now(self, job: Job) -> None:
        self.queued.setdefault(job.id, time.time())

    def argv(self, job: Job, asked: int) -> list[str]:
        return [
            sys.executable, "job.py", "--journal", str(self.journal), "--id", str(job.id), "--seconds",
            str(job.seconds), "--need", str(job.need), "--asked", str(asked), "--gpus", str(GPUS),
            "--locks", str(self.root), "--output_dir", f"out/{self.name}-{job.id}",
        ]  # fmt: skip


class Gpuq(Runner):
    name = "gpuq"

    def __init__(self, root: Path, journal: Path) -> None:
        super().__init__(root, journal)
        gpus = [
            {"index": i, "name": "Fake 80GB", "uuid": f"GPU-week-{i}", "memory_total_mib": GPU_GB * 1024,
             "memory_used_mib": 0, "processes": []}
            for i in range(GPUS)
        ]  # fmt: skip
        (root / "gpus.json").write_text(json.dumps({"gpus": gpus}))
        self.env = dict(
            os.environ, GPUQ_HOME=str(root / "home"), GPUQ_FAKE_GPUS=str(root / "gpus.json"),
            GPUQ_LEASE_DIR=str(root / "leases"),
        )  # fmt: skip
        if SNAPSHOT["src"] is not None:  # gpuq as installed: its bytecode compiled once
            self.env["PYTHONPATH"] = str(SNAPSHOT["src"])
        self.worker: Optional[subprocess.Popen] = None

    def gpuq(self, *args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuq", *args], cwd=self.work, env=self.env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"gpuq {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def add(self, job: Job) -> None:
        opts = ["-q", "--name", f"w{job.id}", "--retry-oom", "2"]
        if job.asked < GPU_GB:
            opts += ["--gpu-mem", f"{job.asked}G"]
        if job.after:
            opts += ["--after", str(self.ids[job.after])]
        if job.urgent_at is not None:
            opts += ["--urgent"]
        self.ids[job.id] = int(self.gpuq("add", *opts, *self.argv(job, job.asked)).strip())
        self.queued_now(job)

    def ready(self) -> None:
        assert self.worker is not None
        seen = Path(self.env["GPUQ_HOME"]) / "workers" / f"gpus-{self.worker.pid}.json"
        deadline = time.monotonic() + 60
        while not seen.exists():
            if self.worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gpuq's worker did not come up: see {self.root / 'worker.log'}")
            time.sleep(0.05)

    def start(self, recover: bool = False) -> None:
        args = [sys.executable, "-m", "gpuq", "run", "--watch", *(["--recover"] if recover else [])]
        log = open(self.root / "worker.log", "ab")
        self.worker = subprocess.Popen(
            args, cwd=self.work, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def crash(self) -> None:
        """The worker killed (SIGKILL): its supervisors and their jobs go on. With `crash_kind`
        "machine", the machine goes down: the worker, every supervisor and every job killed at once
        (each process whose environment names this spool, looked for until none is left)."""
        assert self.worker is not None
        if self.crash_kind == "worker":
            self.worker.kill()
            self.worker.wait()
            return
        mark = f"GPUQ_HOME={self.env['GPUQ_HOME']}".encode()
        for _look in range(5):
            found = [pid for pid in _pids() if mark in _environ(pid).split(b"\0")]
            if not found:
                break
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.worker.wait()

    def finished(self) -> bool:
        states = {row["id"]: row["state"] for row in json.loads(self.gpuq("status", "-a", "--json"))}
        return all(states.get(i) in ("done", "failed", "cancelled") for i in self.ids.values())

    def stop(self) -> None:
        subprocess.run(
            [sys.executable, "-m", "gpuq", "stop", "--kill-jobs"], cwd=self.work, env=self.env, capture_output=True
        )
        if self.worker is not None and self.worker.poll() is None:
            self.worker.wait(30)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()]


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return []


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


class Tsp(Runner):
    name = "tsp"

    def __init__(self, root: Path, journal: Path) -> None:
        super().__init__(root, journal)
        self.env = dict(os.environ, TS_SOCKET=str(root / "tsp.socket"), TMPDIR=str(root), TS_MAXFINISHED="1000")
        self.jobs: dict[int, Job] = {}
        self.orphans: set[int] = set()  # jobs still running from before a crash of its server
        self.later: dict[int, Job] = {}  # jobs to queue once what they wait for has ended

    def tsp(self, *args: str) -> str:
        return subprocess.run(["tsp", *args], cwd=self.work, env=self.env, capture_output=True, text=True).stdout

    def start(self, recover: bool = False) -> None:
        self.tsp("-S", str(GPUS))  # the first call starts the server: its command line is this one
        if recover:  # its queue died with its server: what neither ended nor runs is queued again, from scratch
            done, self.orphans = self.done_ids(), self.running_ids()
            again = [j for j in sorted(self.jobs.values(), key=lambda j: j.id) if j.id not in done | self.orphans]
            for job in again:
                self.queue_or_wait(job)
            print(
                f"tsp after its crash: {len(self.orphans)} jobs still running, {len(again)} queued again "
                f"({len(self.later)} of them once what they wait for has ended)",
                file=sys.stderr,
            )

    def queue_or_wait(self, job: Job) -> None:
        if job.after in self.orphans or job.after in self.later:  # the new server cannot wait for it
            self.later[job.id] = job
        else:
            self.add(job)

    def tick(self) -> None:
        if not self.later:
            return
        self.orphans -= self.done_ids()
        for job in sorted(self.later.values(), key=lambda j: j.id):
            if job.after not in self.orphans and job.after not in self.later:
                del self.later[job.id]
                self.add(job)

    def running_ids(self) -> set[int]:
        """The jobs whose process is alive (each job's command line names this journal and its id)."""
        found = set()
        for pid in _pids():
            words = _cmdline(pid)
            if f"--journal\0{self.journal}\0--id\0".encode() in b"\0".join(words):
                found.add(int(words[words.index(b"--id") + 1]))
        return found

    def add(self, job: Job) -> None:
        self.jobs[job.id] = job
        opts: list[str] = []
        if job.after and job.after in self.ids and job.after not in self.done_ids():
            opts += ["-D", str(self.ids[job.after])]
        self.ids[job.id] = int(self.tsp(*opts, *self.argv(job, GPU_GB)).strip())
        if job.urgent_at is not None:
            self.tsp("-u", str(self.ids[job.id]))
        self.queued_now(job)

    def done_ids(self) -> set[int]:
        return {e["job"] for e in read_journal(self.journal) if e["event"] == "done"}

    def crash(self) -> None:
        """Its server (which holds the queue in memory) killed; with `crash_kind` "machine", every job
        it had started too."""
        if self.crash_kind == "worker":
            mark = f"TS_SOCKET={self.env['TS_SOCKET']}".encode()
            for pid in _pids():
                if _cmdline(pid) == [b"tsp", b"-S", str(GPUS).encode()] and mark in _environ(pid).split(b"\0"):
                    os.kill(pid, signal.SIGKILL)
            return
        self.tsp("-K")
        mine = f"--journal {self.journal} "
        for name in os.listdir("/proc"):
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, ValueError):
                continue
            if name.isdigit() and mine in cmdline:
                try:
                    os.kill(int(name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def finished(self) -> bool:
        return self.done_ids() >= set(self.jobs)

    def stop(self) -> None:
        self.tsp("-K")


# -- one replay, and its figures ---------------------------------------------------------------------


def read_journal(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def replay(runner: Runner, jobs: list[Job], crash_at: float, expected: float, timeout: float) -> dict[str, Any]:
    """Run the trace; times relative to its start. Returns the start, the crash time, the end, and
    when each job was queued. The worker (task-spooler's server) is up when it starts, as a service
    keeps one, and the jobs are queued one after another: a job waits from when it is queued."""
    runner.start()
    runner.ready()
    t0 = time.time()
    for job in jobs:
        if job.urgent_at is None:
            runner.add(job)
    urgent = sorted((j for j in jobs if j.urgent_at is not None), key=lambda j: j.urgent_at or 0)
    crashed, looked = None, 0.0
    while True:
        now = time.time() - t0
        while urgent and now >= (urgent[0].urgent_at or 0) * expected:
            runner.add(urgent.pop(0))
        runner.tick()
        if crashed is None and now >= crash_at * expected:
            runner.crash()
            crashed = time.time() - t0
            runner.start(recover=True)
        if not urgent and crashed is not None and now - looked >= 1.0:
            looked = now
            if runner.finished():
                break
        if now > timeout:
            raise RuntimeError(f"{runner.name}: the week did not end within {timeout:.0f} s")
        time.sleep(0.1)
    end = max(e["t"] for e in read_journal(runner.journal)) - t0
    runner.stop()
    return {"t0": t0, "crash": crashed or 0.0, "end": end, "queued": dict(runner.queued)}


def figures(jobs: list[Job], journal: list[dict[str, Any]], times: dict[str, Any]) -> dict[str, float]:
    t0, crash, end = times["t0"], times["crash"], times["end"]
    by_id = {j.id: j for j in jobs}
    events = sorted(journal, key=lambda e: e["t"])
    # work done twice: steps run again after a first complete run, and steps cut short
    completed: set[tuple[int, int]] = set()
    begun: dict[int, float] = {}
    twice = 0.0
    for e in events:
        job = by_id[e["job"]]
        step_cost = job.seconds / STEPS * job.share
        if e["event"] == "begin":
            begun[job.id] = e["t"]
        elif e["event"] == "end":
            begun.pop(job.id, None)
            if (job.id, e["step"]) in completed:
                twice += step_cost
            completed.add((job.id, e["step"]))
        elif e["event"] in ("cut", "start", "oom", "done") and job.id in begun:
            # a new attempt's start with a step still open: the crash cut it (SIGKILL says nothing)
            cut_at = e["t"] if e["event"] == "cut" else crash + t0
            twice += (cut_at - begun.pop(job.id)) / (job.seconds / STEPS) * step_cost
    for jid, began in begun.items():  # open when the crash came and never started again
        job = by_id[jid]
        twice += (crash + t0 - began) / (job.seconds / STEPS) * job.seconds / STEPS * job.share
    # a GPU idle while a job that could run waited, sampled every 0.1 s: a job waits from when it
    # could run (queued, its dependency done) to its first start, and from an attempt that did not
    # finish it (out of memory, preempted, the crash) to its next start. Queued is when its queueing
    # returned: a job not yet queued waits for nothing.
    runs: dict[int, list[tuple[float, float, Optional[str], str]]] = {}
    opened: dict[int, tuple[float, Optional[str]]] = {}
    for e in events:
        jid = e["job"]
        if e["event"] == "start":
            if jid in opened:  # the one before ended without a word: the crash
                began, gpu = opened.pop(jid)
                runs.setdefault(jid, []).append((began, crash + t0, gpu, "crash"))
            opened[jid] = (e["t"], e["gpu"])
        elif e["event"] in ("oom", "cut", "done") and jid in opened:
            began, gpu = opened.pop(jid)
            runs.setdefault(jid, []).append((began, e["t"], gpu, e["event"]))
    for jid, (began, gpu) in opened.items():
        runs.setdefault(jid, []).append((began, crash + t0, gpu, "crash"))
    done_at = {jid: r[-1][1] for jid, r in runs.items() if r and r[-1][3] == "done"}
    waits: list[tuple[float, float]] = []
    for job in jobs:
        arrive = times["queued"].get(job.id, t0)
        ready = max(arrive, done_at.get(job.after, t0) if job.after else t0)
        mine = sorted(runs.get(job.id, []))
        starts = [r[0] for r in mine]
        waits.append((ready, starts[0] if starts else t0 + end))
        for (_b, ended, _g, how), nxt in zip(mine, starts[1:] + [t0 + end]):
            if how != "done":
                waits.append((ended, nxt))
    attempts = [(b, e, g) for r in runs.values() for b, e, g, _how in r]
    idle_waiting, t, dt = 0.0, t0, 0.1
    while t < t0 + end:
        if any(a <= t < b for a, b in waits):
            busy = {one for began, ended, gpu in attempts if began <= t < ended and gpu for one in gpu.split(",")}
            idle_waiting += (GPUS - len(busy)) * dt
        t += dt
    total, spread, chain = lower_bound(jobs)
    return {
        "makespan": end,
        "bound": max(spread, chain),
        "spread": spread,
        "chain": chain,
        "idle_share": idle_waiting / (GPUS * end),
        "twice": twice,
        "twice_share": twice / total,
        "gpu_seconds": total,
        "oom": sum(1 for e in journal if e["event"] == "oom"),
        "preempted": sum(1 for e in journal if e["event"] == "cut"),
    }


CRASHES = {
    "worker": "one crash of the worker (task-spooler: of its server), started again at once",
    "machine": "one crash of the whole machine (the worker, every supervisor and every job killed)",
}


def describe(jobs: list[Job], crash: str = "worker") -> str:
    """The trace in one line: its jobs, GPU-seconds, lower bound and crash."""
    total, spread, chain = lower_bound(jobs)
    return (
        f"{len(jobs)} jobs ({sum(1 for j in jobs if j.need > j.asked)} run out of memory with what they ask, "
        f"{sum(1 for j in jobs if j.after)} after another, {sum(1 for j in jobs if j.urgent_at is not None)} urgent), "
        f"{total:.0f} GPU-seconds on {GPUS} simulated {GPU_GB} GB GPUs; lower bound {max(spread, chain):.1f} s "
        f"(GPU-seconds / GPUs {spread:.1f} s, longest chain {chain:.1f} s); {CRASHES[crash]}"
    )


def table(results: dict[str, dict[str, float]]) -> list[str]:
    """The figures of each system, a row each (Markdown)."""
    lines = [
        "| | makespan | / lower bound | GPU idle while work waits | work done twice | out-of-memory deaths "
        "| preempted |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, f in results.items():
        lines.append(
            f"| {name} | {f['makespan']:.1f} s | {f['makespan'] / f['bound']:.2f}x | {f['idle_share']:.1%} | "
            f"{f['twice']:.1f} GPU-s ({f['twice_share']:.1%}) | {f['oom']:.0f} | {f['preempted']:.0f} |"
        )
    return lines


def report(
    results: dict[str, dict[str, float]],
    jobs: list[Job],
    argv: list[str],
    load: tuple[float, float],
    wall: float,
    crash: str = "worker",
) -> str:
    lines = [
        "# A researcher's week, replayed (bench/week.py)",
        "",
        f"- command: `python {' '.join(argv)}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; wall time of the run: {wall:.0f} s",
        f"- load average (1 min) before / after: {load[0]:.2f} / {load[1]:.2f}",
        f"- trace: {describe(jobs, crash)}",
        "",
        *table(results),
    ]
    return "\n".join(lines) + "\n"


def run_week(
    jobs: list[Job], names: list[str], src: Optional[Path] = None, keep: bool = False, crash: str = "worker"
) -> dict[str, dict[str, float]]:
    """Replay `jobs` through each of `names` ("gpuq", "tsp") in turn, each in a directory of its
    own (removed unless `keep`), and compute each one's figures from its journal. `src`: the gpuq
    under test, a compiled copy of its package (systems.snapshot_gpuq); None: one is made here."""
    scratch = None
    if "gpuq" in names and src is None:
        # Without it, where PYTHONDONTWRITEBYTECODE is set, each of gpuq's processes (every add, the
        # worker, each supervisor) compiled gpuq from source: seconds of GPU idle a user never sees.
        from systems import snapshot_gpuq

        scratch = Path(tempfile.mkdtemp(prefix="week-gpuq-src-"))
        src = snapshot_gpuq(scratch)
    SNAPSHOT["src"] = src
    _total, spread, chain = lower_bound(jobs)
    expected = max(spread, chain)
    results = {}
    try:
        for runner_cls in (Gpuq, Tsp):
            if runner_cls.name not in names:
                continue
            root = Path(tempfile.mkdtemp(prefix=f"week-{runner_cls.name}-"))
            runner = runner_cls(root, root / "journal")
            runner.crash_kind = crash
            try:
                times = replay(runner, jobs, 0.45, expected, timeout=expected * 8 + 120)
            finally:
                runner.stop()
            times["expected"] = expected
            results[runner_cls.name] = figures(jobs, read_journal(runner.journal), times)
            if keep:
                (root / "times.json").write_text(json.dumps(times))
                print(f"{runner_cls.name}: journal, times.json and spool kept in {root}", file=sys.stderr)
            else:
                shutil.rmtree(root, ignore_errors=True)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="durations times this (1: 4-60 s)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", choices=("gpuq", "tsp"), help="one system only")
    parser.add_argument("--out", help="write the report (markdown) here too")
    parser.add_argument(
        "--crash", choices=tuple(CRASHES), default="worker",
        help="what goes down once: the worker (the issue's week) or the whole machine",
    )  # fmt: skip
    parser.add_argument(
        "--keep", action="store_true", help="keep each system's directory (its journal, spool and logs) and say where"
    )
    args = parser.parse_args()
    if shutil.which("tsp") is None and args.only != "gpuq":
        print("task-spooler (tsp) is not installed: apt-get install task-spooler, or --only gpuq", file=sys.stderr)
        return 1
    jobs = trace(args.seed, args.scale)
    load0, started = os.getloadavg()[0], time.time()
    results = run_week(jobs, [args.only] if args.only else ["gpuq", "tsp"], keep=args.keep, crash=args.crash)
    text = report(results, jobs, sys.argv, (load0, os.getloadavg()[0]), time.time() - started, args.crash)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
