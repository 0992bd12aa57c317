"""A command whose first word is a `.py` script, from a job file dropped into pending/ or from
`gpuq edit --set cmd=`, runs as `gpuq add` would run it: with the python of the directory's
environment (its .venv) or the python on PATH; a script that is not there is refused with the
reason (rejected at intake, the edit refused), never queued to fail with exit 127."""

from __future__ import annotations

import json
import os
import sys

from conftest import Env, fake_venv

TRAIN = "import sys; print('trained', sys.argv[1:], 'with', sys.executable)\n"


def _drop(gq: Env, name: str, fields: dict) -> None:
    gq.gpuq("status")  # creates the spool
    tmp = gq.work / f".{name}.tmp"
    tmp.write_text(json.dumps(fields))
    os.chmod(tmp, 0o600)
    os.rename(tmp, gq.home / "pending" / name)


def test_a_dropped_script_runs_with_its_directorys_venv_or_the_python_on_path(gq: Env) -> None:
    with_venv, plain = gq.work / "exp01", gq.work / "exp02"
    python = fake_venv(with_venv)
    gq.script("train.py", TRAIN, where=with_venv)
    gq.script("train.py", TRAIN, where=plain)
    _drop(gq, "a.json", {"cmd": ["train.py", "--steps", "2"], "cwd": str(with_venv)})
    _drop(gq, "b.json", {"cmd": "train.py --steps 3", "cwd": str(plain)})
    gq.gpuq("run", timeout=60)
    first, second = gq.job(1), gq.job(2)
    assert (first["state"], second["state"]) == ("done", "done")
    assert first["cmd"] == [python, "train.py", "--steps", "2"] and first["venv"] == str(with_venv / ".venv")
    assert first["interpreter_from"] == ".venv" and first["name"] == "exp01/train"
    assert (with_venv / "venv-used").read_text() == "venv\n"
    assert "trained ['--steps', '2']" in gq.log(1)
    assert os.path.basename(second["cmd"][0]).startswith("python") and second["cmd"][1:] == ["train.py", "--steps", "3"]
    assert second["interpreter_from"] == "PATH" and second["venv"] is None
    assert "trained ['--steps', '3']" in gq.log(2)


def test_a_dropped_script_that_is_not_there_is_rejected_with_the_reason(gq: Env) -> None:
    _drop(gq, "missing.json", {"cmd": ["nothere.py"], "cwd": str(gq.work)})
    gq.gpuq("run", timeout=60)
    assert gq.files("rejected") == ["missing.json", "missing.json.reason"]
    reason = (gq.home / "rejected" / "missing.json.reason").read_text()
    assert reason.strip() == f"script not found: {gq.work / 'nothere.py'}"
    assert gq.files("pending") == [] and gq.files("failed") == []


def test_edit_set_cmd_to_a_script_runs_it_with_the_venv(gq: Env) -> None:
    project = gq.work / "exp03"
    python = fake_venv(project)
    gq.script("train.py", TRAIN, where=project)
    job_id = gq.add("--hold", "--dir", str(project), "train.py", "--steps", "1")
    refused = gq.gpuq("edit", str(job_id), "--set", 'cmd=["gone.py"]', check=False)
    assert refused.returncode == 2  # as `gpuq add gone.py`: a bad command line
    assert refused.stderr == f"gpuq edit: job #{job_id} not changed: script not found: {project / 'gone.py'}\n"
    assert gq.job(job_id)["cmd"] == [python, "train.py", "--steps", "1"]
    gq.gpuq("edit", str(job_id), "--set", 'cmd=["train.py", "--steps", "5"]')
    edited = gq.job(job_id)
    assert edited["cmd"] == [python, "train.py", "--steps", "5"] and edited["interpreter_from"] == ".venv"
    gq.gpuq("release", str(job_id))
    gq.gpuq("run", timeout=60)
    assert gq.state_of(job_id) == "done"
    assert "trained ['--steps', '5']" in gq.log(job_id)
    assert (project / "venv-used").read_text() == "venv\n"


