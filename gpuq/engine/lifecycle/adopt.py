"""`gpuq adopt PID`: take a process started outside gpuq into the queue as a running job, with no
supervisor (only a process's parent can learn its exit code): recovery ends it once it is gone. Its
GPUs are leased (lease_layout.md) by a keeper forked from the command, until the process ends."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Optional

import psutil

from gpuq.core import schema
from gpuq.core.errors import Refused
from gpuq.core.job import Job
from gpuq.core.states import RUNNING, SOURCE_ADOPT
from gpuq.core.times import iso_of
from gpuq.engine.lifecycle import repairs
from gpuq.engine.lifecycle.enqueue import default_name
from gpuq.engine.lifecycle.interpreter import refuse_too_long
from gpuq.engine.schedule import leasing
from gpuq.spool import JobRef, Spool
from gpuq.system import gpus as gpu_info
from gpuq.system import procs
from gpuq.system.leases import Held, LeaseDir, LeaseDirProblem, say_once, spool_ids

KEEPER_POLL_SECONDS = 1.0  # how long an adopted process's leases may outlive it


class AdoptError(Refused):
    """The process cannot be adopted; the message is one line for the user."""


def describe(pid: int) -> dict[str, Any]:
    """argv, cwd, start time and stdout of a process of ours, or AdoptError saying why not."""
    if pid <= 0:
        raise AdoptError(f"not a process id: {pid}")
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                raise AdoptError(f"process {pid} has already exited (a zombie waiting for its parent)")
            owner = proc.uids().real
            if owner != os.getuid():
                raise AdoptError(f"process {pid} belongs to another user (uid {owner}); only your own can be adopted")
            info = {
                "pid": pid,
                "cmd": proc.cmdline(),
                "cwd": proc.cwd(),
                "create_time": proc.create_time(),
                "stdout": _stdout_file(proc),
                "ancestors": [p.pid for p in proc.parents()],
            }
    except psutil.NoSuchProcess:
        raise AdoptError(f"no such process: {pid}") from None
    except psutil.AccessDenied:
        raise AdoptError(f"process {pid} cannot be read (permission denied); only your own can be adopted") from None
    if not info["cmd"]:
        raise AdoptError(f"process {pid} has no command line (a kernel thread?)")
    return info


def _stdout_file(proc: Any) -> Optional[str]:
    """The file the process writes its stdout to (`nohup python train.py > train.log &`): its log."""
    try:
        for entry in proc.open_files():
            if entry.fd == 1 and os.path.isfile(entry.path):
                return entry.path
    except Exception:  # psutil raises several kinds here on some platforms; a log is optional
        return None
    return None


def tracked_by(spool: Spool, info: dict[str, Any]) -> Optional[str]:
    """Why gpuq already tracks this process (a job's, its supervisor, inside a job, a worker), or None."""
    for _ref, job in spool.jobs.load_many(RUNNING):
        ident = (job.pid, job.pid_create_time)
        sup = job.supervisor or {}
        if _same(ident, info):
            return f"it is job #{job.id} ({job.name})"
        if _same((sup.get("pid"), sup.get("create_time")), info):
            return f"it is the supervisor of job #{job.id} ({job.name})"
        if job.pid in info["ancestors"] and procs.job_alive(job):
            return f"it runs inside job #{job.id} ({job.name})"
    here = socket.gethostname()  # a live worker's file is flocked: its pid is that worker's, not reused
    if any(w.get("pid") == info["pid"] and w.get("host", here) == here for w in spool.workers.live(tidy=False)):
        return "it is gpuq's worker (`gpuq stop` stops it)"
    return None


def _same(ident: tuple[Any, Any], info: dict[str, Any]) -> bool:
    pid, created = ident
    return (
        pid == info["pid"]
        and isinstance(created, (int, float))
        and abs(created - info["create_time"]) <= procs.CREATE_TIME_TOLERANCE
    )


def adopt(spool: Spool, pid: int, name: Optional[str] = None, log: Optional[str] = None) -> tuple[JobRef, Job]:
    """Publish `pid` as a running adopted job and return it; AdoptError with the reason if not."""
    log_path = _check_log(log)
    if pid == os.getpid():
        raise AdoptError("gpuq cannot adopt itself")
    info = describe(pid)
    if name is not None and not name.strip():
        raise AdoptError("--name must not be empty")
    # One adopter at a time: the check "not tracked yet" and the publish must not interleave,
    # or two `gpuq adopt` of the same pid would both succeed.
    with spool.adopt_lock():
        reason = tracked_by(spool, info)
        if reason:
            raise AdoptError(f"process {pid} is already tracked by gpuq: {reason}")
        job = _job(spool, info, name, log_path)
        ref = spool.jobs.publish(job, RUNNING)
    if not procs.is_same_process(pid, info["create_time"], job.boot_id):
        # It ended while we were adopting: let recovery record that honestly right away.
        repairs.settle_unsupervised(spool, repairs.Report())
    elif job.gpus:
        _keep_leases(job, spool_ids(str(spool.home), spool.lease_id.get())[0])
    return ref, job


def _keep_leases(job: Job, spool: str) -> None:
    """Lease the adopted process's GPUs whole, so that every user's gpuq on the machine sees them
    taken as a started job's, and leave a keeper (a fork of this command: the process has no
    supervisor to hold them) that holds the leases' locks until the process ends, then adds their
    GPU-hours to the user's recent usage and releases them. Without a usable lease directory it says
    why, and only the memory the process holds shows to other users."""
    uuid_of = {gpu.index: gpu.uuid for gpu in gpu_info.look().gpus}
    indices = [index for index in job.gpus or () if index in uuid_of]
    held: list[Held] = []
    try:
        directory = LeaseDir.open()
        with directory.placing(uuid_of[index] for index in indices):
            for index in indices:
                taken = directory.take(uuid_of[index], index, None, job=job.id, name=job.name, spool=spool, pid=job.pid)
                held.append(taken)
    except LeaseDirProblem as exc:
        for lease in held:
            lease.release()
        say_once(str(exc), lambda line: print(f"gpuq adopt: {line}", file=sys.stderr))
        return
    if not held:
        return
    if os.fork():
        for lease in held:  # the keeper holds their locks now: closed here, not released
            if lease.fd is not None:
                os.close(lease.fd)
        return
    try:
        os.setsid()  # the shell that adopted it may hang up or take a Ctrl-C: not the keeper's end
        os.chdir("/")
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # whoever reads this command's output sees its end
            os.dup2(quiet, fd)
        while procs.is_same_process(job.pid, job.pid_create_time, job.boot_id):
            time.sleep(KEEPER_POLL_SECONDS)
        leasing.record_usage(held, lambda line: None)
        for lease in held:
            lease.release()
    finally:
        os._exit(0)


def _check_log(log: Optional[str]) -> Optional[str]:
    if log is None:
        return None
    path = str(Path(log).expanduser().absolute())
    if not os.path.isfile(path):
        refuse_too_long("--log", path)
        raise AdoptError(f"--log {log}: no such file (give the file the process writes to)")
    return path


def _job(spool: Spool, info: dict[str, Any], name: Optional[str], log: Optional[str]) -> Job:
    cmd, cwd = info["cmd"], info["cwd"]
    job = schema.new_job(
        job_id=spool.ids.allocate(),
        name=name or default_name(Path(cwd), cmd),
        cmd=cmd,
        cwd=cwd,
        log=log or info["stdout"] or "",
        source=SOURCE_ADOPT,
    )
    job.update(
        adopted=True,
        started_at=iso_of(info["create_time"]),
        pid=info["pid"],
        pid_create_time=info["create_time"],
        boot_id=procs.boot_id(),
        host=socket.gethostname(),
        slot=None,
        attempts=1,
        note="adopted: started outside gpuq; its exit code cannot be known",
    )
    # the GPUs it may use are held as a running job's: nothing else of gpuq's starts on them
    gpus, why = gpu_info.used_by(info["pid"])
    if gpus is not None:
        held = f"GPU {','.join(map(str, gpus))}" if gpus else "no GPU"
        job.update(
            gpus=gpus, slot=",".join(map(str, gpus)), gpu_request=len(gpus), note=f"{job.note}; holds {held} ({why})"
        )
    return job
