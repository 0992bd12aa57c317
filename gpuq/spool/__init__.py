"""The spool directory: the only package that builds paths under $GPUQ_HOME or opens files there.

spool_layout.md is the contract it implements. In short:
- a job is one JSON file; the state directory it sits in is its state (store.py);
- new files are written complete in tmp/, then renamed into place (files.py);
- a state change writes the new version (rev + 1) into the target directory, then unlinks the old
  one, so a crash in between leaves two copies and the higher rev wins (engine/lifecycle/repairs.py);
- whoever changes a job's file holds the job's claim lock (claims.py).

A Spool is composed of small parts, one module each, that share only the Layout (paths) and Files
(atomic writes) below them: `spool.jobs` (job files), `spool.ids`, `spool.claims`,
`spool.control` (requests to supervisors), `spool.workers` (registry), `spool.logs`,
`spool.reports` (progress files and samples), `spool.cache`, `spool.dropbox` (hand-dropped files),
`spool.imports` (queues imported from the original gpuq), `spool.snapshots` (copies of code),
`spool.kept` (what `gpuq clear` keeps of the jobs it removes).
"""

from __future__ import annotations

from gpuq.spool.errors import SpoolError, SpoolFull
from gpuq.spool.files import Caches, Files
from gpuq.spool.files import disk_space as _disk_space
from gpuq.spool.layout import Layout, default_home
from gpuq.spool.store import MAX_JOB_BYTES, JobRef, JobStore
from gpuq.system.fsutil import network_filesystem as _network_filesystem

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from pathlib import Path
    from typing import Any, Optional

    from gpuq.spool.claims import Claim, Claims
    from gpuq.spool.control import ControlRequests
    from gpuq.spool.dropbox import Dropbox
    from gpuq.spool.ids import IdCounter
    from gpuq.spool.imports import ImportRecords
    from gpuq.spool.kept import KeptRuns
    from gpuq.spool.logs import Logs
    from gpuq.spool.reports import Reports
    from gpuq.spool.snapshots import Snapshots
    from gpuq.spool.workers import WorkerBusy, WorkerLease, WorkerRegistry

__all__ = [
    "MAX_JOB_BYTES",
    "Claim",
    "JobRef",
    "Spool",
    "SpoolError",
    "SpoolFull",
    "WorkerBusy",
    "WorkerLease",
    "default_home",
]

_LAZY = {"Claim": "claims", "WorkerBusy": "workers", "WorkerLease": "workers"}


def __getattr__(name: str) -> Any:
    """`from gpuq.spool import Claim` (and WorkerBusy, WorkerLease): their modules are imported
    by whoever asks, not by every command that opens the spool."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"gpuq.spool.{_LAZY[name]}"), name)


class _part:
    """functools.cached_property without importing functools (which imports collections, a few
    ms of every `gpuq status` and `gpuq add`: bench/PROFILE.md section 1): built on first use,
    then an attribute of the instance."""

    def __init__(self, build: Any) -> None:
        self.build = build
        self.__doc__ = build.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, spool: Any, owner: Optional[type] = None) -> Any:
        if spool is None:
            return self
        value = spool.__dict__[self.name] = self.build(spool)
        return value


class Spool:
    """The spool at `home` (default: $GPUQ_HOME or ~/.gpuq). Each part is built (and its module
    imported) the first time it is used: `gpuq status` needs about half of them, `gpuq add` fewer,
    and every module imported is start-up time (bench/PROFILE.md, section 1)."""

    def __init__(self, home: Optional[Path] = None):
        self.layout = Layout(home)
        self.home = self.layout.home

    @_part
    def files(self) -> Files:
        return Files(self.layout)

    @_part
    def jobs(self) -> JobStore:
        return JobStore(self.layout, self.files)

    @_part
    def ids(self) -> IdCounter:
        from gpuq.spool.ids import IdCounter

        return IdCounter(self.layout, self.files, self.jobs)

    @_part
    def claims(self) -> Claims:
        from gpuq.spool.claims import Claims

        return Claims(self.layout, self.files)

    @_part
    def control(self) -> ControlRequests:
        from gpuq.spool.control import ControlRequests

        return ControlRequests(self.layout, self.files)

    @_part
    def workers(self) -> WorkerRegistry:
        from gpuq.spool.workers import WorkerRegistry

        return WorkerRegistry(self.layout, self.files)

    @_part
    def logs(self) -> Logs:
        from gpuq.spool.logs import Logs

        return Logs(self.layout)

    @_part
    def reports(self) -> Reports:
        from gpuq.spool.reports import Reports

        return Reports(self.layout, self.files)

    @_part
    def cache(self) -> Caches:
        return Caches(self.layout, self.files)

    @_part
    def dropbox(self) -> Dropbox:
        from gpuq.spool.dropbox import Dropbox

        return Dropbox(self.layout, self.files)

    @_part
    def imports(self) -> ImportRecords:
        from gpuq.spool.imports import ImportRecords

        return ImportRecords(self.layout, self.files)

    @_part
    def snapshots(self) -> Snapshots:
        from gpuq.spool.snapshots import Snapshots

        return Snapshots(self.layout, self.files)

    @_part
    def kept(self) -> KeptRuns:
        from gpuq.spool.kept import KeptRuns

        return KeptRuns(self.layout)

    def ensure(self) -> Spool:
        """Create the tree on first use and refuse one that others could write into. A new tree
        gets its emergency room at once (spool_layout.md section 14): a spool that only ever sees
        `add` and `cancel`, no worker, has one too."""
        if self.layout.ensure():
            self.files.keep_emergency_room()
        return self

    def adopt_lock(self) -> AbstractContextManager[None]:
        """Held by `gpuq adopt` from "is this process tracked yet?" to publishing it, so two
        adopters of one process cannot both create a job."""
        from gpuq.spool import mutex  # contextlib (with functools, collections): not for status or add

        return mutex.held(self.layout, "adopt")

    def network_filesystem(self) -> Optional[str]:
        """The network filesystem the spool is on (`nfs4`, `lustre`...), or None (local, or unknown)."""
        return _network_filesystem(self.home)

    def disk_space(self) -> tuple[int, int]:
        """(total, free) bytes of the filesystem the spool lives on."""
        return _disk_space(self.home)

    def delete_outputs(self, job_id: int) -> int:
        """A job's log, progress file, samples and GPU record (`gpuq clear`); the bytes that frees."""
        return self.logs.delete(job_id) + self.reports.delete(job_id)

    def delete_log(self, job_id: int) -> int:
        """A job's log and the progress file it wrote (`gpuq clear --logs`), not what gpuq learned from
        them (its samples, its GPU record: the ETA's tail, history's GPU figures); the bytes that frees."""
        return self.logs.delete(job_id) + self.reports.delete_progress(job_id)
