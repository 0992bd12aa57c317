"""The kernel's hold on a job's host memory and CPUs: a cgroup v2 of its own, or a scope of the
user's systemd (else the caller watches memory).

cgroup v2 forbids processes in a cgroup whose children have controllers enabled (the root
excepted), so jobs are not children of the supervisor's cgroup: gpuq makes a sub-tree `gpuq` beside
it, in the nearest cgroup that has (or may be given) `memory` and `cpu`, and each job a child with
its limits, no swap (a job swapping past its limit is what freezes a machine) and a group OOM kill.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import subprocess
from contextlib import suppress
from typing import Optional

from gpuq.system import fsutil

TREE_NAME = "gpuq"
CONTROLLERS = ("memory", "cpu")
CPU_PERIOD_US = 100_000  # cpu.max's period: a quota of N CPUs is N periods of CPU time per period
# set where the kernel has them (memory.oom.group: Linux 4.19; memory.swap.max: swap accounting)
OPTIONAL_MEMORY_FILES = {"memory.oom.group": "1", "memory.swap.max": "0"}
PROBE_SECONDS = 10.0  # the systemd-run probe and the scope's questions at the end, each at most


def own_cgroup() -> Optional[str]:
    """This process's cgroup in the v2 hierarchy ("/..."), from /proc/self/cgroup's `0::` line."""
    with suppress(OSError), open("/proc/self/cgroup", encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            if line.startswith("0::"):
                return line[3:].rstrip("\n")
    return None


@functools.cache
def gpuq_tree() -> tuple[Optional[str], str]:
    """The gpuq sub-tree, made once per process; or None and why a job cannot have a cgroup here."""
    # the cgroup v2 hierarchy's mount: /sys/fs/cgroup, or .../unified on a hybrid
    mount = next((point for point, kind in fsutil.mounts() if kind == "cgroup2"), None)
    own = own_cgroup()
    if mount is None or own is None:
        return None, "no cgroup v2 hierarchy here"
    here = os.path.normpath(mount + own)
    if not os.path.isdir(here):  # its cgroup lies outside this namespace's view
        return None, f"this process's cgroup {own} is not under {mount}"
    places = [here] if here == mount else [here, os.path.dirname(here)]
    why = ""
    for parent in places:
        try:
            return _make_tree(parent), ""
        except OSError as exc:
            why = why or _why(parent, exc)
    return None, why


def _make_tree(parent: str) -> str:
    """`parent/gpuq`, both controllers enabled for its children; OSError when that cannot be."""
    missing = [c for c in CONTROLLERS if c not in _words(os.path.join(parent, "cgroup.controllers"))]
    if missing:
        raise OSError(errno.ENOTSUP, f"has no {' and '.join(missing)} controller")
    _enable(parent)  # EBUSY where `parent` holds processes and is not the root cgroup
    tree = os.path.join(parent, TREE_NAME)
    with suppress(FileExistsError):  # made by an earlier supervisor: it holds only job cgroups
        os.mkdir(tree, 0o755)
    _enable(tree)
    return tree


def _enable(cgroup: str) -> None:
    path = os.path.join(cgroup, "cgroup.subtree_control")
    if not all(c in _words(path) for c in CONTROLLERS):
        _write(path, " ".join(f"+{c}" for c in CONTROLLERS))


def _why(parent: str, exc: OSError) -> str:
    if exc.errno == errno.EBUSY:
        return f"cgroup v2 {parent} holds processes: its children get no controllers (no internal processes)"
    if exc.errno == errno.ENOTSUP and exc.strerror:
        return f"cgroup v2 {parent} {exc.strerror}"
    return f"cgroup v2 {parent}: {exc.strerror or exc}"


def job_cgroup(tree: str, name: str, mem_mib: Optional[int], cpus: Optional[int]) -> str:
    """A new cgroup `tree/name` with the job's limits; OSError (nothing left behind) if it cannot be."""
    path = os.path.join(tree, name)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        os.rmdir(path)  # a cgroup a supervisor of this pid left (it died): empty, or OSError
        os.mkdir(path, 0o755)
    try:
        if mem_mib:
            _write(os.path.join(path, "memory.max"), str(mem_mib << 20))
            for name, value in OPTIONAL_MEMORY_FILES.items():
                if os.path.exists(os.path.join(path, name)):
                    _write(os.path.join(path, name), value)
        if cpus:
            _write(os.path.join(path, "cpu.max"), f"{cpus * CPU_PERIOD_US} {CPU_PERIOD_US}")
    except OSError:
        remove(path)
        raise
    return path


def join(path: str) -> None:
    """Move the calling process into cgroup `path` (the job's child, between fork and exec)."""
    _write(os.path.join(path, "cgroup.procs"), str(os.getpid()))


def oom_kills(path: str) -> int:
    """How many processes the kernel's OOM killer ended in cgroup `path` (memory.events)."""
    with suppress(OSError, ValueError), open(os.path.join(path, "memory.events"), encoding="ascii") as fh:
        for line in fh:
            key, _sep, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return 0


def remove(path: str) -> bool:
    """Remove an empty job cgroup; False while processes (that left the job's group) remain in it."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def runtime_dir() -> str:
    return os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"


@functools.cache
def user_scope() -> tuple[bool, str]:
    """Whether `systemd-run --user --scope` can hold a job here (probed once, with a real scope)."""
    if not os.path.exists(os.path.join(runtime_dir(), "systemd", "private")):
        return False, "no user systemd running"
    if shutil.which("systemd-run") is None:
        return False, "no systemd-run on PATH"
    try:
        probe = subprocess.run(
            ["systemd-run", "--user", "--scope", "--quiet", "-p", "MemoryMax=infinity", "true"],
            env=dict(os.environ, XDG_RUNTIME_DIR=runtime_dir()),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"systemd-run --user --scope failed: {exc}"
    if probe.returncode != 0:
        said = probe.stderr.decode(errors="replace").strip().splitlines()
        return False, f"systemd-run --user --scope failed: {said[-1] if said else f'exit {probe.returncode}'}"
    return True, ""


def scope_argv(unit: str, mem_mib: Optional[int], cpus: Optional[int]) -> list[str]:
    """The words before a job's command that run it in a scope of its own with its limits."""
    argv = ["systemd-run", "--user", "--scope", "--quiet", f"--unit={unit}"]
    if mem_mib:
        argv += ["-p", f"MemoryMax={mem_mib}M", "-p", "MemorySwapMax=0"]
    if cpus:
        argv += ["-p", f"CPUQuota={cpus * 100}%"]
    return [*argv, "--"]


def scope_oom_killed(unit: str) -> bool:
    """Whether the kernel's OOM killer ended the scope `unit`, which is then reset (else it stays loaded)."""
    env = dict(os.environ, XDG_RUNTIME_DIR=runtime_dir())
    try:
        result = subprocess.run(
            ["systemctl", "--user", "show", "--property=Result", "--value", unit],
            env=env, capture_output=True, text=True, timeout=PROBE_SECONDS,
        )  # fmt: skip
        subprocess.run(
            ["systemctl", "--user", "reset-failed", unit], env=env, capture_output=True, timeout=PROBE_SECONDS
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.stdout.strip() == "oom-kill"


def _words(path: str) -> list[str]:
    with suppress(OSError, ValueError), open(path, encoding="ascii") as fh:
        return fh.read().split()
    return []


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)
