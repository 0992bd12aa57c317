"""The launcher a job handed to Ray runs on the node Ray picks (ray_handover.py's `entrypoint`), with
gpuq's own interpreter and package (a shared filesystem, as for Slurm): it sets the job's environment
and execs its command, resuming from the newest checkpoint written since the hand-over if there is one.
"""

from __future__ import annotations

import json
import os

from gpuq.core.job import Job
from gpuq.core.jobenv import add_job_variables
from gpuq.core.resume_arg import DEFAULT_RESUME_ARG, resume_argv
from gpuq.core.schema import DEFAULT_JOB_UMASK
from gpuq.engine.tracking import checkpoints
from gpuq.run.slurm_batch import exec_job

PAYLOAD_VARIABLE = "GPUQ_RAY_JOB"  # engine/lifecycle/ray_handover.py puts the job there
# Set by Ray for this job on its node: they win over the submitter's environment.
RUNTIME_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "TMPDIR")


def launch() -> None:
    runtime = dict(os.environ)
    job = Job(json.loads(runtime.pop(PAYLOAD_VARIABLE)))
    env = dict(job.shell_env if job.shell_env is not None else runtime)
    for name in RUNTIME_VARS:
        env.pop(name, None)  # the submitting machine's GPUs are not the ones Ray gave the job
        if name in runtime:
            env[name] = runtime[name]
    add_job_variables(env, job)
    env["GPUQ_RAY"] = "1"
    argv, lines = list(job.cmd), [f"job #{job.id} {job.name or ''} (on Ray, attempt {job.attempts + 1})"]
    ckpt = checkpoints.latest_checkpoint(job)  # only those written since the hand-over
    if ckpt is not None:
        argv = resume_argv(argv, job.resume_arg or DEFAULT_RESUME_ARG, ckpt.path)
        lines.append(f"attempt {job.attempts + 1}: resumes from {ckpt.path}")
    os.umask(job.umask if job.umask is not None else DEFAULT_JOB_UMASK)
    exec_job(argv, env, lines)
