#!/usr/bin/env python3
"""The timings the tests no longer bound: how long gpuq takes for what the tests check by order and
outcome (a loaded machine stretches every wall-clock figure, so a test that bounds one fails there;
bench/README.md, "Timings the tests leave to the benchmark"). Each measurement runs real processes
in a temporary spool of its own and prints its median, min and max over `--rounds`.

    python bench/latencies.py                          # all of them: about a minute on 2 cores
    python bench/latencies.py --only tail,run_exit --rounds 9

- tail: `eta.observe` at a job's first look (no samples kept) of a 100 MB log and of a one-line log,
  and the last 500 lines of a 1 GiB sparse log as `gpuq log`/the MCP `log_tail` read them.
- run_exit: a foreground `gpuq run` with one `true` queued: from the job's end to the command's return.
- dispatch: a watching worker that ran a job before: `gpuq add` invoked, and returned, -> the job's
  first instruction (below zero when the job starts before `gpuq add` has exited).
- notify: a watching worker whose --notify URL accepts and never answers (GPUQ_NOTIFY_TIMEOUT 10 s):
  the end of one `true` job -> the end of the next, queued behind it; and `gpuq add` -> done of a job
  added while the worker's own queue-empty message hangs.
- placing: a GPU's placing lock held by another process: how long `LeaseDir.placing(timeout=0.3)` takes
  to give up.
- giveback: a GPU job given back by its supervisor for a lease taken while it waited for the placing
  lock: the lease taken -> `gpuq status --json` names it as the reason the job waits.
- idle: an idle watching worker after a burst of three jobs, once it has settled: CPU seconds a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import BenchError, cpu_seconds, machine_info, wait_for  # noqa: E402

from gpuq.core.times import parse_iso  # noqa: E402

MEASURES = ("tail", "run_exit", "dispatch", "notify", "placing", "giveback", "idle")


class Queue:
    """A temporary spool driven as a user drives it: `python -m gpuq` of this checkout."""

    def __init__(self, root: Path, **env: str) -> None:
        self.root, self.home, self.work = root, root / "spool", root / "work"
        self.work.mkdir(parents=True)
        self.env = dict(os.environ, GPUQ_HOME=str(self.home), GPUQ_LEASE_DIR=str(root / "leases"), **env)
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        self.worker: Optional[subprocess.Popen] = None

    def gpuq(self, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuq", *args], cwd=self.work, env=self.env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        if proc.returncode != 0:
            raise BenchError(f"gpuq {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        return proc.stdout

    def add(self, *args: str) -> int:
        return int(self.gpuq("add", "-q", *args).strip())

    def start(self, *args: str) -> subprocess.Popen:
        out = open(self.root / "worker.out", "ab")
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "gpuq", "run", "--watch", *args], cwd=self.work, env=self.env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        out.close()
        wait_for(lambda: (self.home / "workers").is_dir() and self._registered(), 60, "the worker to register")
        return self.worker

    def _registered(self) -> bool:
        return any(n.startswith("worker-") for n in os.listdir(self.home / "workers"))

    def job(self, job_id: int) -> dict[str, Any]:
        """The job's file, with its state (done first: a move writes the new copy before it
        removes the old one); {} while it is nowhere to be read."""
        for state in ("done", "failed", "running", "pending"):
            where = self.home / state
            for name in os.listdir(where) if where.is_dir() else []:
                if name.startswith(f"{job_id:06d}-"):
                    try:
                        return dict(json.loads((where / name).read_text()), state=state)
                    except (OSError, ValueError):
                        continue
        return {}

    def finished_at(self, job_id: int, timeout: float = 60) -> float:
        job = wait_for(lambda: self.job(job_id).get("state") == "done" and self.job(job_id), timeout, f"job {job_id}")
        return float(parse_iso(job["finished_at"]) or 0.0)

    def close(self) -> None:
        """Stop the worker, then kill by pid whatever of this spool still runs."""
        if self.worker is not None and self.worker.poll() is None:
            self.worker.terminate()
            try:
                self.worker.wait(20)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait()
        running = self.home / "running"
        for name in os.listdir(running) if running.is_dir() else []:
            try:
                os.killpg(json.loads((running / name).read_text())["pid"], signal.SIGKILL)
            except (OSError, ValueError, KeyError, TypeError):
                continue


def rounds_of(measure: Callable[[Path], float], rounds: int) -> list[float]:
    values = []
    for _ in range(rounds):
        root = Path(tempfile.mkdtemp(prefix="gpuq-latency-"))
        try:
            values.append(measure(root))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return values


# ---- the measurements ---------------------------------------------------------------------------
def tail(rounds: int) -> dict[str, list[float]]:
    from gpuq.core.job import Job
    from gpuq.engine.lifecycle import enqueue
    from gpuq.engine.tracking import eta
    from gpuq.spool import Spool

    root = Path(tempfile.mkdtemp(prefix="gpuq-latency-"))
    try:
        spool, work = Spool(root / "spool").ensure(), root / "work"
        work.mkdir()
        common = dict(cwd=work, name=None, venv=None, env={}, shell_env={}, after=[], after_any=[], retries=0)
        jobs = {
            size: Job(enqueue.enqueue(spool, cmd=["true"], **common)[1]) for size in ("100 MB", "one line", "1 GiB")
        }
        with open(spool.logs.path_of(jobs["100 MB"]), "wb") as fh:
            for _ in range(100):
                fh.write((b"x" * 1023 + b"\n") * 1024)
            fh.write(b"Step 40/100\n")
        Path(spool.logs.path_of(jobs["one line"])).write_text("Step 40/100\n")
        with open(spool.logs.path_of(jobs["1 GiB"]), "wb") as fh:
            fh.truncate(1 << 30)  # sparse: a GiB of NULs without a line break
            fh.seek(0, os.SEEK_END)
            fh.write(b"\nthe last line\n")
        out: dict[str, list[float]] = {}
        for name, call in (
            ("observe, 100 MB log", lambda: eta.observe(spool, jobs["100 MB"], {})),
            ("observe, one-line log", lambda: eta.observe(spool, jobs["one line"], {})),
            ("500 lines of a 1 GiB log", lambda: spool.logs.tail_lines(jobs["1 GiB"], 500)),
        ):
            out[name] = []
            for _ in range(rounds):
                began = time.perf_counter()
                call()
                out[name].append(time.perf_counter() - began)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_exit(root: Path) -> float:
    queue = Queue(root)
    job_id = queue.add("true")
    queue.gpuq("run")
    returned = time.time()
    return returned - queue.finished_at(job_id, 5)


def _stamped(path: Path) -> float:
    """The epoch seconds a job wrote there with bash's $EPOCHREALTIME (no fork before the clock)."""
    text = wait_for(lambda: path.exists() and path.read_text().endswith("\n") and path.read_text(), 60, path.name)
    return float(text.strip().replace(",", "."))


