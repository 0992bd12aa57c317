"""The launcher a job handed to Ray runs on the node Ray picks (engine/lifecycle/ray_handover.py's
`entrypoint` starts it):
gpuq's own interpreter and package (a shared filesystem is assumed, as for Slurm) started in the job's
directory with the job as JSON in an argument, which sets the job's environment (its venv or conda
environment, `env`, `GPUQ_JOB_ID`, the GPUs Ray gave it) and execs its command, resuming from the
newest checkpoint written since the hand-over when there is one.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

from gpuq.core.job import Job
from gpuq.core.jobenv import add_job_variables
from gpuq.core.resume_arg import DEFAULT_RESUME_ARG, resume_argv
from gpuq.core.schema import DEFAULT_JOB_UMASK
from gpuq.engine.tracking import checkpoints

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
    argv, lines = list(job.cmd), []
    ckpt = checkpoints.latest_checkpoint(job)  # only those written since the hand-over
    if ckpt is not None:
        argv = resume_argv(argv, job.resume_arg or DEFAULT_RESUME_ARG, ckpt.path)
        lines.append(f"attempt {job.attempts + 1}: resumes from {ckpt.path}")
    gpus = f"  CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in env else ""
    lines = [f"job #{job.id} {job.name or ''} (on Ray, attempt {job.attempts + 1})", *lines]
    lines += [
        f"cmd: {shlex.join(argv)}",
        f"cwd: {os.getcwd()}{gpus}",
        f"started: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}",
    ]
    sys.stdout.write("".join(f"=== gpuq: {line}\n" for line in lines))
    sys.stdout.flush()
    os.umask(job.umask if job.umask is not None else DEFAULT_JOB_UMASK)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        sys.stdout.write(f"=== gpuq: could not start: {exc.strerror or exc}: {argv[0]}\n")
        sys.stdout.flush()
        os._exit(127)
