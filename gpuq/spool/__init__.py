"""The spool directory: the only module that knows gpuq's paths and changes files under them.

spool_layout.md is the contract this module implements. In short:
- a job is one JSON file; the state directory it sits in is its state;
- new files are written complete and fsynced in tmp/, then renamed into place without clobbering;
- a state change writes the new version (rev + 1) into the target directory, then unlinks the old
  one, so a crash in between leaves two copies and the higher rev wins (see recovery.py);
- whoever changes a job's file holds the job's claim lock (locks/NNNNNN.lock), an O_EXCL file that
  is flock()ed by its owner for as long as the claim lives, so a dead owner is seen by the kernel.
"""

from __future__ import annotations

from gpuq.spool.base import (
    FINISHED,
    INTAKE_RE,
    INTERNAL,
    JOB_NAME_RE,
    MAX_JOB_BYTES,
    PLAIN_NAME_RE,
    REJECTED,
    STALE_TMP_SECONDS,
    STATES,
    Claim,
    JobRef,
    SpoolBase,
    SpoolError,
    SpoolFull,
    boot_id,
    default_home,
)
from gpuq.spool.claims import ClaimsMixin
from gpuq.spool.outputs import OutputsMixin
from gpuq.spool.workers import WorkerBusy, WorkerLease, WorkersMixin

__all__ = [
    "FINISHED",
    "INTAKE_RE",
    "INTERNAL",
    "JOB_NAME_RE",
    "MAX_JOB_BYTES",
    "PLAIN_NAME_RE",
    "REJECTED",
    "STALE_TMP_SECONDS",
    "STATES",
    "Claim",
    "JobRef",
    "Spool",
    "SpoolError",
    "SpoolFull",
    "WorkerBusy",
    "WorkerLease",
    "boot_id",
    "default_home",
]


class Spool(ClaimsMixin, OutputsMixin, WorkersMixin, SpoolBase):
    """The spool at `home` (default: $GPUQ_HOME or ~/.gpuq). Its parts, one file each:
    base.py (layout, reading, writes and moves, ids, dropped files), claims.py (claim locks and
    control requests), outputs.py (what jobs wrote, progress samples, caches), workers.py (the
    worker registry)."""