def dispatch(rounds: int) -> dict[str, list[float]]:
    """One watching worker, warmed by a first job (its spare ready), then one add at a time."""
    root = Path(tempfile.mkdtemp(prefix="gpuq-latency-"))
    queue = Queue(root)
    try:
        queue.start()
        queue.finished_at(queue.add("true"))
        invoked: list[float] = []
        returned: list[float] = []  # below zero when the job starts before `gpuq add` has exited
        for n in range(rounds):
            stamp = queue.work / f"stamp{n}"
            began = time.time()
            queue.add("bash", "-c", f'echo "$EPOCHREALTIME" > {stamp}')
            ended = time.time()
            started = _stamped(stamp)
            invoked.append(started - began)
            returned.append(started - ended)
        return {
            "`gpuq add` invoked -> first instruction": invoked,
            "`gpuq add` returned -> first instruction": returned,
        }
    finally:
        queue.close()
        shutil.rmtree(root, ignore_errors=True)


class Hanging:
    """A receiver that accepts connections, reads what comes, and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.seen: list[bytes] = []  # each connection's bytes so far
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            self.seen.append(b"")
            threading.Thread(target=self._read, args=(conn, len(self.seen) - 1), daemon=True).start()

    def _read(self, conn: socket.socket, at: int) -> None:
        try:
            while chunk := conn.recv(65536):
                self.seen[at] += chunk
        except (OSError, IndexError):
            pass

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def notify(rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"job end -> next job's end": [], "add -> done, worker's message hanging": []}
    for _ in range(rounds):
        root, hanging = Path(tempfile.mkdtemp(prefix="gpuq-latency-")), Hanging()
        queue = Queue(root, GPUQ_NOTIFY_TIMEOUT="10")
        try:
            queue.start("--notify", f"json://127.0.0.1:{hanging.port}/x?rto=60")
            first, second = queue.add("true"), queue.add("true")
            ends = [queue.finished_at(job) for job in (first, second)]
            out["job end -> next job's end"].append(ends[1] - ends[0])
            said = hanging.seen
            wait_for(lambda: any(b"queue_empty" in r for r in said), 30, "the queue-empty message")  # noqa: B023
            added = time.time()
            out["add -> done, worker's message hanging"].append(queue.finished_at(queue.add("true")) - added)
        finally:
            queue.close()
            hanging.close()
            shutil.rmtree(root, ignore_errors=True)
    return out


def placing(root: Path) -> float:
    from gpuq.system.leases import LeaseDir, LeaseDirProblem

    code = (
        "import fcntl, sys, time\nfrom gpuq.system.lease_io import lock_file\n"
        "fd = lock_file(sys.argv[1], 'GPU-x')\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('READY', flush=True)\ntime.sleep(60)\n"
    )
    leases = LeaseDir.open(root / "leases")
    holder = subprocess.Popen([sys.executable, "-c", code, leases.path], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "READY"
        began = time.monotonic()
        try:
            with leases.placing(["GPU-x"], timeout=0.3):
                raise BenchError("the placing lock was taken although another process held it")
        except LeaseDirProblem:
            return time.monotonic() - began
    finally:
        holder.kill()
        holder.wait()


def _trying_the_lock(lease_dir: Path) -> bool:
    """Whether another process has one of the directory's placing lock files open."""
    prefix = f"{lease_dir}/gpuq-lock."
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix) for fd in os.listdir(f"/proc/{pid}/fd")):
                return True
        except OSError:
            continue
    return False


