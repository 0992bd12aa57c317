"""Conda and mamba environments, and uv projects without a .venv (issue 26).

The environments are real directories in conda's layout, made here: `bin/python` linked to this
interpreter and `conda-meta/`, under an installation's `envs/`. The user's shell is the environment
`gpuq add` runs in (CONDA_PREFIX, CONDA_EXE, PATH as `conda activate` leaves them)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from gpuq.core.job import Job
from gpuq.core.jobenv import add_job_variables
from gpuq.engine.lifecycle import intake, interpreter
from gpuq.spool import Spool

PYTHON = os.path.realpath(sys.executable)  # the interpreter itself, not a shim or a venv's link
# What the job says about the interpreter and environment it runs in.
REPORT = (
    "import os, sys\n"
    "print('exe', sys.executable)\n"
    "print('prefix', os.environ.get('CONDA_PREFIX'))\n"
    "print('name', os.environ.get('CONDA_DEFAULT_ENV'))\n"
    "print('path0', os.environ['PATH'].split(os.pathsep)[0])\n"
)


def conda_env(prefix: Path) -> Path:
    """A conda environment: its python, a tool of its own in bin/, and conda-meta/."""
    (prefix / "conda-meta").mkdir(parents=True)
    (prefix / "conda-meta" / "history").write_text("")
    (prefix / "bin").mkdir()
    (prefix / "bin" / "python").symlink_to(PYTHON)
    (prefix / "bin" / "python3").symlink_to("python")
    tool = prefix / "bin" / "envtool"
    tool.write_text('#!/bin/sh\necho "envtool in $CONDA_PREFIX"\n')
    tool.chmod(0o755)
    return prefix


def installation(root: Path) -> dict[str, str]:
    """A conda installation (its base environment at `root`, one named `torch`), and the
    variables every shell of its user has (`conda init`), none activated."""
    conda_env(root)
    conda_env(root / "envs" / "torch")
    return {"CONDA_EXE": str(root / "bin" / "conda")}


def activated(gq: Any, prefix: Path, name: str) -> dict[str, str]:
    """The shell after `conda activate NAME`."""
    path = f"{prefix}/bin{os.pathsep}{gq.env['PATH']}"
    return dict(gq.env, CONDA_PREFIX=str(prefix), CONDA_DEFAULT_ENV=name, CONDA_SHLVL="1", PATH=path)


def report(log: str) -> dict[str, str]:
    return dict(
        line.split(" ", 1) for line in log.splitlines() if line.split(" ")[0] in ("exe", "prefix", "name", "path0")
    )


def test_a_job_added_in_an_active_conda_env_runs_in_it(gq: Any, tmp_path: Path) -> None:
    torch = conda_env(tmp_path / "miniconda" / "envs" / "torch")
    gq.script("report.py", REPORT)
    shell = dict(activated(gq, torch, "torch"), PATH=gq.env["PATH"])  # bin/ on PATH is gpuq's doing
    py_job = int(gq.gpuq("add", "-q", "report.py", env=shell).stdout)
    tool_job = int(gq.gpuq("add", "-q", "envtool", env=shell).stdout)  # not a .py: the same PATH
    job = gq.job(py_job)
    assert (job["conda"], job["interpreter_from"], job["venv"]) == (str(torch), "conda env", None)
    assert job["cmd"][0] == f"{torch}/bin/python"
    gq.gpuq("run")
    assert gq.state_of(py_job) == gq.state_of(tool_job) == "done", gq.log(py_job) + gq.log(tool_job)
    assert report(gq.log(py_job)) == {
        "exe": f"{torch}/bin/python",
        "prefix": str(torch),
        "name": "torch",
        "path0": f"{torch}/bin",
    }
    assert f"envtool in {torch}" in gq.log(tool_job)
    card = gq.gpuq("show", str(py_job)).stdout  # `show` says where the interpreter came from
    assert f"python     {torch}/bin/python (from the conda env active when it was added)" in card
    assert f"conda      {torch}" in card


def test_conda_name_resolves_to_its_prefix_at_add_time(gq: Any, tmp_path: Path) -> None:
    root = tmp_path / "miniforge3"
    shell = dict(gq.env, **installation(root))  # nothing activated: --conda names it
    gq.script("report.py", REPORT)
    job_id = int(gq.gpuq("add", "-q", "--conda", "torch", "report.py", env=shell).stdout)
    job = gq.job(job_id)
    torch = root / "envs" / "torch"
    assert (job["conda"], job["interpreter_from"], job["cmd"][0]) == (str(torch), "--conda", f"{torch}/bin/python")
    gq.gpuq("run")
    assert report(gq.log(job_id)) == {
        "exe": f"{torch}/bin/python",
        "prefix": str(torch),
        "name": "torch",
        "path0": f"{torch}/bin",
    }


def test_unknown_conda_env_is_refused_and_nothing_is_queued(gq: Any, tmp_path: Path) -> None:
    shell = dict(gq.env, **installation(tmp_path / "miniconda"))
    gq.script("t.py", "")
    proc = gq.gpuq("add", "--conda", "tourch", "t.py", env=shell, check=False)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith("gpuq: --conda: no conda environment named 'tourch' (looked in ")
    assert len(proc.stderr.splitlines()) == 1
    not_env = gq.work / "plain"
    not_env.mkdir()
    proc = gq.gpuq("add", "--conda", str(not_env), "t.py", env=shell, check=False)
    assert proc.returncode == 1 and "no conda-meta/" in proc.stderr
    assert gq.files("pending") == []


def test_conda_names_are_found_where_conda_keeps_them(tmp_path: Path) -> None:
    root = tmp_path / "mambaforge"
    env = {"CONDA_EXE": str(root / "bin" / "conda"), "HOME": str(tmp_path / "home")}
    installation(root)
    elsewhere = conda_env(tmp_path / "projects" / "exp-env")  # made with `conda create -p`
    listed = tmp_path / "home" / ".conda" / "environments.txt"
    listed.parent.mkdir(parents=True)
    listed.write_text(f"{root}\n{elsewhere}\n")
    assert interpreter.find_conda("torch", env) == str(root / "envs" / "torch")
    assert interpreter.find_conda("exp-env", env) == str(elsewhere)
    assert interpreter.find_conda("base", env) == str(root)
    assert interpreter.find_conda(str(elsewhere), env) == str(elsewhere)
    micromamba = {"MAMBA_ROOT_PREFIX": str(tmp_path / "micromamba")}
    conda_env(tmp_path / "micromamba" / "envs" / "jax")
    assert interpreter.find_conda("jax", micromamba) == str(tmp_path / "micromamba" / "envs" / "jax")
    own = {"CONDA_ENVS_DIRS": str(tmp_path / "scratch")}
    conda_env(tmp_path / "scratch" / "torch")
    assert interpreter.find_conda("torch", dict(env, **own)) == str(tmp_path / "scratch" / "torch")


def test_a_nearer_venv_wins_over_the_active_conda_env(gq: Any, tmp_path: Path) -> None:
    torch = conda_env(tmp_path / "miniconda" / "envs" / "torch")
    project = gq.work / "exp"
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / ".venv" / "bin" / "python").symlink_to(PYTHON)
    gq.script("t.py", "", where=project)
    shell = activated(gq, torch, "torch")
    found = interpreter.resolve_command("t.py", [], str(project), env=shell)
    assert (found.cmd[0], found.venv, found.conda, found.found_by) == (
        f"{project}/.venv/bin/python",
        f"{project}/.venv",
        None,
        ".venv",
    )
    named = interpreter.resolve_command("t.py", [], str(project), conda=str(torch), env=shell)
    assert (named.cmd[0], named.venv, named.found_by) == (f"{torch}/bin/python", None, "--conda")  # --conda wins
    given = interpreter.resolve_command("t.py", [], str(project), python=PYTHON, env=shell)
    assert (given.cmd[0], given.found_by) == (PYTHON, "--python")
    gq.script("t.py", "")
    elsewhere = interpreter.resolve_command("t.py", [], str(gq.work), env=shell)
    assert (elsewhere.cmd[0], elsewhere.conda, elsewhere.found_by) == (f"{torch}/bin/python", str(torch), "conda env")


def test_the_base_env_is_used_only_when_nothing_else_is_found(gq: Any, tmp_path: Path) -> None:
    """`conda init` activates base in every shell: a job then runs the python on PATH, which is
    base's only when nothing was put before it."""
    root = tmp_path / "miniconda"
    shell = dict(activated(gq, root, "base"), **installation(root))
    gq.script("t.py", "")
    found = interpreter.resolve_command("t.py", [], str(gq.work), env=shell)
    assert (found.cmd[0], found.conda, found.found_by) == (f"{root}/bin/python3", str(root), "conda env")
    bindir = tmp_path / "pyenv" / "bin"  # something the user put before base on PATH
    bindir.mkdir(parents=True)
    (bindir / "python3").symlink_to(PYTHON)
    before = dict(shell, PATH=f"{bindir}{os.pathsep}{shell['PATH']}")
    found = interpreter.resolve_command("t.py", [], str(gq.work), env=before)
    assert (found.cmd[0], found.conda, found.found_by) == (f"{bindir}/python3", None, "PATH")
    named = dict(shell, CONDA_DEFAULT_ENV="root-by-another-name")  # base known by where conda lives
    assert interpreter.active_conda(named) is None


