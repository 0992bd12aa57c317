"""A real single-node Slurm for tests: munge, slurmctld and slurmd in a temporary directory, on
loopback with ports of their own, without touching /etc (recipe: /work/shared/notes/slurm-facts.md).

- `slurm` (pytest fixture, session scope): the running cluster, booted once per test session
  (about 7 s); skips with the reason when the binaries are missing, when not root, or when it does
  not start. Load it with `pytest_plugins = ["slurm_cluster"]` (a test module) or
  `from slurm_cluster import slurm  # noqa: F401` (conftest.py).
- `unavailable_reason() -> Optional[str]`: why no cluster can be started here (None: it can).
- `start_cluster(root, gpus=2) -> SlurmCluster`, raising `ClusterUnavailable`.
- `SlurmCluster`: `env` (for subprocesses: SLURM_CONF), `conf_dir`, `conf_path`, `node`, `gpus`
  (fake GPUs the node offers: `--gres=gpu:N` works; 0 when that could not be set up),
  `conf_variant(name, **keys)` (a copy of slurm.conf with some keys changed), `logs()`, `stop()`.

The fake GPUs are `/dev/null` and `/dev/zero` declared as `gres/gpu` devices: with
`TaskPlugin=task/none` nothing restricts device access, and Slurm sets CUDA_VISIBLE_DEVICES=0,1 for
a `--gres=gpu:2` job. `stop()` cancels every job, stops the daemons by their pid files, then kills
any process left whose environment names this cluster's SLURM_CONF (job processes, slurmstepd).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
from conftest import wait_for

BINARIES = ("munged", "mungekey", "munge", "unmunge", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")
BINARIES += ("scancel", "sinfo", "sacct")
APT_LINE = "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
START_TIMEOUT = 30.0
FAKE_GPU_FILES = ("/dev/null", "/dev/zero")


class ClusterUnavailable(Exception):
    """The cluster could not be started (the message says why)."""


def unavailable_reason() -> Optional[str]:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"Slurm/munge binaries missing ({', '.join(missing)}): {APT_LINE}"
    if os.geteuid() != 0:
        return "a test Slurm cluster needs root (SlurmUser=root, slurmd starts jobs)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    try:
        return wait_for(cond, timeout, interval=0.1, what=what)
    except AssertionError as exc:  # a cluster that never came up is a reason to skip, not a failure
        raise ClusterUnavailable(str(exc)) from None


class SlurmCluster:
    def __init__(self, root: Path, gpus: int):
        self.root = root
        self.conf_dir = root / "etc"
        self.conf_path = self.conf_dir / "slurm.conf"
        self.gpus = gpus
        self.node = ""
        self.keys: dict[str, str] = {}
        self.env = dict(os.environ, SLURM_CONF=str(self.conf_path))
        self.env.pop("SLURM_JOB_ID", None)  # a test session inside a Slurm job must not confuse the clients
        self.pid_files = [root / "slurmd.pid", root / "slurmctld.pid", root / "munge" / "munged.pid"]

    # -- starting --
    def start(self) -> None:
        for sub in ("etc", "state", "spool", "munge", "log"):
            (self.root / sub).mkdir(mode=0o755, exist_ok=True)
        os.chmod(self.root, 0o711)
        os.chmod(self.root / "munge", 0o711)  # munged refuses a socket directory others cannot traverse
        self._start_munge()
        self._write_conf()
        self._daemon(["slurmctld", "-f", str(self.conf_path), "-c"])  # -c: no old jobs, ids from 1
        self._daemon(["slurmd", "-f", str(self.conf_path), "-N", self.node])
        _wait(self._node_ready, START_TIMEOUT, f"node {self.node} to be idle")
        # An idle node is not yet a scheduling one: the first job is the real readiness check.
        probe = self._sbatch(["--wrap", "true", "-o", "/dev/null", "-J", "gpuq-probe"])
        _wait(lambda: self._job_state(probe) == "COMPLETED", START_TIMEOUT, "a first job to complete")

    def _sbatch(self, args: list[str]) -> int:
        proc = subprocess.run(["sbatch", "--parsable", *args], env=self.env, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise ClusterUnavailable(f"sbatch failed: {proc.stderr.strip()[:300]}")
        return int(proc.stdout.strip().split(";")[0])

    def _job_state(self, job_id: int) -> str:
        argv = ["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T"]
        state = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30).stdout.strip()
        if state in ("FAILED", "CANCELLED", "NODE_FAIL"):
            raise ClusterUnavailable(f"the first job ended {state}")
        return state

    def _start_munge(self) -> None:
        m = self.root / "munge"
        self._daemon(["mungekey", "--create", f"--keyfile={m / 'munge.key'}"])
        self._daemon(
            [
                "munged",
                f"--socket={m / 'munge.socket'}",
                f"--key-file={m / 'munge.key'}",
                f"--pid-file={m / 'munged.pid'}",
                f"--log-file={m / 'munged.log'}",
                f"--seed-file={m / 'munged.seed'}",
            ]
        )
        cred = subprocess.run(["munge", "-S", str(m / "munge.socket"), "-n"], capture_output=True, timeout=10)
        check = subprocess.run(["unmunge", "-S", str(m / "munge.socket")], input=cred.stdout, capture_output=True)
        if check.returncode != 0:
            raise ClusterUnavailable(f"munge does not work: {check.stderr.decode(errors='replace').strip()}")

    def _daemon(self, argv: list[str]) -> None:
        """Run a command that daemonizes (or just runs) and must succeed."""
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise ClusterUnavailable(f"{argv[0]} failed: {(proc.stderr or proc.stdout).strip()[:300]}")

    def _node_line(self) -> str:
        """`slurmd -C`'s node line, on loopback, with RealMemory lowered ~5% (a node that claims
        more memory than it reports is marked invalid)."""
        out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
        words = out.splitlines()[0].split()
        for i, word in enumerate(words):
            if word.startswith("NodeName="):
                self.node = word.split("=", 1)[1]
            if word.startswith("RealMemory="):
                words[i] = f"RealMemory={max(1, int(int(word.split('=', 1)[1]) * 0.95))}"
        if not self.node:
            raise ClusterUnavailable(f"slurmd -C gave no node line: {out.strip()[:200]}")
        gres = [f"Gres=gpu:{self.gpus}"] if self.gpus else []
        return " ".join(words + ["NodeAddr=127.0.0.1", *gres])

    def _write_conf(self) -> None:
        r = self.root
        host = socket.gethostname().split(".")[0]
        (self.conf_dir / "plugstack.conf").write_text("")
        self.keys = {
            "ClusterName": "gpuqtest",
            "SlurmctldHost": f"{host}(127.0.0.1)",
            "SlurmctldPort": str(free_port()),
            "SlurmdPort": str(free_port()),
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            # cred_expire: how long a requeued job waits (BeginTime) before it may run again
            "AuthInfo": f"socket={r / 'munge' / 'munge.socket'},cred_expire=10",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "StateSaveLocation": str(r / "state"),
            "SlurmdSpoolDir": str(r / "spool"),
            "SlurmctldPidFile": str(r / "slurmctld.pid"),
            "SlurmdPidFile": str(r / "slurmd.pid"),
            "SlurmctldLogFile": str(r / "log" / "slurmctld.log"),
            "SlurmdLogFile": str(r / "log" / "slurmd.log"),
            "ProctrackType": "proctrack/pgid",  # linuxproc let a job's background child outlive it
            "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/filetxt",
            "JobCompLoc": str(r / "log" / "jobcomp.txt"),
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "SchedulerParameters": "batch_sched_delay=0,sched_min_interval=0",
            "MinJobAge": "5",  # finished jobs are forgotten within seconds: sacct's fallback gets tested
            "KillWait": "5",
            "MpiDefault": "none",
            "ReturnToService": "2",
            "MailProg": "/bin/true",
            "PlugStackConfig": str(self.conf_dir / "plugstack.conf"),
        }
        if self.gpus:
            self.keys["GresTypes"] = "gpu"
            files = FAKE_GPU_FILES[: self.gpus]
            (self.conf_dir / "gres.conf").write_text("".join(f"Name=gpu File={f}\n" for f in files))
        tail = [self._node_line(), "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"]
        self.conf_path.write_text(self._render(self.keys, tail))
        self.tail = tail

    @staticmethod
    def _render(keys: dict[str, str], tail: list[str]) -> str:
        return "".join(f"{k}={v}\n" for k, v in keys.items()) + "".join(line + "\n" for line in tail)

    def conf_variant(self, name: str, **changes: str) -> Path:
        """A copy of slurm.conf (in the same directory, so gres.conf is found) with some keys changed."""
        path = self.conf_dir / name
        path.write_text(self._render(dict(self.keys, **changes), self.tail))
        return path

    def _node_ready(self) -> bool:
        proc = subprocess.run(
            ["sinfo", "-h", "-n", self.node, "-o", "%T|%E"], env=self.env, capture_output=True, text=True, timeout=30
        )
        state, _, reason = proc.stdout.strip().partition("|")
        if state.startswith(("inval", "drain")):
            raise ClusterUnavailable(f"node {self.node} is {state}: {reason}")
        return state == "idle"

    # -- looking, stopping --
    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-30:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self) -> None:
        if self.conf_path.exists() and (self.root / "slurmctld.pid").exists():
            subprocess.run(["scancel", "-u", str(os.getuid())], env=self.env, capture_output=True, timeout=30)
        for pid_file in self.pid_files:
            _stop_by_pid_file(pid_file)
        for pid in _processes_with_env(f"SLURM_CONF={self.conf_path}"):
            _kill(pid, signal.SIGKILL)


def _read_pid(pid_file: Path) -> Optional[int]:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie whose parent has not reaped it yet is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_by_pid_file(pid_file: Path, timeout: float = 10.0) -> None:
    pid = _read_pid(pid_file)
    if pid is None or not _alive(pid):
        return
    _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        _kill(pid, signal.SIGKILL)


def _processes_with_env(entry: str) -> list[int]:
    """Pids whose environment holds `entry` (e.g. this cluster's SLURM_CONF=...), not ours."""
    needle = entry.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                found.append(int(name))
        except OSError:
            continue
    return found


def start_cluster(root: Path, gpus: int = 2) -> SlurmCluster:
    """Boot a cluster under `root` (an empty directory). With fake GPUs first; if the node will not
    take them, again without (then `gpus` is 0). Raises ClusterUnavailable, with nothing left running."""
    reason = unavailable_reason()
    if reason:
        raise ClusterUnavailable(reason)
    cluster = SlurmCluster(root, gpus)
    try:
        cluster.start()
        return cluster
    except (ClusterUnavailable, OSError, subprocess.SubprocessError) as exc:
        logs = cluster.logs()
        cluster.stop()
        if gpus:
            retry = root / "no-gres"
            retry.mkdir()
            return start_cluster(retry, 0)
        raise ClusterUnavailable(f"{exc}\n{logs}") from exc


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    # Not pytest's tmp_path: munged wants every directory above its socket traversable by others.
    root = Path(tempfile.mkdtemp(prefix="gpuq-slurm-"))
    try:
        cluster = start_cluster(root)
    except ClusterUnavailable as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"could not start a test Slurm cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
