"""Job-end hooks with real shell commands and real programs: the variables arrive, a failing or
hanging hook is bounded, and nothing it started is left running."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil
from conftest import Env, wait_for

from gpuq.run.hooks import OUTPUT_CAP, hook_env, notify_desktop, run_on_finish

# Writes what a hook sees: its environment, its stdin, its session; then prints a line.
RECORDER = """
import json, os, sys
stdin = os.path.realpath("/proc/self/fd/0") if os.path.exists("/proc/self/fd/0") else None
seen = {"env": dict(os.environ), "stdin": stdin, "sid": os.getsid(0), "stdin_data": sys.stdin.read()}
with open(sys.argv[1], "w") as f:
    json.dump(seen, f)
print("hook saw job", os.environ["GPUQ_JOB_ID"])
"""

# Prints a step every 0.3 s for 3 s, then nothing until `go` exists.
TICKER = """
import os, time
for i in range(10):
    print(f"step {i + 1}/10", flush=True)
    time.sleep(0.3)
while not os.path.exists("go"):
    time.sleep(0.02)
"""


def gone(pid: int) -> bool:
    """Not running: absent, or a zombie waiting for a parent that is not ours to reap."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def read_pid(path: Path) -> int:
    wait_for(lambda: path.exists() and path.read_text().strip(), timeout=10, what=f"{path.name}")
    return int(path.read_text())


def test_hook_gets_the_job_variables(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("INHERITED_BY_HOOK", "yes")
    script = tmp_path / "hook.py"
    script.write_text(RECORDER)
    seen_file = tmp_path / "seen.json"
    lines: list[str] = []
    env = hook_env(7, "exp05/train", "failed", None, "/home/ada/.gpuq/logs/000007.log")
    run_on_finish(f'"{sys.executable}" "{script}" "{seen_file}"', env, lines.append, timeout=30)

    seen = json.loads(seen_file.read_text())
    assert {k: v for k, v in seen["env"].items() if k.startswith("GPUQ_JOB_")} == {
        "GPUQ_JOB_ID": "7",
        "GPUQ_JOB_NAME": "exp05/train",
        "GPUQ_JOB_STATE": "failed",
        "GPUQ_JOB_EXIT_CODE": "",
        "GPUQ_JOB_LOG": "/home/ada/.gpuq/logs/000007.log",
    }
    assert seen["env"]["INHERITED_BY_HOOK"] == "yes"
    assert seen["stdin_data"] == ""
    if seen["stdin"] is not None:
        assert seen["stdin"] == "/dev/null"
    assert seen["sid"] != os.getsid(0)  # its own session, not ours
    assert lines == ["on-finish hook: hook saw job 7", "on-finish hook exited 0"]
    assert hook_env(3, "n", "done", 0, "/l")["GPUQ_JOB_EXIT_CODE"] == "0"


def test_a_failing_hook_is_reported(tmp_path: Path):
    lines: list[str] = []
    started = time.monotonic()
    run_on_finish("echo 'cannot upload' >&2; exit 1", hook_env(1, "a", "done", 0, "/l"), lines.append)
    assert time.monotonic() - started < 10
    assert lines == ["on-finish hook: cannot upload", "on-finish hook failed: exit 1"]


def test_a_hanging_hook_and_its_child_are_killed(tmp_path: Path):
    child_file, shell_file = tmp_path / "child", tmp_path / "shell"
    # the child ignores SIGTERM, so only the SIGKILL after the grace period ends it
    cmd = f"sh -c \"trap '' TERM; sleep 1000\" & echo $! > {child_file}; echo $$ > {shell_file}; sleep 1000"
    lines: list[str] = []
    started = time.monotonic()
    run_on_finish(cmd, hook_env(2, "b", "done", 0, "/l"), lines.append, timeout=1.5)
    elapsed = time.monotonic() - started
    assert 1.5 <= elapsed < 30, elapsed  # its time, then the grace: not the 1000 s its processes would run
    assert lines == ["on-finish hook killed after 1.5s (it had not finished)"]
    for pid in (read_pid(child_file), read_pid(shell_file)):
        wait_for(lambda pid=pid: gone(pid), timeout=10, what=f"process {pid} to be gone")


def test_a_hook_that_leaves_a_child_holding_its_output_returns_at_once(tmp_path: Path):
    """The shell exits at once; its background child keeps the pipe open. The hook must not be
    waited for until the timeout, and the child must not survive it."""
    child_file = tmp_path / "child"
    lines: list[str] = []
    started = time.monotonic()
    run_on_finish(f"sleep 1000 & echo $! > {child_file}; echo started", {}, lines.append, timeout=30)
    assert time.monotonic() - started < 10
    assert lines == ["on-finish hook: started", "on-finish hook exited 0"]
    child = read_pid(child_file)
    wait_for(lambda: gone(child), timeout=10, what="the background child to be gone")


def test_output_is_capped_and_control_characters_escaped():
    lines: list[str] = []
    run_on_finish("printf 'bell\\007here\\n'; head -c 1000000 /dev/zero | tr '\\0' x", {}, lines.append)
    assert lines[0] == "on-finish hook: bell\\x07here"
    assert sum(len(line) for line in lines) < OUTPUT_CAP + 1000
    assert lines[-2] == f"on-finish hook: ({1000000 - (OUTPUT_CAP - len('bell?here?'))} more bytes of output not shown)"
    assert lines[-1] == "on-finish hook exited 0"


def test_run_on_finish_never_raises():
    def broken_log(line: str) -> None:
        raise RuntimeError("log is gone")

    run_on_finish("exit 3", {}, broken_log)  # nothing escapes
    lines: list[str] = []
    run_on_finish("true", {"GPUQ_JOB_NAME": "bad\0name"}, lines.append)
    assert len(lines) == 1 and lines[0].startswith("on-finish hook could not start:")


def fake_tool(directory: Path, body: str) -> None:
    directory.mkdir(exist_ok=True)
    tool = directory / "notify-send"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)


