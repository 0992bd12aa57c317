"""The batch script gpuq hands to Slurm, its sbatch options, and the launcher it runs on the compute
node (the job as JSON on descriptor 3: the script is self-contained). The time-limit warning is
`--signal=B:USR1@GRACE`, not TERM (TERM also comes from `scancel`): on USR1 the script forwards TERM
(trainers save on TERM), waits, and `scontrol requeue`s its own job, which resumes from its checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import sys
import time
from typing import Mapping, Optional, Sequence

from gpuq.core.job import Job
from gpuq.core.jobenv import add_job_variables
from gpuq.core.resume_arg import DEFAULT_RESUME_ARG, resume_argv
from gpuq.core.schema import DEFAULT_JOB_UMASK
from gpuq.core.times import duration, now_iso, parse_iso
from gpuq.engine.tracking import checkpoints
from gpuq.system.slurm import comment_marker, slurm_job_name

TIME_LIMIT_SIGNAL = "USR1"
JSON_FD = 3
JSON_END = "GPUQ_JOB_JSON"  # here-document delimiter; json.dumps output is one line, never this word
# Set by Slurm on the compute node for this allocation: they win over the submitter's values.
RUNTIME_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "TMPDIR")
LAUNCHER_FIELDS = "id name cmd cwd env shell_env venv conda ckpt_glob resume_arg ckpt_since".split()


def batch_script(job: Job, *, python: str, package_parent: str, log_path: str) -> str:
    """The bash script for `job`. `python`: an interpreter the compute node can run (gpuq's own, on
    a shared filesystem); `package_parent`: the directory holding `gpuq`; `log_path`: the job's log."""
    payload = {field: job.get(field) for field in LAUNCHER_FIELDS}  # what the file holds, as it holds it
    payload["ckpt_since"] = job.ckpt_since or now_iso()
    umask = job.umask if job.umask is not None else DEFAULT_JOB_UMASK
    launcher = "import sys; sys.path.insert(0, sys.argv[1]); from gpuq.run.slurm_batch import launch; launch()"
    q = shlex.quote
    said_cwd = re.sub(r'[$`"\\!]', "?", job.cwd)  # inside a double-quoted echo: no expansions, no quote
    return f"""#!/bin/bash
# gpuq job #{job.id}: handed to Slurm by gpuq; runs the job's command as gpuq runs it locally.
exec >>{q(log_path)} 2>&1
cd -- {q(job.cwd)} || {{ echo "=== gpuq: could not start: cannot enter {said_cwd}"; exit 127; }}
umask {umask:04o}
gpuq_requeue=0
gpuq_forward() {{ trap '' TERM {TIME_LIMIT_SIGNAL}; kill -TERM 0 2>/dev/null; }}
gpuq_time_limit() {{
  gpuq_requeue=1
  echo "=== gpuq: Slurm time limit near: asking the job to save and stop, then requeueing it"
  gpuq_forward
}}
trap gpuq_forward TERM
trap gpuq_time_limit {TIME_LIMIT_SIGNAL}
{q(python)} -E -S -c {q(launcher)} {q(package_parent)} {JSON_FD}<<'{JSON_END}' </dev/null &
{json.dumps(payload, ensure_ascii=True)}
{JSON_END}
gpuq_pid=$!
# A trapped signal cuts `wait` short: wait again while the payload lives, then take its saved status.
wait "$gpuq_pid"; gpuq_status=$?
while [ "$gpuq_status" -gt 128 ] && kill -0 "$gpuq_pid" 2>/dev/null; do wait "$gpuq_pid"; gpuq_status=$?; done
wait "$gpuq_pid"; gpuq_status=$?
# Requeue only a job Slurm still runs: one cancelled meanwhile (scancel) must stay cancelled.
if [ "$gpuq_requeue" = 1 ] && [ "$(squeue -h -j "$SLURM_JOB_ID" -o %T 2>/dev/null)" = RUNNING ]; then
  echo "=== gpuq: job stopped (exit $gpuq_status) before the time limit; requeueing Slurm job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID" && exit "$gpuq_status"
  echo "=== gpuq: scontrol requeue failed: the job ends here; gpuq resume can continue it"
  [ "$gpuq_status" = 0 ] && gpuq_status=143  # stopped early: not a success
fi
exit "$gpuq_status"
"""


def sbatch_options(
    job: Job,
    *,
    spool_id: str,
    slurm_ids: Mapping[int, int],
    extra: Sequence[str],
    grace_seconds: int,
    gres: bool = True,
) -> list[str]:
    """sbatch's options for `job`. `slurm_ids`: gpuq id -> Slurm id of the jobs of this hand-over
    already submitted. ValueError (one line) for a job field or argument Slurm cannot take."""
    if not 0 <= grace_seconds <= 65535:
        raise ValueError(f"the grace period must be 0 to 65535 seconds, not {grace_seconds}")
    if not job.log:
        raise ValueError(f"job #{job.id} has no log path")
    log = job.log.replace("%", "%%")  # sbatch expands %j and friends in file names
    own_limit = own_time_limit(job, extra)
    options = [
        f"--job-name={slurm_job_name(job.name or str(job.id))}",
        f"--output={log}",
        f"--error={log}",
        "--open-mode=append",
        f"--chdir={job.cwd}",
        "--export=ALL",  # the submitter's environment, for jobs without shell_env
        "--requeue",
        # The job's own limit ends it there, as here: no warning, no requeue.
        own_limit or f"--signal=B:{TIME_LIMIT_SIGNAL}@{grace_seconds}",
        f"--comment={comment_marker(spool_id, job.id)}",
    ]
    begin = begin_option(job, extra, time.time())
    if begin:
        options.append(begin)
    gpus = gpu_request(job)
    if gres and gpus > 0:
        options.append(f"--gres=gpu:{gpus}")
    if job.mem_mib:  # host memory and CPUs (`add --mem/--cpus`), as Slurm reserves them
        options.append(f"--mem={job.mem_mib}M")
    if job.cpus:
        options.append(f"--cpus-per-task={job.cpus}")
    parts = []
    for kind, field in (("afterok", "after"), ("afterany", "after_any")):
        ids = sorted({slurm_ids[i] for i in job.get(field) or [] if i in slurm_ids})
        if ids:
            parts.append(kind + "".join(f":{i}" for i in ids))
    if parts:
        options.append(f"--dependency={','.join(parts)}")  # a comma: every one of them must hold
    return options + list(extra)


