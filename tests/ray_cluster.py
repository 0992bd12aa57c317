"""A real one-node Ray cluster for tests, on loopback with ports and a temporary directory of its own
(recipe: /work/shared/notes/ray-and-browser-facts.md).

- `ray_head` (pytest fixture, module scope): the running head, started with `ray start --head
  --num-gpus 2 --block` (GPUs Ray only declares: a job asking for one gets CUDA_VISIBLE_DEVICES);
  skips with the reason when the `ray` CLI is missing or the head does not start.
- The `ray` CLI is found in $GPUQ_TEST_RAY (the program), else /tmp/gpuq-ray-venv/bin/ray (where
  `.ci/run` installs `ray[default]` in a venv of its own), else on PATH.
- `stop()` ends the `--block` process, then every process left whose command line names this
  cluster's temporary directory: `ray stop` would end every Ray process on the machine.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

import pytest

VENV_RAY = "/tmp/gpuq-ray-venv/bin/ray"
INSTALL = "python3 -m venv /tmp/gpuq-ray-venv && /tmp/gpuq-ray-venv/bin/pip install 'ray[default]'"
START_TIMEOUT = 90.0
GPUS = 2


class RayUnavailable(Exception):
    pass


def ray_program() -> Optional[str]:
    for candidate in (os.environ.get("GPUQ_TEST_RAY"), VENV_RAY, shutil.which("ray")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_env() -> dict[str, str]:
    """Ray kept on loopback (without the first it binds and advertises the machine's other address)
    and quiet about usage statistics."""
    return dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _live_node(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v0/nodes", timeout=2) as answer:
            rows = json.load(answer)["data"]["result"]["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return any(row.get("state") == "ALIVE" for row in rows)


class RayHead:
    def __init__(self, program: str):
        self.temp = Path(tempfile.mkdtemp(prefix="gq-ray-", dir="/tmp"))  # short: socket paths are limited
        self.dashboard_port = free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        low = random.randrange(20000, 29000, 100)
        ports = {
            "--port": free_port(),
            "--dashboard-port": self.dashboard_port,
            "--ray-client-server-port": free_port(),
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
            "--metrics-export-port": free_port(),
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--runtime-env-agent-port": free_port(),
            "--min-worker-port": low,
            "--max-worker-port": low + 99,
        }
        argv = [program, "start", "--head", "--block", "--num-gpus", str(GPUS), "--num-cpus", "4"]
        argv += ["--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1", "--disable-usage-stats"]
        argv += ["--include-dashboard", "true", "--temp-dir", str(self.temp), "--object-store-memory", "100000000"]
        for option, port in ports.items():
            argv += [option, str(port)]
        self.out = open(self.temp / "start.out", "wb")
        self.proc = subprocess.Popen(
            argv, env=ray_env(), stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not (_live_node(self.address) and _answers(f"{self.address}/api/jobs/")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.temp / "start.out").read_text(errors="replace")[-2000:]
                self.stop()
                raise RayUnavailable(f"ray start --head did not come up: {tail}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for _round in range(20):
            left = self._ours()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL if _round else signal.SIGTERM)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        self.out.close()
        shutil.rmtree(self.temp, ignore_errors=True)

    def _ours(self) -> list[int]:
        """Processes whose command line or environment names this cluster's temporary directory or
        dashboard port (the jobs it started carry RAY_ADDRESS-like variables of their own)."""
        marks = (str(self.temp).encode(), f"127.0.0.1:{self.dashboard_port}".encode())
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    text = fh.read()
                with open(f"/proc/{name}/environ", "rb") as fh:
                    text += fh.read()
            except OSError:
                continue
            if any(mark in text for mark in marks):
                found.append(int(name))
        return found


@pytest.fixture(scope="module")
def ray_head() -> Iterator[RayHead]:
    program = ray_program()
    if program is None:
        pytest.skip(f"the ray CLI is not installed (set GPUQ_TEST_RAY, or: {INSTALL})")
    try:
        head = RayHead(program)
    except RayUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield head
    finally:
        head.stop()
