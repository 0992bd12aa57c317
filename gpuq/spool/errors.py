"""Errors of the spool itself: a tree gpuq must not trust, and a disk with no room."""

from __future__ import annotations

from gpuq.core.errors import GpuqError
from gpuq.system.security import FULL_ERRNOS


class SpoolError(GpuqError):
    """Something in the spool prevents the operation; the message is meant for the user."""


class SpoolFull(SpoolError, OSError):
    """A write failed for lack of space (disk, quota, file-size limit); the partial file is gone.
    Also an OSError, so code that handles write errors keeps handling this one."""

    def __init__(self, home: str, exc: OSError):
        self.message = f"cannot write to the spool {home}: {exc.strerror}; free some space and try again"
        super().__init__(exc.errno, exc.strerror)

    def __str__(self) -> str:
        return self.message


def full_or(home: str, exc: OSError) -> OSError:
    """SpoolFull for a write that failed for lack of space (disk, quota, file size), else `exc`."""
    return SpoolFull(home, exc) if exc.errno in FULL_ERRNOS else exc
