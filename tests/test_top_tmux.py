"""`gpuq top` in a real terminal (issue 29's done-when): tmux on a private socket runs it beside a
real worker with simulated GPUs; the test reads the pane as a person sees it (`capture-pane`) and
presses keys (`send-keys`): the GPU panel and the job rows appear (at 100x30 and at 80x24), Enter
opens the selected job's log, `x` asks before killing and `y` kills (checked in the spool), `q`
leaves and no gpuq top process is left."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from conftest import Env, alive, wait_for
from test_gpu_worker import Gpus, fake_gpus

from gpuq.core.states import CANCELLED, DONE, FAILED, RUNNING

# Says a line, then runs until the test writes `go` (the sleep is the job's own pace).
JOB = (
    "import os, time\nprint('hello from the job', flush=True)\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\n"
)


class Tmux:
    """One tmux server of this test's own (-L: its socket; -f /dev/null: no user config)."""

    def __init__(self) -> None:
        self.base = ["tmux", "-L", f"gpuq-test-{os.getpid()}", "-f", "/dev/null"]

    def __call__(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=10, check=True).stdout

    def start(self, env: dict[str, str], command: list[str], width: int = 100, height: int = 30) -> int:
        """A detached session running `command` (exec'd: the pane's process is it); its pid."""
        line = " ".join(["exec", "env", *(shlex.quote(f"{k}={v}") for k, v in env.items()), *map(shlex.quote, command)])
        self("-u", "new-session", "-d", "-x", str(width), "-y", str(height), line)
        return int(self("display-message", "-p", "#{pane_pid}").strip())

    def screen(self) -> str:
        try:
            return self("capture-pane", "-p")
        except subprocess.CalledProcessError:
            return ""  # the session ended

    def shows(self, *texts: str) -> str:
        """The pane, once it shows every one of `texts`."""
        return wait_for(lambda: (lambda s: all(t in s for t in texts) and s)(self.screen()), 15, what=repr(texts))


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: `gpuq top` is driven in a real terminal through it")
    server = Tmux()
    try:
        yield server
    finally:
        subprocess.run([*server.base, "kill-server"], capture_output=True, timeout=10)


def top_processes(home: Path) -> list[int]:
    """Processes of `gpuq top` on this test's spool (its GPUQ_HOME in their environment)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"top" in cmdline and f"GPUQ_HOME={home}".encode() in environ and alive(int(pid)):
            found.append(int(pid))
    return found


def test_top_shows_the_gpus_and_jobs_opens_a_log_kills_on_y_and_leaves_nothing(gq: Env, tmux: Tmux) -> None:
    gpus = fake_gpus(1)
    gpus["gpus"][0]["utilization_gpu"] = 87
    Gpus(gq, gpus)
    gq.script("job.py", JOB)
    first = gq.add("--name", "train-a", "job.py")
    second = gq.add("--name", "train-b", "job.py")
    gq.start_worker("--watch")
    gq.wait_state(first, RUNNING)
    wait_for(lambda: "hello from the job" in gq.log(first), 15, what="the job's first line")
    env = {k: v for k, v in gq.env.items() if k.startswith("GPUQ_")}
    env.update(LANG="C.UTF-8", LC_ALL="C.UTF-8", TERM="screen")  # a terminfo entry every ncurses has
    pid = tmux.start(env, [sys.executable, "-m", "gpuq", "top", "--interval", "0.5"])
    screen = tmux.shows("GPUs (fake", f"#{first} train-a", f"#{second} pending", "waiting for a free GPU")
    assert "  0  87%" in screen and f"#{first} train-a" in screen.split("GPUs (fake", 1)[1].split("\n")[2]
    assert f">   #{first} train-a" in screen  # the running job is selected first

    tmux("resize-window", "-x", "80", "-y", "24")  # the smallest terminal it is made for
    small = tmux.shows("GPUs (fake", f"#{second} pending")
    assert len(small.splitlines()) <= 24 and max(map(len, small.splitlines())) <= 80
    assert f"#{first} train-a" in small and "? help" in small

    tmux("send-keys", "Enter")
    tmux.shows(f"log of #{first} train-a (running, following)", "hello from the job")
    tmux("send-keys", "Escape")
    tmux.shows("GPUs (fake")

    tmux("send-keys", "x")
    tmux.shows(f"kill #{first} train-a? [y/N]")
    assert gq.state_of(first) == RUNNING  # asked, not done
    tmux("send-keys", "y")
    gq.wait_state(first, CANCELLED)  # `gpuq kill`'s end: in cancelled/
    tmux.shows(f"#{first} train-a killed")

    tmux("send-keys", "q")
    wait_for(lambda: not alive(pid), 10, what="gpuq top to exit")
    assert top_processes(gq.home) == []
    assert gq.state_of(second) in (RUNNING, DONE)  # the queue went on without it
    (gq.work / "go").write_text("")


def test_a_nul_in_a_failure_reason_and_a_log_is_drawn_without_it(gq: Env, tmux: Tmux) -> None:
    gq.script("fail.py", 'print("a \\0 in the log", flush=True)\nraise RuntimeError("bad \\0 byte")\n')
    job_id = gq.add("--name", "fail", "fail.py")
    gq.start_worker("--watch")
    gq.wait_state(job_id, FAILED)
    env = {k: v for k, v in gq.env.items() if k.startswith("GPUQ_")}
    env.update(LANG="C.UTF-8", LC_ALL="C.UTF-8", TERM="screen")
    pid = tmux.start(env, [sys.executable, "-m", "gpuq", "top", "--interval", "0.5"])
    tmux.shows(f"#{job_id} failed", "bad  byte")  # curses refused the NUL: top ended with a traceback
    tmux("send-keys", "Enter")
    tmux.shows(f"log of #{job_id} fail", "a  in the log")
    tmux("send-keys", "Escape")
    tmux.shows(f"#{job_id} failed")
    tmux("send-keys", "q")
    wait_for(lambda: not alive(pid), 10, what="gpuq top to exit")
    once = gq.gpuq("top", "--once").stdout
    assert "bad  byte" in once and "\0" not in once
