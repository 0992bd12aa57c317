"""The start phase: a claimed job moved to running/ and started in a session of its own
(spool_layout.md, section 6, steps 2 and 3).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Iterable, Optional

from gpuq.core import schema, transitions
from gpuq.core.job import ATTEMPT_HEADER, Job
from gpuq.core.jobenv import add_job_variables
from gpuq.core.states import RUNNING, SOURCE_IMPORTED
from gpuq.run import logcap
from gpuq.run.supervisor import hostlimits, lease
from gpuq.run.supervisor.order import StartOrder
from gpuq.spool import Claim, JobRef, Spool, SpoolFull
from gpuq.spool.files import open_regular
from gpuq.system import gitinfo, procs
from gpuq.system.leases import Held


@dataclass(eq=False)
class Run:
    spool: Spool
    claim: Claim
    ref: JobRef
    job: Job
    order: StartOrder  # what the worker said: where it runs, the worker's settings
    log_fd: int = -1
    timed_out: Optional[str] = None  # the time limit (as text) that stopped the run
    termed_at: Optional[float] = None  # when we sent the job's group SIGTERM (time.monotonic())
    would_not_die: list[str] = field(default_factory=list)  # "PID NAME" of leftovers that outlived SIGKILL
    queued: Optional[JobRef] = None  # its pending/ copy, until the job has been started
    leases: list[Held] = field(default_factory=list)  # its GPUs' leases, held until its processes are gone
    host: Optional[hostlimits.Keeper] = None  # how its --mem and --cpus are kept (run/supervisor/hostlimits.py)


Pump = threading.Thread  # copies a capped log's pipe into the log (run/logcap.py)
Started = tuple[Run, subprocess.Popen, Optional[Pump]]  # a job under way: its run, process and log pump


LOG_PREFIX = "=== gpuq: "  # gpuq's own lines in a job's log; ATTEMPT_HEADER is the first of each attempt


def log_line(log_fd: int, text: str) -> None:
    with suppress(OSError):  # a full disk: the log loses a line, the job file still records everything
        os.write(log_fd, f"{LOG_PREFIX}{text}\n".encode("utf-8", "surrogateescape"))  # argv bytes as given


def _take_earlier_log(log_fd: int, path: str) -> None:
    """An imported job's first start here: the original gpuq's log of it is copied in first, so that
    `gpuq log` shows the old runs before the new one, as a job's log here keeps every attempt."""
    source = open_regular(path)
    if source is None:
        return
    log_line(log_fd, f"the log the original gpuq kept of this job ({path}):")
    last = b"\n"
    with suppress(OSError):  # a full disk or an unreadable log: the new attempt's log is still written
        while chunk := os.read(source, 1 << 20):
            os.write(log_fd, chunk)
            last = chunk[-1:]
        if last != b"\n":
            os.write(log_fd, b"\n")
    os.close(source)


def begin(spool: Spool, claim: Claim, order: StartOrder, replacing: Iterable[Held] = ()) -> Optional[Run]:
    """pending -> running, its GPUs leased first (`replacing`: the leases of the job before it in the
    slot, released once these are taken). None (the claim given up) when the job is gone or changed,
    its GPUs were leased by someone else since, or the disk has no room for the move."""
    leases: list[Held] = []
    ref = spool.jobs.pending_ref(claim.job_id, order.file)
    if ref is None:  # cancelled or already run by someone else since the worker looked
        claim.release()
        return None
    try:
        job = spool.jobs.load(ref)
        if order.rev is not None and job.rev != order.rev:
            raise FileNotFoundError(ref.name)  # changed since it was named: the worker looks again
        if spool.jobs.newer_copy_elsewhere(ref, job):  # a crash mid-move left this stale copy behind
            spool.jobs.remove(ref)
            raise FileNotFoundError(ref.name)
        earlier = spool.logs.path_of(job) if job.source.startswith(SOURCE_IMPORTED) else None
        leases = lease.take(spool, order, job, replacing)
        changes = transitions.start(
            job,
            slot=order.slot,
            gpus=list(order.gpus) if order.gpus is not None else None,
            boot_id=procs.boot_id(),
            host=os.uname().nodename,
            log=str(spool.layout.log_path(job.id)),
            gpu_share=round(sum(held.share for held in leases), 4) if job.gpu_mem_mib and leases else None,
        )
        queued = ref
        ref, job = spool.jobs.move(ref, job, RUNNING, changes, keep_old=True)  # pending/'s copy goes once it runs
    except (FileNotFoundError, schema.InvalidJob, SpoolFull, lease.GpusTaken):
        lease.release(leases)
        claim.release()
        return None
    lease.release(replacing)  # the job before it has ended: these GPUs are held by the new leases now
    run = Run(spool, claim, ref, job, order, queued=queued, leases=leases)
    run.log_fd = spool.logs.open_job_log(job.id)
    if earlier is not None and earlier != job.log and not os.fstat(run.log_fd).st_size:
        _take_earlier_log(run.log_fd, earlier)
    header = f"{ATTEMPT_HEADER[len(LOG_PREFIX) :]}{job.id} {job.name} (attempt {job.attempts})"
    cwd = f"cwd: {job.cwd}" + (f"  CUDA_VISIBLE_DEVICES={order.slot}" if order.slot is not None else "")
    for line in (header, f"cmd: {shlex.join(job.cmd)}", cwd, f"started: {job.started_at}", *lease.unsaid()):
        log_line(run.log_fd, line)
    return run


