"""Ending a job's processes: its process group and, for an adopted job that leads none, its tree.
Apart from procs.py because only the commands and processes that end jobs need `signal`."""

from __future__ import annotations

import os
import signal
import time
from contextlib import suppress
from typing import Any, NamedTuple, Optional

from gpuq.core.job import Job
from gpuq.system.procs import job_alive, load_psutil

END_POLL_SECONDS = 0.1  # how often end_group looks whether a job's leftovers have gone
KILL_WAIT = 5.0  # seconds for SIGKILLed processes to go before they count as surviving it
KILL_GRACE_SECONDS = 10.0  # SIGTERM, then SIGKILL after this (`gpuq kill`, a job's end; `gpuq run --kill-grace`)


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def ungrouped_tree(pid: int) -> list[Any]:
    """What ending a job must reach besides its process group: [] for a group leader (every job gpuq
    starts), else (adopted) the process and its descendants now, as psutil.Process objects, whose
    start time keeps a later kill off a reused pid."""
    psutil = load_psutil()
    try:
        if os.getpgid(pid) == pid:
            return []
        proc = psutil.Process(pid)
        return [proc] + proc.children(recursive=True)
    except (OSError, psutil.Error):
        return []


def group_members(pgid: int) -> list[Any]:
    """Live (non-zombie) processes of process group `pgid`."""
    if not pgid or not signal_group(pgid, 0):
        return []  # nobody left in the group: the cheap, common answer
    psutil = load_psutil()
    out = []
    for proc in psutil.process_iter():
        with suppress(OSError, psutil.Error):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
    return out


def leftovers(pgid: int, snapshot: list[Any]) -> list[Any]:
    """What still lives of a job: its group, plus what `ungrouped_tree` saw."""
    psutil = load_psutil()
    alive = {p.pid: p for p in group_members(pgid)}
    for proc in snapshot:
        with suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.setdefault(proc.pid, proc)
    return list(alive.values())


def wait_gone(pgid: int, snapshot: list[Any], timeout: float, kill: bool = False) -> list[Any]:
    """Wait until nothing of the job is left or `timeout` passes, SIGKILLing what lives meanwhile
    if `kill` (again while new ones appear); returns what is still alive. A kill goes through
    psutil, which checks the start time, so a reused pid is never hit."""
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(pgid, snapshot)
        if not left or time.monotonic() >= deadline:
            return left
        if kill:
            signal_each(left, "kill")
        time.sleep(0.05 if kill else 0.1)


def terminate(pgid: int, snapshot: list[Any]) -> None:
    """SIGTERM the job's group; a process that leads no group (adopted) is signalled itself."""
    if not signal_group(pgid, signal.SIGTERM):
        signal_each(snapshot[:1], "terminate")


class GroupEnd(NamedTuple):
    """What `end_group` found of a job's group after its main process had ended: "PID NAME" of
    each process gone after SIGTERM, gone after SIGKILL, and still alive (uninterruptible)."""

    by_term: list[str]
    by_kill: list[str]
    survivors: list[str]


def end_group(pgid: int, grace: float, since: Optional[float] = None) -> Optional[GroupEnd]:
    """End what is left of a job's group once its main process was reaped, as Slurm ends a job step:
    SIGTERM (and SIGCONT), SIGKILL `grace` seconds after `since` (time.monotonic(); default now),
    then up to KILL_WAIT seconds for the kernel. None when nothing was left (one killpg). While a
    member lives, its pgid is not reused."""
    seen: dict[int, str] = {}
    if not signal_group(pgid, 0):
        return None
    left = _note_members(pgid, seen)  # zombies keep the group alive for killpg: they do not count
    if not left:
        return None
    signal_group(pgid, signal.SIGTERM)
    signal_group(pgid, signal.SIGCONT)
    deadline = (time.monotonic() if since is None else since) + grace
    while left and time.monotonic() < deadline:
        time.sleep(END_POLL_SECONDS)
        left = _note_members(pgid, seen)
    termed = set(seen) - left
    killed_at = time.monotonic()
    while left and time.monotonic() - killed_at < KILL_WAIT:
        signal_group(pgid, signal.SIGKILL)  # again while new ones appear
        time.sleep(0.05)
        left = _note_members(pgid, seen)
    names = [[seen[pid] for pid in sorted(pids)] for pids in (termed, set(seen) - termed - left, left)]
    return GroupEnd(*names)


def _note_members(pgid: int, seen: dict[int, str]) -> set[int]:
    """The live members of the group now; each one's "PID NAME" noted in `seen`."""
    psutil = load_psutil()
    alive = set()
    for proc in group_members(pgid):
        alive.add(proc.pid)
        if proc.pid not in seen:
            try:
                seen[proc.pid] = f"{proc.pid} {proc.name()}"
            except psutil.Error:  # gone or hidden meanwhile
                seen[proc.pid] = str(proc.pid)
    return alive


def signal_each(processes: list[Any], method: str) -> None:
    psutil = load_psutil()
    for proc in processes:
        with suppress(psutil.Error):
            getattr(proc, method)()


def job_grace(job: Job) -> float:
    """The --kill-grace of the worker that started the job, which its supervisor recorded; else the default."""
    grace = (job.supervisor or {}).get("kill_grace")
    if isinstance(grace, (int, float)) and not isinstance(grace, bool) and grace >= 0:
        return float(grace)
    return KILL_GRACE_SECONDS


def terminate_tree(job: Job, grace: float, term: bool = True) -> bool:
    """SIGTERM the job's process group (unless not `term`: another sends it), wait up to `grace` for
    all of it to go, then SIGKILL whatever is left of it. True once nothing of the job lives."""
    pgid = job.pid
    if not pgid:
        return True
    snapshot = ungrouped_tree(pgid) if job_alive(job) else []
    if term:
        terminate(pgid, snapshot)
    return not wait_gone(pgid, snapshot, grace) or not wait_gone(pgid, snapshot, KILL_GRACE_SECONDS, kill=True)
