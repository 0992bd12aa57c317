"""The Slurm client: sbatch, scancel, squeue and sacct as subprocesses, each bounded by TIMEOUT
seconds and run in `env` (default: this process's, where `SLURM_CONF` points at the cluster).

`query` asks squeue, then sacct for the jobs the controller forgot (after `MinJobAge`). Formats as
observed with Slurm 22.05.8: squeue's `exit_code` is a raw wait status (768 = exit 3); a field it
does not know is an error on stderr with exit 0 (then `scontrol -o show job` is read per job);
without slurmdbd, `sacct -c` reads the jobcomp/filetxt log, which keeps no comment and no job name
with spaces.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Iterable, Mapping, NamedTuple, Optional, Sequence

from gpuq.core.errors import GpuqError

TIMEOUT = 30.0  # seconds per command; squeue alone retries ~18 s against a dead controller
BATCH = 100  # job ids per squeue/sacct call
FINAL_STATES = frozenset(
    ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT")
)
SQUEUE_FIELDS = ("JobID", "State", "Reason", "exit_code", "RestartCnt", "StartTime", "EndTime", "Name")
SACCT_FIELDS = ("JobID", "State", "ExitCode", "Start", "End", "JobName")
NO_CONTROLLER = "Unable to contact slurm controller"
UNKNOWN_JOB = "Invalid job id specified"
NO_ACCOUNTING = "accounting storage is disabled"
BAD_FORMAT = "Invalid job format specification"
NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._+@:/-]+")


class SlurmError(GpuqError):
    """Slurm could not be asked or refused."""


class SlurmUnreachable(SlurmError):
    """The Slurm controller could not be reached: nothing was done."""


class SlurmNoAnswer(SlurmError):
    """A Slurm command ran past its timeout: what it asked for may or may not have been done."""


class SlurmJob(NamedTuple):
    id: int
    state: str  # PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    reason: Optional[str] = None  # Dependency, DependencyNeverSatisfied, BeginTime, None...
    exit_code: Optional[int] = None  # once ended: the batch script's exit code, 128+N if signal N ended it
    signal: Optional[int] = None  # the signal that ended it (0: none)
    restarts: Optional[int] = None  # requeues so far; None when the source does not say
    start: Optional[float] = None  # seconds since the epoch; a pending job's is Slurm's estimate
    end: Optional[float] = None
    name: Optional[str] = None
    source: str = "squeue"  # squeue, scontrol, sacct: who answered

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES


def slurm_job_name(name: str) -> str:
    """A gpuq job's name for `--job-name`: runs of other characters than `[A-Za-z0-9._+@:/-]`
    become `_` (Slurm's completion log cannot store spaces, `sacct -P` splits on `|`)."""
    return NAME_UNSAFE.sub("_", name).strip("_") or "gpuq"


def comment_marker(spool_id: str, job_id: int) -> str:
    """The `--comment` of a job handed over from spool `spool_id`: `gpuq:<spool-id>:<job-id>`."""
    return f"gpuq:{spool_id}:{job_id}"


def _run(argv: Sequence[str], env: Optional[Mapping[str, str]], stdin_text: str = "") -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(argv), input=stdin_text, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    except FileNotFoundError:
        raise SlurmError(f"Slurm's {argv[0]} is not on PATH: run gpuq on the cluster's login node") from None
    except subprocess.TimeoutExpired:
        raise SlurmNoAnswer(
            f"the Slurm controller does not answer ({argv[0]} gave no answer in {TIMEOUT:g} s)"
        ) from None


def _last_error(stderr: str) -> str:
    """The line of a Slurm command's stderr that says what went wrong."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["no message"])[-1]


def _refusal(stderr: str) -> str:
    """Why sbatch refused, in one line: its error line, else its first own line (an unknown option
    is said on one line, then a pointer to `--help` that says nothing of it)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not any("error" in line.lower() for line in lines):
        lines = [line for line in lines if line.startswith("sbatch:")][:1] or lines
    return _last_error("\n".join(lines)).removeprefix("sbatch: ")


def _failure(what: str, proc: subprocess.CompletedProcess) -> SlurmError:
    line = _last_error(proc.stderr)
    if NO_CONTROLLER in proc.stderr:
        return SlurmUnreachable(f"the Slurm controller does not answer ({line})")
    return SlurmError(f"{what} failed (exit {proc.returncode}): {line}")


def submit(script: str, options: Sequence[str], *, env: Optional[Mapping[str, str]] = None) -> int:
    """The new Slurm job's id. After a timeout it may have been submitted: `find_by_comment` tells."""
    proc = _run(["sbatch", "--parsable", *options], env, stdin_text=script)
    if proc.returncode != 0:
        if NO_CONTROLLER in proc.stderr:
            raise _failure("sbatch", proc)
        raise SlurmError(f"sbatch refused the job: {_refusal(proc.stderr)}")
    return parse_parsable(proc.stdout)


def parse_parsable(stdout: str) -> int:
    """The job id in `sbatch --parsable`'s answer: `123`, `123;cluster` or `Submitted batch job 123`."""
    for line in stdout.splitlines():
        word = line.strip().split(";", 1)[0].split()[-1:] if line.strip() else []
        if word and word[0].isdigit():
            return int(word[0])
    raise SlurmError(f"sbatch answered without a job id: {stdout.strip()[:200]!r}")


def cancel(slurm_id: int, signal: Optional[str] = None, *, env: Optional[Mapping[str, str]] = None) -> bool:
    """Cancel a job or, with `signal` (`TERM`...), send it to its batch shell only. True when Slurm
    took the request; False when the job is unknown or ended (`-v`: else scancel says nothing)."""
    argv = ["scancel", "-v"] + (["-b", "-s", signal] if signal else []) + [str(slurm_id)]
    proc = _run(argv, env)
    if UNKNOWN_JOB in proc.stderr or "already completing or completed" in proc.stderr:
        return False
    if proc.returncode != 0:
        raise _failure("scancel", proc)
    return True


def query(ids: Iterable[int], *, env: Optional[Mapping[str, str]] = None) -> dict[int, SlurmJob]:
    """What Slurm knows of `ids`: squeue, then sacct for the jobs the controller forgot."""
    wanted = sorted({int(i) for i in ids})
    found: dict[int, SlurmJob] = {}
    for i in range(0, len(wanted), BATCH):
        found.update(_squeue(wanted[i : i + BATCH], env))
    missing = [i for i in wanted if i not in found]
    for i in range(0, len(missing), BATCH):
        # The last record of a job wins: a requeued job has one per run in the completion log.
        rows = _sacct(["-j", ",".join(map(str, missing[i : i + BATCH]))], SACCT_FIELDS, env)
        found.update({job.id: job for job in map(parse_sacct_row, rows) if job is not None and job.id in missing})
    return found


def _squeue(ids: list[int], env: Optional[Mapping[str, str]]) -> dict[int, SlurmJob]:
    fmt = ",".join(f"{field}:|" for field in SQUEUE_FIELDS)
    proc = _run(["squeue", "-h", "-t", "all", "-j", ",".join(map(str, ids)), "-O", fmt], env)
    if proc.returncode != 0:
        if UNKNOWN_JOB in proc.stderr:
            return {}
        raise _failure("squeue", proc)
    if BAD_FORMAT in proc.stderr:  # a Slurm without one of the fields: ask scontrol, job by job
        return _scontrol(ids, env)
    jobs = (parse_squeue_line(line) for line in proc.stdout.splitlines())
    return {job.id: job for job in jobs if job is not None}


def parse_squeue_line(line: str) -> Optional[SlurmJob]:
    """One line of `squeue -O` with SQUEUE_FIELDS, each ending in `|`; None for a step or header."""
    fields = [f.strip() for f in line.split("|")]
    if len(fields) < len(SQUEUE_FIELDS) or not fields[0].isdigit():
        return None
    job_id, state, reason, status, restarts, start, end = fields[:7]
    name = "|".join(fields[7:]).rstrip("|").strip()  # the last field: may itself contain `|`
    return _job(job_id, state, status, start, end, name, "squeue", reason, restarts)


def _job(
    job_id: str,
    state: str,
    ended: str,
    start: str,
    end: str,
    name: str,
    source: str,
    reason: str = "",
    restarts: str = "",
) -> SlurmJob:
    """A SlurmJob from the texts Slurm's commands print (its exit status only once it ended)."""
    state = _state(state)
    exit_code, sig = _exit_status(ended) if state in FINAL_STATES else (None, None)
    reason = reason.strip()
    return SlurmJob(
        int(job_id), state, None if reason in ("", "None", "(null)") else reason, exit_code, sig,
        int(restarts) if restarts.isdigit() else None, slurm_time(start), slurm_time(end), name or None, source,
    )  # fmt: skip


def _scontrol(ids: list[int], env: Optional[Mapping[str, str]]) -> dict[int, SlurmJob]:
    found = {}
    for job_id in ids:
        proc = _run(["scontrol", "-o", "show", "job", str(job_id)], env)
        if proc.returncode != 0:
            if UNKNOWN_JOB in proc.stderr:
                continue
            raise _failure("scontrol show job", proc)
        job = parse_scontrol_line(proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else "")
        if job is not None:
            found[job.id] = job
    return found


def parse_key_values(line: str) -> dict[str, str]:
    """`Key=value Key2=a value with spaces ...` (scontrol -o, jobcomp/filetxt) as a dict: a value
    runs until the next ` Word=` (values with spaces, like job names, stay whole)."""
    out: dict[str, str] = {}
    key: Optional[str] = None
    for word in line.split(" "):
        head, sep, rest = word.partition("=")
        if sep and head and all(c.isalnum() or c in "_:/" for c in head):
            key = head
            out[key] = rest
        elif key is not None:
            out[key] += " " + word
    return {k: v.strip() for k, v in out.items()}


def parse_scontrol_line(line: str) -> Optional[SlurmJob]:
    """One line of `scontrol -o show job ID`."""
    values = parse_key_values(line)
    if not values.get("JobId", "").isdigit():
        return None
    get = values.get
    return _job(
        values["JobId"], get("JobState", ""), get("ExitCode", ""), get("StartTime", ""), get("EndTime", ""),
        get("JobName", ""), "scontrol", get("Reason", ""), get("Restarts", ""),
    )  # fmt: skip


def _sacct(args: list[str], fields: Sequence[str], env: Optional[Mapping[str, str]]) -> list[list[str]]:
    """Rows of `sacct -X -P -n ARGS -o FIELDS` from slurmdbd, else from the jobcomp/filetxt log (`-c`)."""
    base = ["sacct", "-X", "-P", "-n", *args, "-o", ",".join(fields)]
    try:
        proc = _run(base, env)
        if proc.returncode != 0 and NO_ACCOUNTING in proc.stderr + proc.stdout:
            proc = _run(base[:1] + ["-c"] + base[1:], env)
    except SlurmError:
        return []  # no sacct: squeue's answer is all there is
    if proc.returncode != 0:
        return []
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.strip()]
    return [row for row in rows if len(row) == len(fields)]