def test_a_conda_env_replaces_the_active_one_on_path() -> None:
    """As `conda activate` does: the job's environment first, the shell's active one (base here) off PATH."""
    shell = {"PATH": "/opt/conda/bin:/opt/conda/condabin:/usr/bin", "CONDA_PREFIX": "/opt/conda"}
    shell["CONDA_DEFAULT_ENV"] = "base"
    env = add_job_variables(dict(shell), Job({"id": 7, "conda": "/opt/conda/envs/torch", "env": {}}))
    assert env["PATH"] == "/opt/conda/envs/torch/bin:/opt/conda/condabin:/usr/bin"
    assert (env["CONDA_PREFIX"], env["CONDA_DEFAULT_ENV"]) == ("/opt/conda/envs/torch", "torch")
    by_path = add_job_variables({"PATH": "/usr/bin"}, Job({"id": 8, "conda": "/scratch/exp-env", "env": {}}))
    assert (by_path["PATH"], by_path["CONDA_DEFAULT_ENV"]) == ("/scratch/exp-env/bin:/usr/bin", "/scratch/exp-env")


def test_a_dropped_file_may_name_a_conda_prefix(gq: Any, tmp_path: Path) -> None:
    torch = conda_env(tmp_path / "miniconda" / "envs" / "torch")
    spool = Spool(gq.home).ensure()
    for name, conda in (("good.json", str(torch)), ("plain.json", str(gq.work)), ("named.json", "torch")):
        staging = gq.home.parent / name
        staging.write_text(json.dumps({"cmd": ["envtool"], "cwd": str(gq.work), "conda": conda, "gpus": 0}))
        staging.chmod(0o600)
        os.rename(staging, gq.home / "pending" / name)
    assert intake.take_in(spool, "good.json", 1e12) == "job #1"
    assert intake.take_in(spool, "plain.json", 1e12).startswith("rejected: conda: not a conda environment")
    assert "absolute path of a conda environment" in intake.take_in(spool, "named.json", 1e12)
    assert (gq.job(1)["conda"], gq.job(1)["interpreter_from"]) == (str(torch), "--conda")
    gq.gpuq("run")
    assert f"envtool in {torch}" in gq.log(1)


