"""`gpuq add --dry-run` (issue 30): what `add` would queue, and whether and when it would start,
with nothing written to the spool: the tree compared file by file before and after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import WAIT_FOR_GO, Env, wait_for
from test_gpu_worker import fake_gpus

from gpuq.cli import cmd_add, parse
from gpuq.engine.lifecycle import enqueue
from gpuq.engine.lifecycle.dryrun import plan_add
from gpuq.spool import Spool


def tree(root: Path) -> dict[str, tuple]:
    """Every file and directory under `root`: its bytes (a link: its target) and its mtime."""
    out: dict[str, tuple] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            st = path.lstat()
            data = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else None
            out[str(path.relative_to(root))] = (data, st.st_mtime_ns, st.st_size)
    return out


def project(gq: Env) -> Path:
    """A git repository with a committed train.py and a `.venv` whose python is this one."""
    where = gq.work / "proj"
    (where / ".venv" / "bin").mkdir(parents=True)
    (where / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (where / "train.py").write_text("print('training')\n")
    (where / ".gitignore").write_text(".venv/\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(where)]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "first"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    return where


def test_a_sweep_dry_run_lists_each_variant_and_writes_nothing(gq: Env) -> None:
    proj = project(gq)
    held = gq.add("--hold", "-d", str(proj), "train.py")  # a spool with a job, an id counter and caches
    before = tree(gq.home)
    proc = gq.gpuq(
        "add", "--dry-run", "--json", "--sweep", "lr=1e-4,3e-4", "--time", "2h", "--after", str(held), "-e", "A=1",
        "-d", str(proj), "train.py", "--lr", "{lr}",
    )  # fmt: skip
    assert tree(gq.home) == before  # no id, no job file, no cache (git's answer), no log
    plan = json.loads(proc.stdout)
    python = str(proj / ".venv" / "bin" / "python")
    assert [job["id"] for job in plan["jobs"]] == [held + 1, held + 2]
    for job, lr in zip(plan["jobs"], ("1e-4", "3e-4")):
        assert job["command"] == [python, "train.py", "--lr", lr] and job["sweep"] == {"lr": lr}
        assert (job["interpreter"], job["interpreter_from"], job["venv"]) == (python, ".venv", str(proj / ".venv"))
        assert job["cwd"] == str(proj) and job["env"]["A"] == "1" and job["env"]["VIRTUAL_ENV"] == str(proj / ".venv")
        assert (job["time_limit_seconds"], job["after"], job["gpus"]) == (7200, [held], 1)
        assert job["code"]["repo"] == str(proj) and job["code"]["dirty"] is False
        assert job["would_start"]["now"] is False
        assert job["would_start"]["why_not"] == f"after #{held} (held): runs after `gpuq release {held}`"
    assert gq.add("-d", str(proj), "train.py") == held + 1  # the dry run took no id


def test_a_bad_dry_run_is_refused_as_add_refuses_it(gq: Env, tmp_path: Path) -> None:
    gq.script("train.py", "print(1)\n")
    (tmp_path / "gpus.json").write_text(json.dumps(fake_gpus(2)))
    gq.env["GPUQ_FAKE_GPUS"] = str(tmp_path / "gpus.json")
    gq.add("--hold", "train.py")
    before = tree(gq.home)
    bad_lines = (["--gpus", "x"], ["--time", "soon"], ["--sweep", "lr"], ["--gpus", "3"], ["--gpu-mem", "100G"])
    for bad in ([*line, "train.py"] for line in bad_lines):
        dry, real = gq.gpuq("add", "--dry-run", *bad, check=False), gq.gpuq("add", *bad, check=False)
        assert (dry.returncode, dry.stderr) == (real.returncode, real.stderr) and dry.returncode == 2
        assert dry.stderr.count("\n") == 1 and dry.stdout == ""
    dry, real = (gq.gpuq("add", *flag, "--after", "99", "train.py", check=False) for flag in (["--dry-run"], []))
    assert (dry.returncode, dry.stderr) == (real.returncode, real.stderr) == (1, "gpuq: --after: no such job #99\n")
    assert tree(gq.home) == before


def test_a_dry_run_creates_no_spool(gq: Env) -> None:
    gq.script("train.py", "print(1)\n")
    proc = gq.gpuq("add", "--dry-run", "train.py")
    assert "would queue 1 job" in proc.stdout and "no worker is running" in proc.stdout
    refused = gq.gpuq("add", "--dry-run", "--after", "1", "train.py", check=False)
    assert (refused.returncode, refused.stderr) == (1, "gpuq: --after: no such job #1\n")
    assert not gq.home.exists()


def test_with_a_worker_a_free_slot_starts_now_and_a_busy_one_says_when(gq: Env) -> None:
    gq.script("wait.py", "print('step 1/10', flush=True)\n" + WAIT_FOR_GO)
    worker = gq.start_worker("--watch")
    sp = Spool(gq.home)
    wait_for(lambda: (gq.home / "workers").is_dir() and sp.workers.live(), what="the worker to register")
    request = enqueue.Request(cmd=["wait.py"], dir=str(gq.work))
    assert plan_add(sp, request)["jobs"][0]["would_start"] == {
        "now": True,
        "why_not": None,
        "starts_in_seconds": 0.0,
        "estimate": "starts in ~0s; run time unknown (no earlier successful run of this command here)",
    }
    running = gq.add("wait.py")
    gq.wait_state(running, "running")
    later = plan_add(sp, request)["jobs"][0]["would_start"]
    assert later["now"] is False and later["why_not"] == "every slot it could take is busy"
    log = gq.home / "logs" / f"{running:06d}.log"
    # the job's one line lands in its log a moment after it is `running`; until then the tree moves
    wait_for(lambda: b"step 1/10" in log.read_bytes(), what="the job's line in its log")
    gq.gpuq("stop")  # the job runs on; nothing else writes to the spool once the worker is gone
    worker.wait(30)  # its last writes (its registration, its view of the GPUs) may follow `stop`
    before = tree(gq.home)
    assert (
        plan_add(sp, request)["jobs"][0]["would_start"]["why_not"]
        == "no worker is running; `gpuq run --daemon` starts one"
    )
    assert tree(gq.home) == before  # the running job's progress read, not recorded
    (gq.work / "go").write_text("")
    gq.wait_state(running, "done")


def test_the_tools_request_is_the_request_of_the_same_command_line() -> None:
    """The MCP server's add makes, from its keyword arguments, the request the CLI makes from the
    same command line (no command line is rebuilt from the values)."""
    pytest.importorskip("mcp")
    from gpuq.cli.assistant import tools

    given = {"gpus": 2, "after": [3, 4], "env": {"A": "1"}, "sweep": ["lr=1,2"], "time": "4h", "urgent": "force"}
    from_tool = tools.request({"cmd": ["t.py", "--lr", "{lr}"], "dir": "/data", **given, "notify": False})
    line = ["add", "--gpus", "2", "--after", "3", "--after", "4", "-e", "A=1", "--sweep", "lr=1,2", "--time", "4h"]
    from_line = cmd_add.request(parse([*line, "--urgent=force", "-d", "/data", "t.py", "--lr", "{lr}"]))
    values = [
        {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in r._asdict().items()}
        for r in (from_tool, from_line)
    ]
    assert values[0] == values[1]