def spawn(run: Run) -> tuple[subprocess.Popen, Optional[Pump]]:
    """Start the job in its own session, its output into its log (through the cap's pump when capped).
    OSError if it cannot start."""
    job = run.job
    cap = job.max_log_bytes or run.order.max_log_bytes  # the job's own cap first
    out_fd, read_fd = run.log_fd, -1
    if cap:
        read_fd, out_fd = os.pipe()
    run.host = hostlimits.keep(job, lambda text: log_line(run.log_fd, text))
    env = job_environment(run.spool, job, run.order.slot)
    hostlimits.add_variables(env, job, run.host)
    try:
        child = subprocess.Popen(
            hostlimits.command(run.host, job.cmd),
            cwd=job.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            # gpuq itself runs with umask 077; the job's files get the mask of the shell that queued it
            umask=job.umask if job.umask is not None else schema.DEFAULT_JOB_UMASK,
            stdout=out_fd,
            stderr=out_fd,
            start_new_session=True,
            close_fds=True,
            preexec_fn=hostlimits.entering(run.host),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        hostlimits.close(run.host, lambda text: log_line(run.log_fd, text))
        if cap:
            os.close(read_fd)
            os.close(out_fd)
        if isinstance(exc, subprocess.SubprocessError):  # only the join of its cgroup runs before exec
            raise OSError(f"could not join its cgroup ({hostlimits.MODE_ENV}=watch does without)") from exc
        raise
    finally:
        drop_queued_copy(run)  # the running copy has the higher rev meanwhile (spool_layout.md, section 6)
    if not cap:
        return child, None
    os.close(out_fd)
    log = logcap.CappedLog(run.log_fd, str(run.spool.logs.path_of(job)), cap)
    return child, logcap.pump(read_fd, log)


def job_environment(spool: Spool, job: Job, slot: Optional[str]) -> dict[str, str]:
    """The environment of `gpuq add`'s shell (or the worker's, for hand-dropped jobs) and the job's."""
    env = dict(job.shell_env if job.shell_env is not None else os.environ)
    add_job_variables(env, job)
    env["GPUQ_HOME"] = str(spool.home)
    env["GPUQ_PROGRESS_FILE"] = str(spool.reports.progress_path(job.id))
    if slot is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = slot
    return env


def drop_queued_copy(run: Run) -> None:
    if run.queued is not None:
        run.spool.jobs.remove(run.queued)
        run.queued = None


def check_code_while_running(run: Run) -> Optional[threading.Thread]:
    """`note_code_change` in a thread, so that nothing waits for git. Until it is joined it alone
    writes the job's file: join it before the job's end is recorded."""
    if not run.job.code or run.job.snapshot:
        return None
    thread = threading.Thread(target=note_code_change, args=(run,), name="gpuq-code-check", daemon=True)
    thread.start()
    return thread


def note_code_change(run: Run) -> None:
    """Whether the code of the job's repository changed since it was queued, said in its file."""
    queued = run.job.code
    now = gitinfo.provenance(run.job.cwd)
    changed = gitinfo.changed(queued, now)
    if changed:  # an unchanged start needs no write: `code` is what runs
        log_line(run.log_fd, changed)
        try:
            run.job = run.spool.jobs.rewrite(run.ref, run.job, code_changed=changed, code_at_start=now)
        except OSError as exc:  # a full disk: the log line has it; the job runs regardless
            log_line(run.log_fd, f"could not record the code change in the job file: {exc}")
