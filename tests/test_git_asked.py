"""How gpuq runs git (gpuq/system/gitinfo.py's `Git`, `ask`): bounded in time, reaped in every case,
passing git none of gpuq's descriptors; `gpuq add` asks as soon as it knows the directory and
reads the answer where it writes the job. Real git and real stand-ins for it on PATH."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import committed_repo

from gpuq.system import gitinfo

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git binary")


def reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # no such child left: reaped
    return False


def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """`git` on PATH is a shell script doing `body`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "git"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_a_git_that_hangs_is_killed_at_its_deadline_and_reaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(tmp_path, monkeypatch, "echo partial; exec sleep 60")
    began = time.monotonic()
    proc = gitinfo.Git(str(tmp_path), "diff", timeout=0.5)
    with pytest.raises(gitinfo.GitFailed, match="timeout"):
        proc.output()
    assert 0.4 < time.monotonic() - began < 10
    assert proc.pid == 0


def test_git_inherits_no_descriptor_of_gpuq(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A descriptor left inheritable (as a supervisor's claim received from the worker is) is
    closed in git: only 0, 1 and 2 (and the one listing them) are open there."""
    stand_in(tmp_path, monkeypatch, "ls /proc/$$/fd")
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc")
    claim = os.open(tmp_path, os.O_RDONLY)
    os.set_inheritable(claim, True)
    try:
        seen = {int(name) for name in gitinfo.git(str(tmp_path), "status").split()}
    finally:
        os.close(claim)
    assert claim not in seen and {0, 1, 2} <= seen and len(seen) <= 4, seen


def test_a_failing_git_and_a_missing_one_are_gitfailed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(gitinfo.GitFailed, match="exited 128"):
        gitinfo.git(str(tmp_path / "missing"), "status")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(gitinfo.GitFailed):
        gitinfo.git(str(tmp_path), "status")
    assert gitinfo.ask(str(tmp_path)).answer() is None


def test_a_question_dropped_unanswered_leaves_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request refused after git was asked (an `--after` that names no job, in the MCP server's
    long-lived process): its git processes are killed and reaped, none left a zombie."""
    stand_in(tmp_path, monkeypatch, "exec sleep 60")
    asked = gitinfo.ask(str(tmp_path))
    pids = [proc.pid for proc in (asked.diff, asked.head) if proc is not None]
    assert len(pids) == 2 and not any(reaped(pid) for pid in pids)  # both running
    del asked
    assert all(reaped(pid) for pid in pids)


def test_add_in_a_repository_writes_the_code_git_gives(gq: Any) -> None:
    """`gpuq add` asks git before resolving the command and opening the spool, and the job holds
    the same record as a look of its own afterwards; a refused add (no such --after job) leaves
    no job and no error from git."""
    committed_repo(gq.work, {"train.py": "print(1)\n"})
    (gq.work / "train.py").write_text("print(2)\n")
    job_id = gq.add("train.py")
    assert gq.job(job_id)["code"] == gitinfo.provenance(str(gq.work))
    assert gq.job(job_id)["code"]["dirty"] is True
    refused = gq.gpuq("add", "--after", "99", "train.py", check=False)
    assert refused.returncode == 1 and refused.stderr == "gpuq: --after: no such job #99\n"
    assert gq.files("pending") == [gq.files("pending")[0]]
