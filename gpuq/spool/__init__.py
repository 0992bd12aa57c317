"""The spool directory: the only package that builds paths under $GPUQ_HOME or opens files there
(spool_layout.md is its contract). A Spool is small parts, one module each, sharing only the
Layout (paths) and Files (atomic writes).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Optional, Union

from gpuq.spool.cache.index import FinishedIndex
from gpuq.spool.claims import Claim, Claims
from gpuq.spool.control import ControlRequests
from gpuq.spool.dropbox import Dropbox
from gpuq.spool.errors import SpoolError, SpoolFull
from gpuq.spool.files import Files, disk_space
from gpuq.spool.ids import IdCounter
from gpuq.spool.imports import ImportRecords
from gpuq.spool.kept import KeptRuns
from gpuq.spool.layout import Layout, default_home
from gpuq.spool.leaseid import LeaseId
from gpuq.spool.logs import Logs
from gpuq.spool.mutex import held
from gpuq.spool.reports import Reports
from gpuq.spool.snapshots import Snapshots
from gpuq.spool.store import MAX_JOB_BYTES, JobRef, JobStore
from gpuq.spool.webtoken import WebToken
from gpuq.spool.workers import WorkerBusy, WorkerLease, WorkerRegistry
from gpuq.system.fsutil import network_filesystem

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


class Spool:
    """The spool at `home` (default: $GPUQ_HOME or ~/.gpuq)."""

    def __init__(self, home: Optional[Union[str, os.PathLike[str]]] = None):
        layout = self.layout = Layout(home)
        self.home = layout.home
        files = self.files = Files(layout)  # the parts only keep their arguments: building them is free
        self.jobs = JobStore(layout, files)
        self.ids = IdCounter(layout, files, self.jobs)
        self.claims = Claims(layout, files)
        self.control = ControlRequests(layout, files)
        self.workers = WorkerRegistry(layout, files)
        self.logs = Logs(layout)
        self.reports = Reports(layout, files)
        self.kept = KeptRuns(layout)
        self.finished = FinishedIndex(layout, files, self.jobs, self.kept, self.ids)
        self.dropbox = Dropbox(layout, files)
        self.imports = ImportRecords(layout, files)
        self.snapshots = Snapshots(layout, files)
        self.web_token = WebToken(layout, files)
        self.lease_id = LeaseId(layout, files)  # how its jobs' GPU leases name it

    def ensure(self) -> Spool:
        """Create the tree on first use and refuse one that others could write into. A new tree
        gets its emergency room at once (spool_layout.md section 14), worker or not."""
        if self.layout.ensure():
            self.files.keep_emergency_room()
        return self

    def adopt_lock(self) -> AbstractContextManager[None]:
        """Held by `gpuq adopt` from "is this process tracked yet?" to publishing it, so two
        adopters of one process cannot both create a job."""
        return held(self.layout, "adopt")

    def import_lock(self) -> AbstractContextManager[None]:
        """Held while the original gpuq's queue is imported: two commands run at once on first use (or
        an assistant's tool calls) published its jobs side by side, each reporting the other's as not
        imported, and the record kept the wrong report."""
        return held(self.layout, "import")

    def network_filesystem(self) -> Optional[str]:
        """The network filesystem the spool is on (`nfs4`, `lustre`...), or None (local, or unknown)."""
        return network_filesystem(self.home)

    def disk_space(self) -> tuple[int, int]:
        return disk_space(self.home)

    def delete_outputs(self, job_id: int) -> int:
        """A job's log, progress file, samples and GPU record (`gpuq clear`); the bytes that frees."""
        return self.logs.delete(job_id) + self.reports.delete(job_id)

    def delete_log(self, job_id: int) -> int:
        """A job's log and the progress file it wrote (`gpuq clear --logs`), not what gpuq learned from
        them (its samples, its GPU record: the ETA's tail, history's GPU figures); the bytes that frees."""
        return self.logs.delete(job_id) + self.reports.delete_progress(job_id)

    def has_log(self, job_id: int) -> bool:
        """Whether `delete_log` has a file to remove (an adopted job's own log is not the spool's)."""
        return any(map(os.path.lexists, (self.layout.log_path(job_id), self.layout.progress_path(job_id))))
