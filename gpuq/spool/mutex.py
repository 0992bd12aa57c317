"""Spool-wide locks held for a moment: intake.lock (one worker takes in dropped files at a time),
adopt.lock (one `gpuq adopt` at a time), import.lock (one import of the original gpuq's queue at a
time) and lease-id.lock (one maker of the spool's lease id). The kernel drops them if their holder dies."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from typing import Iterator

from gpuq.spool.layout import Layout
from gpuq.system import fsutil

NAMES = ("intake", "adopt", "import", "lease-id")


def _open(layout: Layout, name: str) -> int:
    assert name in NAMES, name
    return os.open(layout.top_file(f"{name}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)


@contextmanager
def held(layout: Layout, name: str) -> Iterator[None]:
    """Wait for the lock, hold it for the block."""
    fd = _open(layout, name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextmanager
def turn(layout: Layout, name: str) -> Iterator[bool]:
    """True for the one process holding the lock now; others get False at once and skip."""
    fd = _open(layout, name)
    try:
        yield fsutil.try_flock(fd)
    finally:
        os.close(fd)
