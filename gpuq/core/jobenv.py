"""What a job adds to the environment it starts in, wherever it starts (a local supervisor, a Slurm
batch script): its conda environment or venv first on PATH, its own `env`, its id."""

from __future__ import annotations

import os

from gpuq.core.job import Job


def add_job_variables(env: dict[str, str], job: Job) -> dict[str, str]:
    """`env` (changed in place) with the job's conda environment, venv, `env` and `GPUQ_JOB_ID`."""
    if job.conda:
        activate_conda(env, job.conda)
    venv = job.venv
    if venv:
        env["VIRTUAL_ENV"] = venv
        env["PATH"] = f"{venv}/bin" + (os.pathsep + env["PATH"] if env.get("PATH") else "")
        env.pop("PYTHONHOME", None)  # a venv's python must find its own standard library
    env.update(job.get("env") or {})  # a partial Job (as tests build them) may lack this required field
    env["GPUQ_JOB_ID"] = str(job.id)
    if job.oom_retries:  # the attempt after an out-of-memory failure: a script may shrink its batch
        env["GPUQ_OOM_RETRY"] = str(job.oom_retries)
    return env


def activate_conda(env: dict[str, str], prefix: str) -> None:
    """As `conda activate` sets a shell's variables: the environment's bin/ first on PATH in place
    of the one active in `env`, CONDA_PREFIX and CONDA_DEFAULT_ENV. (Its activate.d scripts are
    not run: they are shell code.)"""
    active = env.get("CONDA_PREFIX")
    replaced = {f"{prefix}/bin", f"{active}/bin"} if active else {f"{prefix}/bin"}
    rest = [d for d in env.get("PATH", "").split(os.pathsep) if d and d not in replaced]
    env["PATH"] = os.pathsep.join([f"{prefix}/bin", *rest])
    if active != prefix or not env.get("CONDA_DEFAULT_ENV"):
        env["CONDA_DEFAULT_ENV"] = conda_env_name(prefix)
    env["CONDA_PREFIX"] = prefix
    env.pop("PYTHONHOME", None)


def conda_env_name(prefix: str) -> str:
    """What conda calls the environment: its name when it is in an `envs` directory, else its path."""
    parent = os.path.dirname(os.path.normpath(prefix))
    return os.path.basename(prefix.rstrip("/")) if os.path.basename(parent) == "envs" else prefix
