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
from gpuq.core.words import plural
from gpuq.engine.lifecycle import repairs
from gpuq.engine.lifecycle.enqueue import default_name
from gpuq.engine.lifecycle.interpreter import refuse_too_long
from gpuq.engine.schedule import leasing
from gpuq.spool import JobRef, Spool
from gpuq.system import gpus as gpu_info
from gpuq.system import policy, procs
from gpuq.system.lease_io import user_name
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


def adopt(spool: Spool, pid: int, name: Optional[str] = None, log: Optional[str] = None) -> tuple[JobRef, Job, str]:
    """Publish `pid` as a running adopted job and return it, with what it leases ("" without
    GPUs); AdoptError with the reason if not."""
    log_path = _check_log(log)
    if pid == os.getpid():
        raise AdoptError("gpuq cannot adopt itself")
    info = describe(pid)
    if name is not None and not name.strip():
        raise AdoptError("--name must not be empty")
    gpus, known, why = gpu_info.used_by(pid)
    # One adopter at a time: the check "not tracked yet" and the publish must not interleave,
    # or two `gpuq adopt` of the same pid would both succeed.
    with spool.adopt_lock():
        reason = tracked_by(spool, info)
        if reason:
            raise AdoptError(f"process {pid} is already tracked by gpuq: {reason}")
        job = _job(spool, info, name, log_path, gpus, why)
        ref = spool.jobs.publish(job, RUNNING)
    leased = ""
    if not procs.is_same_process(pid, info["create_time"], job.boot_id):
        # It ended while we were adopting: let recovery record that honestly right away.
        repairs.settle_unsupervised(spool, repairs.Report())
    elif job.gpus:
        leased = _keep_leases(job, spool_ids(str(spool.home), spool.lease_id.get())[0], known)
    return ref, job, leased


def _keep_leases(job: Job, key: str, known: list[int]) -> str:
    """Lease whole the GPUs the adopted process is known to use (`known`: those its
    CUDA_VISIBLE_DEVICES names, or where it holds memory; not every GPU it may use, which would keep
    every other user off the machine for a script that uses none), as many as its user's cap allows,
    so that every user's gpuq on the machine sees them taken as a started job's (`key`: the spool's
    name in leases, leases.spool_ids). A keeper forked
    from this command (the process has no supervisor) takes them, so that their file names carry
    the pid of the process that holds their locks, holds them until the process ends, then adds
    their GPU-hours to the user's recent usage and releases them. This command waits for the keeper
    to say what it leased (through a pipe), and returns that line."""
    uuid_of = {gpu.index: gpu.uuid for gpu in gpu_info.look().gpus}  # NVML is never used after the fork
    known = [index for index in known if index in uuid_of]
    if not known:
        return "leases no GPU: none is named by its CUDA_VISIBLE_DEVICES or holds its memory (other users may use them)"
    reader, writer = os.pipe()
    if os.fork():
        os.close(writer)
        with os.fdopen(reader, "rb") as pipe:
            said, *lines = pipe.read().decode().split("\n")
        for line in lines:
            say_once(line, lambda line: print(f"gpuq adopt: {line}", file=sys.stderr))
        return said or "leases no GPU: its keeper ended before it could take them"
    try:
        os.close(reader)
        os.setsid()  # the shell that adopted it may hang up or take a Ctrl-C: not the keeper's end
        os.chdir("/")
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # whoever reads this command's output sees its end
            os.dup2(quiet, fd)
        problems: list[str] = []
        held, said = _take_leases(job, key, known, uuid_of, problems)
        os.write(writer, "\n".join([said, *problems]).encode())
        os.close(writer)  # the command prints that and exits; the keeper goes on
        while held and procs.is_same_process(job.pid, job.pid_create_time, job.boot_id):
            time.sleep(KEEPER_POLL_SECONDS)
        leasing.record_usage(held, lambda line: None)
        for lease in held:
            lease.release()
    finally:
        os._exit(0)


def _take_leases(
    job: Job, key: str, known: list[int], uuid_of: dict[int, str], problems: list[str]
) -> tuple[list[Held], str]:
    """The leases of the GPUs `known` that its user's cap leaves room for (counted as for a start:
    the GPUs of their live leases, all their spools together), taken under the placing locks of
    every GPU (the cap is the machine's), and the line that says which; none where leases cannot be
    used. `problems` gets the lines to say about the lease directory or the policy."""
    cap = policy.load(problems.append).of(user_name(os.geteuid())).max_gpus
    held: list[Held] = []
    try:
        directory = LeaseDir.open()
        with directory.placing(uuid_of.values()):
            mine = {lease.gpu_uuid for lease in directory.live() if lease.uid == os.geteuid()}
            for index, uuid in ((index, uuid_of[index]) for index in known):
                if cap is None or len(mine | {uuid}) <= cap:
                    mine.add(uuid)
                    held.append(directory.take(uuid, index, None, job=job.id, name=job.name, spool=key, pid=job.pid))
    except LeaseDirProblem as exc:
        for lease in held:
            lease.release()
        problems.append(str(exc))
        return [], "leases no GPU: leases cannot be used here"
    leased = [lease.lease.gpu_index for lease in held]
    said = f"leases GPU {','.join(map(str, leased))} until it ends" if held else "leases no GPU"
    left = [index for index in known if index not in leased]
    if cap is not None and left:
        said += f"; not GPU {','.join(map(str, left))}: your limit of {plural(cap, 'GPU')} at once on this machine"
    return held, said


def _check_log(log: Optional[str]) -> Optional[str]:
    if log is None:
        return None
    path = str(Path(log).expanduser().absolute())
    if not os.path.isfile(path):
        refuse_too_long("--log", path)
        raise AdoptError(f"--log {log}: no such file (give the file the process writes to)")
    return path


def _job(
    spool: Spool, info: dict[str, Any], name: Optional[str], log: Optional[str], gpus: Optional[list[int]], why: str
) -> Job:
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
    if gpus is not None:
        held = f"GPU {','.join(map(str, gpus))}" if gpus else "no GPU"
        job.update(
            gpus=gpus, slot=",".join(map(str, gpus)), gpu_request=len(gpus), note=f"{job.note}; holds {held} ({why})"
        )
    return job
