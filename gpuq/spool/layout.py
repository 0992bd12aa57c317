"""Where everything lives in the spool: the one place that builds a path under $GPUQ_HOME (plain
strings, os.path), as spool_layout.md section 1 ("The tree") lays it out.
"""

from __future__ import annotations

import os
import re
from typing import Optional, Union

from gpuq.core.states import REJECTED, STATES
from gpuq.spool.errors import SpoolError
from gpuq.system import security

# gpuq's own directories beside the states (see spool_layout.md for what each holds).
INTERNAL = ("tmp", "locks", "logs", "workers", "control", "progress", "cache", "imports", "snapshots")
PLAIN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.json$")  # a dropped file gpuq takes in
INTAKE_RE = re.compile(r"^\.intake-(\d{6,})-(.+)$")  # a dropped file being taken in, with its new id
JOB_NAME_RE = re.compile(r"^(\d{6,})-[A-Za-z0-9._-]*\.json$")  # a published job file's name


def is_job_name(name: str) -> bool:
    """A published job file's name (the id ends at the first "-")."""
    return JOB_NAME_RE.match(name) is not None


def default_home() -> str:
    return os.path.abspath(os.environ.get("GPUQ_HOME") or os.path.join(os.path.expanduser("~"), ".gpuq"))


class Layout:
    """The paths of one spool. Building a path touches nothing; `ensure()` creates the tree."""

    def __init__(self, home: Optional[Union[str, os.PathLike[str]]] = None):
        self.home = os.path.abspath(home) if home is not None else default_home()

    def ensure(self) -> bool:
        """Create the tree (mode 0700) on first use, and refuse a tree that others could write
        into: whoever can drop a file in pending/ runs commands as us (see system/security.py).
        True if it created a directory (a new spool, or one an older gpuq made without it)."""
        os.umask(0o077)
        made = False
        for sub in ("",) + STATES + (REJECTED,) + INTERNAL:
            path = os.path.join(self.home, sub) if sub else self.home
            try:
                if sub == "":
                    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                os.mkdir(path, 0o700)
                made = True
            except FileExistsError:
                pass  # checked below, whatever it turns out to be
            problem = security.directory_problem(path, is_home=(sub == ""))
            if problem:
                raise SpoolError(problem)
        return made

    def state_dir(self, state: str) -> str:
        return os.path.join(self.home, state)

    def job_path(self, state: str, name: str) -> str:
        return os.path.join(self.home, state, name)

    def rejected_path(self, name: str) -> str:
        return os.path.join(self.home, REJECTED, name)

    # ---- per-job files, named by id alone (never by anything read inside a job file) ---------
    def lock_path(self, job_id: int) -> str:
        return os.path.join(self.home, "locks", f"{job_id:06d}.lock")

    def control_path(self, job_id: int) -> str:
        return os.path.join(self.home, "control", f"{job_id:06d}.json")

    def log_path(self, job_id: int) -> str:
        return os.path.join(self.home, "logs", f"{job_id:06d}.log")

    def progress_path(self, job_id: int) -> str:
        return os.path.join(self.home, "progress", f"{job_id:06d}.json")

    def samples_path(self, job_id: int) -> str:
        return os.path.join(self.home, "progress", f"{job_id:06d}.samples.json")

    def gpu_use_path(self, job_id: int) -> str:
        return os.path.join(self.home, "progress", f"{job_id:06d}.gpu.json")

    def worker_log_path(self) -> str:
        return os.path.join(self.home, "logs", "worker.log")

    def worker_info_path(self, pid: int) -> str:
        return os.path.join(self.home, "workers", f"worker-{pid}.json")

    def worker_gpus_path(self, pid: int) -> str:
        return os.path.join(self.home, "workers", f"gpus-{pid}.json")

    def worker_lock_path(self, name: str) -> str:
        return os.path.join(self.home, "workers", f"{name}.lock")

    def import_path(self, fingerprint: str) -> str:
        return os.path.join(self.home, "imports", f"{fingerprint}.json")

    def snapshot_path(self, first_id: int) -> str:
        return os.path.join(self.home, "snapshots", f"{first_id:06d}")

    def cache_path(self, name: str) -> str:
        return os.path.join(self.home, "cache", name)

    def top_file(self, name: str) -> str:
        """A file at the top of the spool: next_id, ids.lock, intake.lock, adopt.lock, import.lock, lease-id,
        kept-runs."""
        return os.path.join(self.home, name)

    def internal_dir(self, name: str) -> str:
        assert name in INTERNAL, name
        return os.path.join(self.home, name)

    def tmp_dir(self) -> str:
        return os.path.join(self.home, "tmp")


# The original single-file gpuq kept its queue in the spool home under one of these names; every
# command looks for one (two stats), and engine/original/ reads and imports it only when found.
LEGACY_DB_NAME = "gpuq.db"
LEGACY_JSON_NAME = "queue.json"


def find_legacy(home: Union[str, os.PathLike[str]]) -> Optional[os.PathLike[str]]:
    """The file an import would take from `home` (a pathlib.Path): `gpuq.db` first, then
    `queue.json`; never the `.bak` files an import leaves behind."""
    for name in (LEGACY_DB_NAME, LEGACY_JSON_NAME):
        path = os.path.join(home, name)
        if os.path.isfile(path):
            from pathlib import Path  # the original gpuq's queue found: its import starts here

            return Path(path)
    return None