def test_notify_desktop(tmp_path: Path, monkeypatch):
    summary = {"id": 4, "name": "exp05/eval", "state": "failed", "exit_code": 1}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert notify_desktop(summary).startswith("notify-send not found")

    bin_dir, args_file = tmp_path / "bin", tmp_path / "args"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    fake_tool(bin_dir, f'printf "%s\\n" "$@" > {args_file}\n')
    assert notify_desktop(summary) is None
    assert args_file.read_text().splitlines() == ["-u", "critical", "gpuq: job #4 failed", "exp05/eval (exit 1)"]

    fake_tool(bin_dir, "echo 'Cannot connect to the session bus' >&2; exit 1\n")
    assert notify_desktop(summary) == "notify-send failed: exit 1: Cannot connect to the session bus"


def test_notify_desktop_that_hangs_is_bounded(tmp_path: Path, monkeypatch):
    bin_dir, pid_file = tmp_path / "bin", tmp_path / "pid"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    fake_tool(bin_dir, f"echo $$ > {pid_file}\nexec sleep 1000\n")
    started = time.monotonic()
    reason = notify_desktop({"id": 1, "name": "x", "state": "done", "exit_code": 0}, timeout=1)
    assert time.monotonic() - started < 30  # not the 1000 s it would run
    assert reason == "notify-send killed after 1s (it had not finished)"
    pid = read_pid(pid_file)
    wait_for(lambda: gone(pid), timeout=10, what="the hanging notify-send to be gone")


def test_a_job_printing_steps_is_not_stuck_and_one_gone_silent_is(gq: Env) -> None:
    gq.env["GPUQ_STUCK_MINUTES"] = "0.02"  # 1.2 s, looked at every 0.3 s
    events = gq.work / "events.txt"
    gq.script("ticker.py", TICKER)
    gq.start_worker("--watch")
    job_id = gq.add("--on-finish", f'echo "$GPUQ_EVENT" >> {events}', "ticker.py")
    wait_for(lambda: "=== gpuq: stuck: " in gq.log(job_id), 20, what="the stuck line once it is silent")
    lines = gq.log(job_id).splitlines()
    stuck = next(i for i, line in enumerate(lines) if line.startswith("=== gpuq: stuck: "))
    assert "step 10/10" in lines[:stuck], lines  # said only once it went silent, not while it printed
    wait_for(lambda: events.exists() and events.read_text().split() == ["stuck"], 15, what="the stuck hook")
    (gq.work / "go").write_text("")
    gq.wait_state(job_id, "done")
    wait_for(lambda: events.read_text().split() == ["stuck", "finished"], 15, what="the finished hook")


def test_the_help_says_on_finish_also_runs_while_a_job_is_stuck_or_idle(gq: Env) -> None:
    """The hook runs for `stuck` and `gpu_idle` as well (docs/notifications.md): the help of both
    commands that take it says so, so a hook written from `--help` alone is not surprised."""
    for command in ("add", "run"):
        text = " ".join(gq.gpuq(command, "--help").stdout.split())
        said = text[text.index("--on-finish CMD a shell") :][:200]
        assert "stuck" in said and "idle" in said, said
