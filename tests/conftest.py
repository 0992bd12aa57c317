"""Shared test helpers: a temporary GPUQ_HOME, the real CLI in a subprocess, real workers,
and bounded waits on conditions (never a fixed sleep that hopes)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["slurm_cluster"]  # the `slurm` fixture: a real single-node Slurm (tests/slurm_cluster.py)
STATES = ("pending", "running", "done", "failed", "preempted", "interrupted", "cancelled", "held", "slurm", "ray")


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> Any:
    """Poll `cond` until it returns something truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (one killed but not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# A job that runs until the test writes the file `go` in its working directory (the sleep is the
# child's own pace, not a wait of the test's).
WAIT_FOR_GO = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.02)\n"


class Env:
    """A temporary spool plus helpers that drive gpuq the way a user does."""

    def __init__(self, home: Path, work: Path):
        self.home = home
        self.work = work
        self.env = dict(os.environ, GPUQ_HOME=str(home), GPUQ_INTAKE_QUIET="0.3", PYTHONUNBUFFERED="1")
        self.workers: list[subprocess.Popen] = []

    # -- CLI --
    def gpuq(
        self,
        *args: str,
        cwd: Optional[Path] = None,
        check: bool = True,
        timeout: float = 60,
        input: Optional[str] = None,
        env: Optional[dict] = None,
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuq", *args],
            cwd=cwd or self.work,
            env=env or self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"gpuq {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def add(self, *args: str, cwd: Optional[Path] = None) -> int:
        return int(self.gpuq("add", "-q", *args, cwd=cwd).stdout.strip())

    def status_json(self) -> list[dict]:
        return json.loads(self.gpuq("status", "--json", "-a").stdout)

    # -- spool inspection (plain `ls`, as a user would) --
    def files(self, state: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.home / state) if not n.startswith("."))
        except FileNotFoundError:
            return []

    def state_of(self, job_id: int) -> Optional[str]:
        """The job's state. For the instant of a move (new state written, old not yet unlinked)
        two copies exist; as in the spool's own rule, the copy with the higher rev is the state."""
        try:
            return self.job(job_id)["state"]
        except AssertionError:
            return None

    def job(self, job_id: int) -> dict:
        """The job's file as JSON, with its state; during a move, the later copy (higher rev)."""
        copies = []
        for state in STATES:
            for name in self.files(state):
                if name.startswith(f"{job_id:06d}-"):
                    try:
                        copies.append(dict(json.loads((self.home / state / name).read_text()), state=state))
                    except (OSError, ValueError):
                        continue  # moved on while we looked
        if not copies:
            raise AssertionError(f"no job {job_id}")
        return max(copies, key=lambda job: job.get("rev", 0))

    def wait_state(self, job_id: int, state: str, timeout: float = 15) -> dict:
        wait_for(lambda: self.state_of(job_id) == state, timeout, what=f"job {job_id} to be {state}")
        return self.job(job_id)

    def log(self, job_id: int) -> str:
        path = self.home / "logs" / f"{job_id:06d}.log"
        return path.read_text() if path.exists() else ""

    # -- workers --
    def start_worker(self, *args: str) -> subprocess.Popen:
        out = open(self.work / f"worker-{len(self.workers)}.out", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuq", "run", *args],
            cwd=self.work,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        return proc

    def worker_output(self, index: int = 0) -> str:
        return (self.work / f"worker-{index}.out").read_text()

    def script(self, name: str, body: str, where: Optional[Path] = None) -> Path:
        path = (where or self.work) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        return path

    def cleanup(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        # kill every job still running in this spool so tests never leak processes
        for name in self.files("running"):
            try:
                data = json.loads((self.home / "running" / name).read_text())
            except (OSError, ValueError):
                continue
            for pid in (data.get("pid"), (data.get("supervisor") or {}).get("pid")):
                if pid:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass


def fake_venv(where: Path) -> str:
    """A .venv in `where` whose python records in `where`/venv-used that it was used, then runs the
    real interpreter; its bin/ also has `venvtool`, which prints its VIRTUAL_ENV. Its python's path."""
    bindir = where / ".venv" / "bin"
    bindir.mkdir(parents=True)
    marker = where / "venv-used"
    python = bindir / "python"
    python.write_text(f'#!/bin/sh\necho venv >> {marker}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    tool = bindir / "venvtool"
    tool.write_text('#!/bin/sh\necho "tool from venv: $VIRTUAL_ENV"\n')
    tool.chmod(0o755)
    return str(python)


@pytest.fixture(autouse=True)
def own_lease_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's GPU leases in a directory of its own (GPUQ_LEASE_DIR, made by the first gpuq that
    needs it), for its workers too: simulated GPUs of tests running at once share their UUIDs."""
    path = tmp_path / "leases"
    monkeypatch.setenv("GPUQ_LEASE_DIR", str(path))
    return path


@pytest.fixture
def gq(tmp_path: Path) -> Any:
    work = tmp_path / "work"
    work.mkdir()
    env = Env(tmp_path / "spool", work)
    try:
        yield env
    finally:
        env.cleanup()


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (as mount's option says it) mounted under tmp_path, to fill up on purpose;
    the test is skipped, saying why, where mounting is refused (CI runs as root)."""
    mount = tmp_path / "fs"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.strip() or proc.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill_up(where: Path) -> Path:
    """Take the rest of the filesystem, as another program would."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):  # unbuffered, down to the last byte
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def spool_with_true_jobs(tmp_path: Path, count: int = 1) -> tuple[Any, list[tuple[Any, dict]]]:
    """A fresh spool under tmp_path with `count` queued `true` jobs, queued through the library as
    `gpuq add` queues them: the spool, and (ref, job) of each."""
    from gpuq.engine.lifecycle import enqueue
    from gpuq.spool import Spool

    (tmp_path / "work").mkdir(exist_ok=True)
    spool = Spool(tmp_path / "spool").ensure()
    jobs = [
        enqueue.enqueue(
            spool, cmd=["true"], cwd=tmp_path / "work", name=None, venv=None, env={}, shell_env={},
            after=[], after_any=[], retries=0,
        )
        for _ in range(count)
    ]  # fmt: skip
    return spool, jobs


def cli_probe(gq: Any, watch: str, result: str, *args: str) -> Any:
    """Run the CLI in-process with `args` in gq's work directory and spool, `watch` (code) run
    before gpuq is imported; the value of `result`, an expression over what `watch` set up,
    evaluated once the command has run and before `json` is imported (it may be looked for)."""
    lines = ["import sys", "sys.path.insert(0, sys.argv[1])", watch, "from gpuq.cli import main"]
    lines += ["code = main(sys.argv[2:])", f"result = {result}", "import json", "sys.stdout.flush()"]
    lines += ['print("\\nPROBE " + json.dumps(result))', "raise SystemExit(code)"]
    proc = subprocess.run(
        [sys.executable, "-S", "-c", "\n".join(lines), str(REPO), *args],
        cwd=gq.work,
        env=gq.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.rsplit("PROBE ", 1)[1])


def committed_repo(work: Path, files: dict[str, str]) -> None:
    """`work` made a git repository with `files` (name -> text) in its first commit."""
    for args in (("init", "-q"), ("config", "user.email", "t@t"), ("config", "user.name", "t")):
        subprocess.run(["git", *args], cwd=work, check=True)
    for name, text in files.items():
        (work / name).write_text(text)
    subprocess.run(["git", "add", *files], cwd=work, check=True)
    subprocess.run(["git", "commit", "-qm", "first"], cwd=work, check=True)