def giveback(root: Path) -> float:
    from gpuq.system.leases import LeaseDir

    gpus = {"gpus": [{"index": 0, "name": "Fake H100", "uuid": "GPU-fake-0", "memory_total_mib": 81559,
                      "memory_used_mib": 0, "processes": []}]}  # fmt: skip
    (root / "gpus.json").write_text(json.dumps(gpus))
    queue = Queue(root, GPUQ_FAKE_GPUS=str(root / "gpus.json"))
    leases = LeaseDir.open(root / "leases")
    try:
        queue.start()
        with leases.placing(["GPU-fake-0"]):
            job_id = queue.add("true")
            wait_for(lambda: _trying_the_lock(root / "leases"), 60, "the supervisor to wait for the placing lock")
            theirs = leases.take("GPU-fake-0", 0, None, job=12, name="train", spool="/elsewhere")
        taken = time.monotonic()

        def named() -> bool:
            rows = json.loads(queue.gpuq("status", "--json"))
            return "leased whole" in (next(r for r in rows if r["id"] == job_id)["waiting"] or "")

        wait_for(named, 120, "the lease named as the reason", interval=0.01)
        seen = time.monotonic() - taken
        theirs.release()
        return seen
    finally:
        queue.close()


def idle(root: Path, window: float = 30.0) -> float:
    queue = Queue(root)
    try:
        worker = queue.start()
        for _ in range(3):
            queue.finished_at(queue.add("true"))
        time.sleep(6.0)  # the full look and repair a worker takes after its last job are behind it
        before, began = cpu_seconds(worker.pid), time.monotonic()
        time.sleep(window)  # the window measured
        return (cpu_seconds(worker.pid) - before) / (time.monotonic() - began) * 60
    finally:
        queue.close()


# ---- the command --------------------------------------------------------------------------------
def measured(name: str, rounds: int) -> dict[str, list[float]]:
    if name == "tail":
        return tail(rounds)
    if name == "notify":
        return notify(rounds)
    if name == "dispatch":
        return dispatch(rounds)
    single = {
        "run_exit": ("job end -> `gpuq run` returned", run_exit),
        "placing": ("placing(timeout=0.3) gave up after", placing),
        "giveback": ("lease taken -> status names it", giveback),
        "idle": ("CPU seconds a minute (to 0.02: clock ticks)", idle),
    }
    label, measure = single[name]
    return {label: rounds_of(measure, 1 if name == "idle" else rounds)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(MEASURES), help=f"some of {','.join(MEASURES)}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write every sample there")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(MEASURES))
    if unknown:
        parser.error(f"unknown measurement {', '.join(unknown)}; known: {', '.join(MEASURES)}")
    info = machine_info()
    print(f"{info['machine']}; load {os.getloadavg()[0]:.2f}; {info['python']}")
    samples: dict[str, dict[str, list[float]]] = {}
    for name in names:
        samples[name] = measured(name, args.rounds)
        unit = "" if name == "idle" else " s"
        for label, values in samples[name].items():
            print(
                f"{name:9} {label:42} median {statistics.median(values):.4f}{unit}"
                f" (min {min(values):.4f}, max {max(values):.4f}, {len(values)} samples)",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