def test_an_edit_of_cwd_or_cmd_chooses_the_python_again_but_keeps_a_python_given(gq: Env) -> None:
    exp_a, exp_b = gq.work / "expA", gq.work / "expB"
    python_a, python_b = fake_venv(exp_a), fake_venv(exp_b)
    for where in (exp_a, exp_b):
        gq.script("train.py", TRAIN, where=where)
    found = gq.add("--hold", "--dir", str(exp_a), "train.py")
    assert gq.job(found)["cmd"] == [python_a, "train.py"]
    out = gq.gpuq("edit", str(found), "--set", f"cwd={exp_b}").stdout
    job = gq.job(found)  # expB's python, as `add` in expB would choose
    assert (job["cmd"], job["venv"], job["interpreter_from"]) == ([python_b, "train.py"], str(exp_b / ".venv"), ".venv")
    assert f"python {python_b} (from the nearest .venv)" in out
    assert f"python     {python_b} (from the nearest .venv)" in gq.gpuq("show", str(found)).stdout

    given = gq.add("--hold", "--dir", str(exp_a), "--python", sys.executable, "train.py")
    out = gq.gpuq("edit", str(given), "--set", 'cmd=["train.py", "--x"]').stdout
    assert gq.job(given)["cmd"] == [sys.executable, "train.py", "--x"]  # kept, not replaced by the .venv's
    assert f"python {sys.executable} (from --python)" in out
    gq.gpuq("edit", str(given), "--set", f"cwd={exp_b}")
    job = gq.job(given)
    assert (job["cmd"], job["interpreter_from"]) == ([sys.executable, "train.py", "--x"], "--python")
    assert f"python     {sys.executable} (from --python)" in gq.gpuq("show", str(given)).stdout

    gq.gpuq("release", str(found), str(given))
    gq.gpuq("run", timeout=60)
    assert gq.state_of(found) == gq.state_of(given) == "done"
    assert f"with {sys.executable}" in gq.log(given) and "trained ['--x']" in gq.log(given)
    assert (exp_b / "venv-used").read_text() == "venv\n" and not (exp_a / "venv-used").exists()


def test_an_edit_keeps_an_interpreter_the_user_typed(gq: Env) -> None:
    """`gpuq add /usr/bin/python3 train.py` in a directory with a .venv: the python written is the
    user's, not gpuq's choice; an edit of its command or directory used to replace it silently."""
    exp_a, exp_b = gq.work / "expA", gq.work / "expB"
    fake_venv(exp_a), fake_venv(exp_b)
    for where in (exp_a, exp_b):
        gq.script("train.py", TRAIN, where=where)
    typed = gq.add("--hold", "--dir", str(exp_a), sys.executable, "train.py")
    assert f"python     {sys.executable}\n" in gq.gpuq("show", str(typed)).stdout  # not "(from the nearest .venv)"
    gq.gpuq("edit", str(typed), "--set", f'cmd=["{sys.executable}", "train.py", "7"]')
    assert gq.job(typed)["cmd"] == [sys.executable, "train.py", "7"]
    gq.gpuq("edit", str(typed), "--set", f"cwd={exp_b}")
    assert gq.job(typed)["cmd"] == [sys.executable, "train.py", "7"]
    assert f"python     {sys.executable}\n" in gq.gpuq("show", str(typed)).stdout


def test_an_edit_into_a_directory_with_a_venv_replaces_the_python_add_found_on_path(gq: Env) -> None:
    """A job added where no .venv is runs the python on PATH; edited into a directory with a .venv,
    it kept that python (while recording the .venv) and ran with it. A python typed in the command,
    even the very one on PATH, is still kept."""
    plain, exp_b = gq.work / "plain", gq.work / "expB"
    python_b = fake_venv(exp_b)
    for where in (plain, exp_b):
        gq.script("train.py", TRAIN, where=where)
    found = gq.add("--hold", "--dir", str(plain), "train.py")
    on_path = gq.job(found)["cmd"][0]
    assert (gq.job(found)["interpreter_from"], os.path.isabs(on_path)) == ("PATH", True)
    typed = gq.add("--hold", "--dir", str(plain), on_path, "train.py")
    assert f"python     {on_path}\n" in gq.gpuq("show", str(typed)).stdout  # as typed: not "(from PATH)"
    out = gq.gpuq("edit", str(found), "--set", f"cwd={exp_b}").stdout
    job = gq.job(found)  # as `add` in expB would choose
    assert (job["cmd"], job["venv"], job["interpreter_from"]) == ([python_b, "train.py"], str(exp_b / ".venv"), ".venv")
    assert f"python {python_b} (from the nearest .venv)" in out
    gq.gpuq("edit", str(typed), "--set", f"cwd={exp_b}")
    assert gq.job(typed)["cmd"] == [on_path, "train.py"]
    gq.gpuq("release", str(found))
    gq.gpuq("run", timeout=60)
    assert gq.state_of(found) == "done" and (exp_b / "venv-used").read_text() == "venv\n"
