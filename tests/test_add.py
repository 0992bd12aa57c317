"""`gpuq add`: job files, options, argument passthrough, .venv discovery, refusals, concurrent ids."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from conftest import Env, fake_venv


def test_add_writes_a_complete_job_file(gq: Env) -> None:
    gq.script("train.py", "print('hi')\n")
    out = gq.gpuq("add", "train.py", "--lr", "1e-4").stdout
    assert out.strip() == f"[+] Job #1: {gq.work.name}/train"
    assert gq.files("pending") == [f"000001-{gq.work.name}-train.json"]
    job = gq.job(1)
    for field in (
        "schema_version",
        "id",
        "name",
        "cmd",
        "cwd",
        "env",
        "after",
        "created_at",
        "started_at",
        "finished_at",
        "pid",
        "exit_code",
        "log",
    ):
        assert field in job, field
    assert job["schema_version"] == 1 and job["id"] == 1
    assert job["cmd"][1:] == ["train.py", "--lr", "1e-4"]
    assert job["cwd"] == str(gq.work)
    assert job["created_at"].endswith("+00:00") or "+" in job["created_at"][-6:]
    mode = stat.S_IMODE(os.stat(gq.home / "pending" / gq.files("pending")[0]).st_mode)
    assert mode == 0o600
    assert stat.S_IMODE(os.stat(gq.home).st_mode) == 0o700


def test_options_after_script_belong_to_the_script(gq: Env) -> None:
    gq.script("train.py", "")
    job_id = gq.add("--name", "mine", "train.py", "--name", "x", "--retries", "5", "-q", "--", "--lr", "1")
    job = gq.job(job_id)
    assert job["name"] == "mine"
    assert job["cmd"][1:] == ["train.py", "--name", "x", "--retries", "5", "-q", "--", "--lr", "1"]
    assert job["retries"] == 0


def test_enqueue_is_a_synonym_and_options_apply(gq: Env) -> None:
    gq.script("sub/eval.py", "")
    first = gq.add("--dir", str(gq.work / "sub"), "eval.py")
    out = gq.gpuq(
        "enqueue", "-d", "sub", "--after", str(first), "--retries", "2", "-e", "A=1", "--env", "B=two", "eval.py"
    ).stdout
    assert out.strip() == f"[+] Job #2: sub/eval  after #{first}"
    job = gq.job(2)
    assert job["after"] == [first] and job["retries"] == 2
    assert job["env"] == {"A": "1", "B": "two"}
    assert job["cwd"] == str(gq.work / "sub")


def test_after_accepts_repeats_and_commas(gq: Env) -> None:
    gq.script("a.py", "")
    for _ in range(3):
        gq.add("a.py")
    job = gq.job(gq.add("--after", "1,2", "--after", "3", "a.py"))
    assert job["after"] == [1, 2, 3]


def test_refusals_are_one_line_exit_2_and_write_nothing(gq: Env) -> None:
    gq.script("train.py", "")
    cases = [
        ("missing.py",),
        ("--dir", "/nonexistent/dir", "train.py"),
        ("no-such-command-xyz",),
        ("--after", "abc", "train.py"),
        ("--retries", "-1", "train.py"),
        ("-e", "NOEQUALS", "train.py"),
        (),
        ("--bogus-option", "train.py"),
    ]
    for args in cases:
        proc = gq.gpuq("add", *args, check=False)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stdout == ""
        assert len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert gq.files("pending") == []
    # a well-formed request for a job that does not exist is refused (exit 1), not a usage error
    proc = gq.gpuq("add", "--after", "99", "train.py", check=False)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == "gpuq: --after: no such job #99\n"
    assert gq.files("pending") == []


def test_quiet_prints_only_the_id(gq: Env) -> None:
    gq.script("t.py", "")
    assert gq.gpuq("add", "-q", "t.py").stdout == "1\n"


def test_venv_is_found_by_walking_up_and_used(gq: Env) -> None:
    project = gq.work / "exp02"
    python = fake_venv(project)
    gq.script("src/deep/train.py", "import sys; print('argv', sys.argv[1:])\n", where=project)
    py_job = gq.add("--dir", str(project / "src" / "deep"), "train.py", "--epochs", "1")
    assert gq.job(py_job)["cmd"][0] == python
    cmd_job = gq.add("--dir", str(project / "src"), "venvtool")
    gq.gpuq("run", timeout=60)
    assert gq.state_of(py_job) == "done" and gq.state_of(cmd_job) == "done"
    assert (project / "venv-used").read_text() == "venv\n"
    assert "argv ['--epochs', '1']" in gq.log(py_job)
    assert f"tool from venv: {project / '.venv'}" in gq.log(cmd_job)


def test_explicit_python_wins_over_discovery(gq: Env) -> None:
    fake_venv(gq.work)
    gq.script("t.py", "")
    job = gq.job(gq.add("--python", sys.executable, "t.py"))
    assert job["cmd"][0] == sys.executable


def test_shell_environment_and_env_options_reach_the_job(gq: Env) -> None:
    gq.script("show.py", "import os; print('X=' + os.environ.get('FROM_SHELL', '?'), 'Y=' + os.environ['Y'])\n")
    env = dict(gq.env, FROM_SHELL="shell-value")
    proc = subprocess.run(
        [sys.executable, "-m", "gpuq", "add", "-q", "-e", "Y=opt", "show.py"],
        cwd=gq.work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    job_id = int(proc.stdout)
    gq.gpuq("run")  # the worker's environment lacks FROM_SHELL: it must come from the add
    assert "X=shell-value Y=opt" in gq.log(job_id)


def test_ids_stay_unique_under_eight_concurrent_adders(gq: Env) -> None:
    gq.script("t.py", "")
    code = (
        "import subprocess, sys\n"
        "for _ in range(5):\n"
        "    subprocess.run([sys.executable, '-m', 'gpuq', 'add', '-q', 't.py'], check=True)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=gq.work, env=gq.env) for _ in range(8)]
    assert all(p.wait(120) == 0 for p in procs)
    ids = [json.loads((gq.home / "pending" / n).read_text())["id"] for n in gq.files("pending")]
    assert sorted(ids) == list(range(1, 41))
    # both copies of the counter (the one in ids.lock written by a second thread) say what comes next
    assert (gq.home / "next_id").read_bytes() == b"41\n"
    assert (gq.home / "ids.lock").read_bytes() == b"41\n".ljust(32)


def test_job_files_get_the_umask_of_the_adding_shell(gq: Env) -> None:
    gq.script("make.py", "open('made.txt', 'w').write('x')\n")
    code = "import os, sys, runpy; os.umask(0o002); sys.argv = ['gpuq', 'add', '-q', 'make.py']; "
    code += "runpy.run_module('gpuq')"
    subprocess.run([sys.executable, "-c", code], cwd=gq.work, env=gq.env, check=True, capture_output=True)
    gq.gpuq("run")
    assert stat.S_IMODE(os.stat(gq.work / "made.txt").st_mode) == 0o664  # not gpuq's own 0600
