"""The queues under test, behind one small interface: gpuq, task-spooler (tsp) and nq.

Each system lives in its own temporary directory (GPUQ_HOME, TS_SOCKET/TMPDIR, NQDIR), so the
benchmark never touches a user's real queue. Processes are found and stopped by their pid only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from common import BenchError, alive, pids_with_env, timed_run, wait_for

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PEER_PACKAGES = {"tsp": "task-spooler", "nq": "nq"}
SOURCE = {"parent": REPO}  # where the gpuq under test is imported from (see snapshot_gpuq)
# The venv of bench/honest.py: gpuq's commands run as its `gpuq` entry point, and the baseline is its
# `python -c pass`. None (--no-venv, or no venv could be built): `python -m gpuq` of this interpreter.
VENV: dict[str, Optional[Path]] = {"path": None}


def bare_python() -> list[str]:
    """The baseline every gpuq command is compared with: the same interpreter doing nothing."""
    venv = VENV["path"]
    return [str(venv / "bin" / "python") if venv else sys.executable, "-c", "pass"]


def snapshot_gpuq(root: Path) -> Path:
    """Copy gpuq's package to `root` and compile its bytecode there, as an installed package has
    it. The copy keeps edits made to the checkout during the run out of it, and compiling matters:
    with PYTHONDONTWRITEBYTECODE set, every command would otherwise recompile gpuq from source."""
    import compileall

    target = root / "src"
    shutil.copytree(REPO / "gpuq", target / "gpuq", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if not compileall.compile_dir(str(target / "gpuq"), quiet=1):
        raise BenchError(f"could not compile gpuq in {target}")
    SOURCE["parent"] = target
    sys.path.insert(0, str(target))
    return target


class System:
    """A queue with a resident part (or none), a submit command and a list command."""

    name = "?"
    marker = ""  # environment variable whose value identifies this instance's processes
    max_queued: Optional[int] = None  # the most jobs it can hold waiting, where it has a limit

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.work = root / "work"
        self.work.mkdir(exist_ok=True)
        self.env = dict(os.environ)

    # -- commands every system has --
    def add_argv(self, cmd: list[str]) -> list[str]:
        raise NotImplementedError

    def list_argv(self) -> list[str]:
        raise NotImplementedError

    def add(self, cmd: list[str]) -> str:
        """Submit `cmd`; returns the system's job id."""
        _elapsed, out = timed_run(self.add_argv(cmd), self.env, self.work)
        return out.strip().splitlines()[-1].strip()

    def start(self) -> None:
        """Start the resident part (if any) and return once it is idle and ready."""

    def wait_done(self, job_id: str, timeout: float = 60.0) -> None:
        raise NotImplementedError

    def wait_all_done(self, last_id: str, count: int, timeout: float = 600.0) -> None:
        raise NotImplementedError

    def queue_pids(self) -> list[int]:
        """Every process of this queue instance except the jobs themselves (which run `sleep`)."""
        return [p for p in pids_with_env(self.marker, self.env[self.marker]) if _comm(p) not in ("sleep", "bash")]

    def stop(self) -> None:
        """Kill everything this instance started (its processes carry our marker variable)."""
        for pid in pids_with_env(self.marker, self.env[self.marker]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Gpuq(System):
    """gpuq run from `venv` (default: the checkout's, bench/honest.py). A compared gpuq (`run.py
    --compare REV`, `name` "gpuq@REV") has its own venv, spool and worker; whatever the benchmark
    writes into its spool by library (lib) is written by its own gpuq, in its venv's python. Reads
    (job states, directory listings) use the checkout's library: gpuq reads every older spool."""

    name = "gpuq"
    marker = "GPUQ_HOME"

    def __init__(self, root: Path, venv: Optional[Path] = None, name: str = "gpuq"):
        super().__init__(root)
        from gpuq.spool import Spool

        self.name = name
        self.home = root / "spool"
        self.env.update(GPUQ_HOME=str(self.home))
        self.venv = venv or VENV["path"]
        self.own = venv is None  # the gpuq under test: its library is the one imported here
        if self.venv is not None:  # as a user runs it: the entry point, with the venv's own sys.path
            self.env.pop("PYTHONPATH", None)
            self.cli = [str(self.venv / "bin" / "gpuq")]
        else:
            self.env["PYTHONPATH"] = str(SOURCE["parent"])
            self.cli = [sys.executable, "-m", "gpuq"]
        self.lib(ensure_spool, str(self.home))
        self.spool = Spool(self.home)
        self.worker: Optional[subprocess.Popen] = None

    def lib(self, func: Callable[..., Any], *args: Any) -> Any:
        """`func(*args)` (a bench module's function of plain JSON values) with this gpuq's own
        library: here for the gpuq under test, else in its venv's python (isolated: no PYTHONPATH,
        no current directory on its path), its result passed back as JSON."""
        if self.own:
            return func(*args)
        code = (
            f"import json, sys; sys.path.insert(0, {str(BENCH)!r}); from {func.__module__} import {func.__name__}; "
            f"print(json.dumps({func.__name__}(*json.loads(sys.argv[1]))))"
        )
        assert self.venv is not None
        proc = subprocess.run(
            [str(self.venv / "bin" / "python"), "-I", "-c", code, json.dumps(args)],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise BenchError(f"{self.name}: {func.__name__} failed: {proc.stderr.strip()[-500:]}")
        return json.loads(proc.stdout.splitlines()[-1])

    def simulate_gpus(self, count: int) -> None:
        """Before start(): this queue's machine has `count` idle simulated GPUs (README, "Simulated
        GPUs"): the worker and every command read them from a file instead of NVML."""
        import zlib

        machine = format(zlib.crc32(str(self.root).encode()), "08x")
        gpus = [
            {
                "index": n,
                "name": "Fake H100",
                "uuid": f"GPU-fake-{machine}-{n}",  # leases go by UUID: each queue's GPUs are its own
                "memory_total_mib": 81559,
                "memory_used_mib": 0,
                "processes": [],
            }
            for n in range(count)
        ]
        path = self.root / "gpus.json"
        path.write_text(json.dumps({"gpus": gpus}))
        self.env["GPUQ_FAKE_GPUS"] = str(path)

    def add_argv(self, cmd: list[str]) -> list[str]:
        return [*self.cli, "add", "-q", *cmd]

    def list_argv(self) -> list[str]:
        return [*self.cli, "status"]

    def start(self) -> None:
        out = open(self.root / "worker.out", "ab")
        self.worker = subprocess.Popen(
            [*self.cli, "run", "--watch"],
            cwd=self.work,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        wait_for(lambda: self.spool.workers.live(), 30, "the gpuq worker to register")

    def state(self, job_id: str) -> Optional[str]:
        ref = self.spool.jobs.find(int(job_id))
        return ref.state if ref else None

    def wait_done(self, job_id: str, timeout: float = 60.0) -> None:
        from gpuq.core.states import FINISHED

        wait_for(lambda: self.state(job_id) in FINISHED, timeout, f"gpuq job {job_id} to finish")

    def wait_all_done(self, last_id: str, count: int, timeout: float = 600.0) -> None:
        wait_for(lambda: len(self.spool.jobs.names("done")) >= count, timeout, f"{count} gpuq jobs to finish", 0.005)

    def enqueue_many(self, cmd: list[str], count: int) -> str:
        """Queue `count` jobs through gpuq's own library (what `gpuq add` calls), without paying
        an interpreter start per job: the throughput and idle runs measure the worker, not add."""
        return self.lib(enqueue_at, str(self.home), str(self.work), cmd, count, dict(self.env))

    def queue_pids(self) -> list[int]:
        return [self.worker.pid] if self.worker and alive(self.worker.pid) else []

    def supervisor_only_pids(self) -> list[int]:
        """The running jobs' supervisors and the spare (python processes of this spool other than
        the worker; they name themselves `gpuq-...`)."""
        worker = self.worker.pid if self.worker else -1
        ours = [p for p in pids_with_env(self.marker, str(self.home)) if p != worker]
        return [p for p in ours if _comm(p).startswith(("python", "gpuq-"))]

    def stop(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(10)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait()
        super().stop()


class Tsp(System):
    name = "tsp"
    marker = "TS_SOCKET"
    # Every queued job is a client connected to the server, which accepts about 1,000 at once
    # (measured: the 994th `tsp -B` was refused), whatever TS_MAXCONN says.
    max_queued = 990

    def __init__(self, root: Path):
        super().__init__(root)
        (root / "tmp").mkdir(exist_ok=True)
        # A queue of 1,000 waiting jobs is 1,000 waiting client connections in task-spooler.
        self.env.update(
            TS_SOCKET=str(root / "socket"),
            TMPDIR=str(root / "tmp"),
            TS_SLOTS="1",
            TS_MAXFINISHED="200000",
            TS_MAXCONN="5000",
        )

    def add_argv(self, cmd: list[str]) -> list[str]:
        return ["tsp", *cmd]

    def list_argv(self) -> list[str]:
        return ["tsp", "-l"]

    def start(self) -> None:
        timed_run(["tsp", "-l"], self.env, self.work)  # the first client starts the server
        wait_for(self.queue_pids, 10, "the tsp server")

    def wait_done(self, job_id: str, timeout: float = 60.0) -> None:
        subprocess.run(["tsp", "-w", job_id], env=self.env, capture_output=True, timeout=timeout)

    def wait_all_done(self, last_id: str, count: int, timeout: float = 600.0) -> None:
        self.wait_done(last_id, timeout)  # one slot: jobs finish in order

    def stop(self) -> None:
        subprocess.run(["tsp", "-K"], env=self.env, capture_output=True, timeout=30)
        super().stop()


class Nq(System):
    name = "nq"
    marker = "NQDIR"

    def __init__(self, root: Path):
        super().__init__(root)
        self.env["NQDIR"] = str(root / "q")

    def add_argv(self, cmd: list[str]) -> list[str]:
        return ["nq", *cmd]

    def list_argv(self) -> list[str]:
        return ["fq", "-nq"]  # the queued and running jobs' command lines, without following

    def wait_done(self, job_id: str, timeout: float = 60.0) -> None:
        subprocess.run(["nq", "-w", job_id], env=self.env, capture_output=True, timeout=timeout)

    def wait_all_done(self, last_id: str, count: int, timeout: float = 600.0) -> None:
        subprocess.run(["nq", "-w"], env=self.env, capture_output=True, timeout=timeout)


def ensure_spool(home: str) -> None:
    from gpuq.spool import Spool

    Spool(Path(home)).ensure()


def enqueue_at(home: str, work: str, cmd: list[str], count: int, env: dict[str, str]) -> str:
    """Gpuq.enqueue_many, in the library of the gpuq that owns `home`."""
    from gpuq.engine.lifecycle import enqueue
    from gpuq.spool import Spool

    spool = Spool(Path(home))
    last = ""
    for _ in range(count):
        _ref, job = enqueue.enqueue(
            spool,
            cmd=cmd,
            cwd=Path(work),
            name=None,
            venv=None,
            env={},
            shell_env=env,
            after=[],
            after_any=[],
            retries=0,
        )
        last = str(job["id"])
    return last


def forget_pending(home: str, job_id: int) -> bool:
    """Remove a pending job a timed `gpuq add` queued (no worker takes it), so that the next sample
    sees the same queue; False if it was not pending."""
    from gpuq.spool import Spool

    spool = Spool(Path(home))
    ref = spool.jobs.find(job_id, ("pending",))
    if ref is None:
        return False
    spool.jobs.remove(ref)
    return True


# ---- versions and installation ----------------------------------------------------------------
def version_of(system: str) -> str:
    if system in COMPARED:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", system.split("@", 1)[1]], capture_output=True, text=True
        ).stdout.strip()
        return f"{system} ({commit}, venv {COMPARED[system]})"
    if system == "gpuq":
        import gpuq

        commit = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True
        ).stdout.strip()
        return f"gpuq {gpuq.__version__}" + (f" ({commit})" if commit else "")
    package = PEER_PACKAGES[system]
    if shutil.which("dpkg-query"):
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout:
            return f"{package} {out.stdout}"
    return f"{system} (version unknown)"


def install_peers(wanted: list[str], allow_install: bool) -> dict[str, str]:
    """Make each wanted peer available; returns {peer: reason} for those that are not."""
    missing = [p for p in wanted if shutil.which(p) is None]
    if missing and allow_install and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300)
        for peer in missing:
            subprocess.run(
                ["apt-get", "install", "-y", "-qq", PEER_PACKAGES[peer]], env=env, capture_output=True, timeout=300
            )
    skipped = {}
    for peer in wanted:
        if shutil.which(peer) is None:
            how = "apt-get install failed" if allow_install and os.geteuid() == 0 else "not root or no apt-get"
            skipped[peer] = f"`{peer}` not found and could not be installed ({how})"
    return skipped


PEERS = {"tsp": Tsp, "nq": Nq}
COMPARED: dict[str, Path] = {}  # "gpuq@REV" -> its venv (run.py --compare REV)


def make(name: str, root: Path) -> System:
    if name in COMPARED:
        return Gpuq(root, COMPARED[name], name)
    return Gpuq(root) if name == "gpuq" else PEERS[name](root)


def settle(seconds: float) -> None:
    """Let the queues go idle before a timing window (pacing of the benchmark, not a wait for a
    condition: there is no event that says "a process has become idle")."""
    time.sleep(seconds)


__all__ = ["BenchError", "System", "Gpuq", "Tsp", "Nq", "install_peers", "make", "version_of", "settle"]