def own_time_limit(job: Job, extra: Sequence[str]) -> Optional[str]:
    """sbatch's `--time` for the job's own `--time`, in whole minutes (Slurm's unit), rounded up;
    None when it has none or `extra` (`--slurm-opt`) gives sbatch a time limit, which wins."""
    if not job.time_limit or _given(extra, "--time", "-t"):
        return None
    return f"--time={max(1, math.ceil(job.time_limit / 60))}"


def time_limit_words(job: Job, extra: Sequence[str]) -> Optional[str]:
    """What became of the job's `--time` on Slurm, when it is not what it was (None: kept as it is)."""
    if not job.time_limit:
        return None
    if _given(extra, "--time", "-t"):
        return f"its --time {duration(job.time_limit)} gives way to --slurm-opt's time limit"
    if job.time_limit % 60:
        minutes = own_time_limit(job, extra)
        return f"its --time {duration(job.time_limit)} is {minutes} on Slurm (whole minutes)"
    return None


def begin_option(job: Job, extra: Sequence[str], now: float) -> Optional[str]:
    """sbatch's `--begin` for a job whose `--begin` is still to come, in the local time sbatch
    reads; None when it is due or `extra` gives sbatch a start time, which wins."""
    begin = parse_iso(job.begin_at)
    if begin is None or begin <= now or _given(extra, "--begin", "-b"):
        return None
    return "--begin=" + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(math.ceil(begin)))


def _given(extra: Sequence[str], long: str, short: str) -> bool:
    """Whether sbatch options `extra` hold the option `long` (`--time`, `--time=5`) or `short` (`-t5`)."""
    return any(o == long or o.startswith(long + "=") or (o.startswith(short) and not o.startswith("--")) for o in extra)


def gpu_request(job: Job) -> int:
    value = job.gpu_request
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"job #{job.id}: gpu_request must be a whole number of GPUs (0 or more), not {value!r}")
    return value


def launch_plan(job: Job, restart: int) -> tuple[list[str], list[str]]:
    """(argv to run, `=== gpuq:` lines saying why): the job's command, resuming from the newest
    checkpoint written since `ckpt_since` if there is one."""
    ckpt = checkpoints.latest_checkpoint(job)  # only those written since the job's ckpt_since
    when = f"slurm restart {restart}" if restart > 0 else "slurm start"
    if ckpt is not None:
        template = job.resume_arg or DEFAULT_RESUME_ARG
        return resume_argv(list(job.cmd), template, ckpt.path), [f"{when}: resumes from {ckpt.path}"]
    if restart > 0:
        since = job.ckpt_since or "its hand-over"
        return list(job.cmd), [
            f"{when}: no checkpoint written since {since} ({checkpoints.where_looked(job)}): starts over"
        ]
    return list(job.cmd), []


def launch_environment(job: Job, runtime_env: Mapping[str, str]) -> dict[str, str]:
    """As the local supervisor builds it, plus what Slurm set for this allocation."""
    shell_env = job.shell_env
    env = dict(shell_env if shell_env is not None else runtime_env)
    for name in RUNTIME_VARS:
        env.pop(name, None)  # the login node's GPUs are not this allocation's
    env.update({k: v for k, v in runtime_env.items() if k.startswith("SLURM") or k in RUNTIME_VARS})
    add_job_variables(env, job)
    env["GPUQ_SLURM"] = "1"
    return env


def launch() -> None:
    with os.fdopen(JSON_FD, encoding="utf-8") as stream:
        job = Job(json.loads(stream.read()))
    runtime = dict(os.environ)
    try:
        restart = int(runtime.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        restart = 0
    slurm_id = runtime.get("SLURM_JOB_ID", "?")
    where = f" on {runtime['SLURMD_NODENAME']}" if runtime.get("SLURMD_NODENAME") else ""
    heading = f"job #{job.id} {job.name or ''} (slurm job {slurm_id}{where}, restart {restart})"
    argv, why = launch_plan(job, restart)
    exec_job(argv, launch_environment(job, runtime), [heading, *why])


def exec_job(argv: list[str], env: dict[str, str], lines: list[str]) -> None:
    """Say `lines` and what runs where in the log, then exec the job's command (exit 127 if it cannot
    start); run/ray_entry.py's too."""
    gpus = f"  CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in env else ""
    lines = [*lines, f"cmd: {shlex.join(argv)}", f"cwd: {os.getcwd()}{gpus}"]
    lines.append(f"started: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
    sys.stdout.write("".join(f"=== gpuq: {line}\n" for line in lines))
    sys.stdout.flush()
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        sys.stdout.write(f"=== gpuq: could not start: {exc.strerror or exc}: {argv[0]}\n")
        sys.stdout.flush()
        os._exit(127)
