"""Where everything lives in the spool: the one place that builds a path under $GPUQ_HOME.

Every other part of gpuq.spool asks a Layout for its paths; nothing outside gpuq.spool builds one.
spool_layout.md (section 1, "The tree") is the contract this module implements.

Paths are plain strings (os.path), not pathlib.Path: importing pathlib (with urllib.parse and
ipaddress) cost `gpuq status` and `gpuq add` more than the rest of the spool (bench/PROFILE.md).
"""

from __future__ import annotations

import os
from itertools import repeat
from operator import getitem

from gpuq.core.lazyre import lazy
from gpuq.core.states import REJECTED, STATES
from gpuq.spool.errors import SpoolError
from gpuq.system import security

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Optional

# gpuq's own directories beside the states (see spool_layout.md for what each holds).
INTERNAL = ("tmp", "locks", "logs", "workers", "control", "progress", "cache", "imports", "snapshots")
PLAIN_NAME_RE = lazy(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.json$")  # a dropped file gpuq takes in
INTAKE_RE = lazy(r"^\.intake-(\d{6,})-(.+)$")  # a dropped file being taken in, with its new id
JOB_NAME_RE = lazy(r"^(\d{6,})-[A-Za-z0-9._-]*\.json$")  # what is_job_name tests, for listings of thousands
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_NAME_BYTES = "".join(sorted(_NAME_CHARS)).encode()


def is_job_name(name: str) -> bool:
    """A published job file's name: `^(\\d{6,})-[A-Za-z0-9._-]*\\.json$` (the id ends at the first
    "-"). Tested with str methods rather than a pattern: `gpuq status` and `gpuq add` list names
    at every start, and importing `re` alone costs them about 8 ms (bench/PROFILE.md)."""
    dash = name.find("-")
    if dash < 6 or not name[:dash].isdecimal():  # isdecimal: the Unicode digits \d matches
        return False
    if name.endswith(".json\n"):  # `$` also matches before a final newline
        name = name[:-1]
    return name.endswith(".json") and _NAME_CHARS.issuperset(name[dash + 1 : -5])


def job_names(entries: list[str]) -> list[str]:
    """The entries that are job names (is_job_name), in listing order. A listing of finished jobs
    holds thousands of names, nearly always all valid: that case is decided by C loops over the
    whole list (one `bytes.translate` of the joined names for the charset, then `map` of str methods), about 0.2 us a
    name against 1 us for is_job_name called per name; any other listing is tested name by name,
    so the answer is is_job_name's either way."""
    if not _all_job_names(entries):
        return list(filter(is_job_name, entries))
    return entries


def _all_job_names(entries: list[str]) -> bool:
    if not entries:
        return True
    # Every character a name may hold (a digit of the id, or the rest's charset), every name ending
    # in ".json", and every id six digits or more: the three parts of is_job_name, for all at once.
    joined = "".join(entries)
    if not joined.isascii() or joined.encode().translate(None, _NAME_BYTES):  # a byte outside the charset
        return False
    if not all(map(str.endswith, entries, repeat(".json"))):
        return False
    dashes = list(map(str.find, entries, repeat("-")))
    return min(dashes) >= 6 and all(map(str.isdecimal, map(getitem, entries, map(slice, dashes))))


def default_home() -> str:
    return os.path.abspath(os.environ.get("GPUQ_HOME") or os.path.join(os.path.expanduser("~"), ".gpuq"))


class Layout:
    """The paths of one spool. Building a path touches nothing; `ensure()` creates the tree."""

    def __init__(self, home: Optional[str | os.PathLike[str]] = None):
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

    # ---- jobs and their states ----------------------------------------------------------------
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

    # ---- gpuq's own files ---------------------------------------------------------------------
    def worker_log_path(self) -> str:
        return os.path.join(self.home, "logs", "worker.log")

    def worker_info_path(self, pid: int) -> str:
        return os.path.join(self.home, "workers", f"worker-{pid}.json")

    def worker_gpus_path(self, pid: int) -> str:
        """What worker PID last saw of the GPUs (written by it, read by `gpuq status`)."""
        return os.path.join(self.home, "workers", f"gpus-{pid}.json")

    def worker_lock_path(self, name: str) -> str:
        """workers/machine.lock or workers/gpu-N.lock."""
        return os.path.join(self.home, "workers", f"{name}.lock")

    def import_path(self, fingerprint: str) -> str:
        """The record of one queue imported from the original gpuq (named by its fingerprint)."""
        return os.path.join(self.home, "imports", f"{fingerprint}.json")

    def snapshot_path(self, first_id: int) -> str:
        """The copy of a repository that the jobs of one `add --snapshot` run (named by its first id)."""
        return os.path.join(self.home, "snapshots", f"{first_id:06d}")

    def cache_path(self, name: str) -> str:
        return os.path.join(self.home, "cache", name)

    def top_file(self, name: str) -> str:
        """A file at the top of the spool: next_id, ids.lock, intake.lock, adopt.lock, kept-runs."""
        return os.path.join(self.home, name)

    def internal_dir(self, name: str) -> str:
        """One of INTERNAL: tmp, locks, logs, workers, control, progress, cache, imports, snapshots."""
        assert name in INTERNAL, name
        return os.path.join(self.home, name)

    def tmp_dir(self) -> str:
        return os.path.join(self.home, "tmp")


# The original single-file gpuq kept its queue in the spool home under one of these names; every
# command looks for one (two stats), and engine/original/ reads and imports it only when found.
LEGACY_DB_NAME = "gpuq.db"
LEGACY_JSON_NAME = "queue.json"


def find_legacy(home: str | os.PathLike[str]) -> Optional[Path]:
    """The file an import would take from `home`: `gpuq.db` first, then `queue.json`.

    `.bak` files are never returned: they are what an import (the original's own migration
    included) leaves behind.
    """
    for name in (LEGACY_DB_NAME, LEGACY_JSON_NAME):
        path = os.path.join(home, name)
        if os.path.isfile(path):
            from pathlib import Path  # only then: `gpuq status` finds none and does not import pathlib

            return Path(path)
    return None