def test_a_uv_project_without_its_venv_is_said_at_add_time(gq: Any) -> None:
    project = gq.work / "uvproj"
    gq.script("pyproject.toml", '[project]\nname = "x"\n\n[tool.uv]\ndev-dependencies = []\n', where=project)
    gq.script("train.py", "", where=project)
    proc = gq.gpuq("add", "-q", "--dir", str(project), "train.py")
    assert proc.stdout == "1\n"  # queued all the same
    hint = proc.stderr.splitlines()
    assert len(hint) == 1 and hint[0].startswith(f"gpuq: {project} is a uv project with no .venv yet: this job runs ")
    assert f"`uv sync` in {project}" in hint[0]
    assert gq.gpuq("add", "-q", "--dir", str(project), "--python", PYTHON, "train.py").stderr == ""  # as told


def test_which_pyprojects_are_uv_projects(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    (locked / "src").mkdir(parents=True)
    (locked / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (locked / "uv.lock").write_text("")
    assert interpreter.uv_project(str(locked / "src")) == str(locked)
    poetry = tmp_path / "poetry"
    poetry.mkdir()
    (poetry / "pyproject.toml").write_text('[tool.poetry]\nname = "x"\n# [tool.uv] in a comment\n')
    assert interpreter.uv_project(str(poetry)) is None
    made = interpreter.resolve_command("true", [], str(locked))
    assert interpreter.uv_hint(str(locked), made).startswith("gpuq: ")
    uv_run = interpreter.Resolved(["uv", "run", "train.py"], None, None, "PATH")
    assert interpreter.uv_hint(str(locked), uv_run) == ""  # uv makes the .venv itself
    (locked / ".venv" / "bin").mkdir(parents=True)
    (locked / ".venv" / "bin" / "python").symlink_to(PYTHON)
    assert interpreter.uv_hint(str(locked), interpreter.resolve_command("true", [], str(locked))) == ""


def test_an_edit_of_cwd_chooses_again_past_the_active_env_and_a_null_conda_drops_a_given_one(
    gq: Any, tmp_path: Path
) -> None:
    torch = conda_env(tmp_path / "miniconda" / "envs" / "torch")
    project = gq.work / "exp"
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / ".venv" / "bin" / "python").symlink_to(PYTHON)
    gq.script("report.py", REPORT)
    gq.script("report.py", REPORT, where=project)
    shell = activated(gq, torch, "torch")
    active = int(gq.gpuq("add", "-q", "--hold", "report.py", env=shell).stdout)
    given = int(gq.gpuq("add", "-q", "--hold", "--conda", str(torch), "report.py", env=shell).stdout)
    for job_id in (active, given):
        gq.gpuq("edit", str(job_id), "--set", f"cwd={project}")
    job = gq.job(active)  # the shell's active env was no choice: the nearer .venv wins, as at `add`
    assert (job["cmd"][0], job["venv"], job["conda"], job["interpreter_from"]) == (
        f"{project}/.venv/bin/python",
        f"{project}/.venv",
        None,
        ".venv",
    )
    job = gq.job(given)  # --conda was: it is kept
    assert (job["cmd"][0], job["conda"], job["interpreter_from"]) == (f"{torch}/bin/python", str(torch), "--conda")
    out = gq.gpuq("edit", str(given), "--set", "conda=null").stdout
    assert f"python {project}/.venv/bin/python (from the nearest .venv)" in out
    job = gq.job(given)
    assert (job["cmd"][0], job["conda"], job["interpreter_from"]) == (f"{project}/.venv/bin/python", None, ".venv")


def test_a_relative_conda_exe_makes_the_current_directory_a_root(tmp_path: Path, monkeypatch) -> None:
    """CONDA_EXE=conda (no directory): its root is where gpuq runs, so ./envs/NAME is found; the
    ROOT of CONDA_EXE=ROOT/bin/conda and MAMBA_ROOT_PREFIX follow, made absolute."""
    monkeypatch.chdir(tmp_path)
    assert interpreter.conda_roots({"CONDA_EXE": "conda"}) == [str(tmp_path)]
    roots = interpreter.conda_roots({"CONDA_EXE": "/opt/mc/bin/conda", "MAMBA_ROOT_PREFIX": "mm"})
    assert roots == ["/opt/mc", str(tmp_path / "mm")]
    assert interpreter.conda_roots({"CONDA_EXE": ""}) == []