def parse_sacct_row(row: Sequence[str]) -> Optional[SlurmJob]:
    """One `sacct -P` row of SACCT_FIELDS (`4|FAILED|3:0|2026-12-02T18:11:32|...|name`)."""
    job_id, state, exit_pair, start, end, name = (f.strip() for f in row)
    if not job_id.isdigit():
        return None  # a step (`4.batch`) or a job-array element
    return _job(job_id, state, exit_pair, start, end, name, "sacct")


def find_by_comment(
    marker: str, *, name: Optional[str] = None, since: Optional[float] = None, env: Optional[Mapping[str, str]] = None
) -> list[tuple[int, str]]:
    """This user's Slurm jobs whose comment is `marker`, as (slurm_id, state), oldest first: from
    squeue, then sacct (the comment needs `AccountingStoreFlags=job_comment`; the jobcomp/filetxt
    log keeps none: there a job named `name` submitted since `since`, default a day ago, counts)."""
    uid = str(os.getuid())
    proc = _run(["squeue", "-h", "-t", "all", "-u", uid, "-O", "JobID:|,State:|,Comment:|"], env)
    if proc.returncode != 0:
        raise _failure("squeue", proc)
    found: dict[int, str] = {}
    for line in proc.stdout.splitlines():
        job_id, _, rest = line.partition("|")
        state, _, comment = rest.partition("|")
        if job_id.strip().isdigit() and comment.strip().rstrip("|").strip() == marker:
            found[int(job_id)] = _state(state)
    since = time.time() - 86400 if since is None else since
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
    fields = ("JobID", "State", "JobName", "Submit", "Comment")
    for job_id, state, job_name, submitted, comment in _sacct(["-u", uid, "-S", start], fields, env):
        if not job_id.isdigit() or int(job_id) in found:
            continue
        if comment == marker or (
            not comment and name is not None and job_name == name and (slurm_time(submitted) or 0) >= since - 1
        ):
            found[int(job_id)] = _state(state)
    return sorted(found.items())


def _state(text: str) -> str:
    """`CANCELLED by 0` -> `CANCELLED`; `COMPLETED+` (a truncated column) -> `COMPLETED`."""
    words = text.strip().split()
    return words[0].rstrip("+") if words else "UNKNOWN"


def _exit_status(text: str) -> tuple[Optional[int], Optional[int]]:
    """(exit code, signal) from `3:0` (scontrol, sacct) or a raw wait status (squeue: 768 = 3).
    A job ended by signal N gets exit code 128+N, as gpuq records local jobs."""
    text = text.strip()
    if ":" in text:
        code, _, sig = text.partition(":")
        if not (code.isdigit() and sig.isdigit()):
            return None, None
        number, signum = int(code), int(sig)
    elif text.isdigit():
        number, signum = int(text) >> 8, int(text) & 0x7F
    else:
        return None, None
    return (128 + signum if signum else number), signum


def slurm_time(text: str) -> Optional[float]:
    """Seconds since the epoch from Slurm's local `2026-12-02T18:11:32`; None for N/A and the like."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
