"""What a job adds to the environment it starts in, wherever it starts (a local supervisor, a Slurm
batch script): its venv first on PATH, its own `env`, its id."""

from __future__ import annotations

import os
from typing import Any


def add_job_variables(env: dict[str, str], job: dict[str, Any]) -> dict[str, str]:
    """`env` (changed in place and returned) with the job's venv, `env` and `GPUQ_JOB_ID`."""
    venv = job.get("venv")
    if venv:
        env["VIRTUAL_ENV"] = venv
        env["PATH"] = f"{venv}/bin" + (os.pathsep + env["PATH"] if env.get("PATH") else "")
        env.pop("PYTHONHOME", None)  # a venv's python must find its own standard library
    env.update(job.get("env") or {})
    env["GPUQ_JOB_ID"] = str(job["id"])
    return env
