"""gpuq's errors: one base class that carries the exit code the CLI turns it into.

The message of every error is one line meant for the user. The CLI prints `gpuq: MESSAGE` (a
usage error prints its own prefix) and exits with `exit_code`: 2 for a bad command line, 1 for a
request that cannot be carried out.
"""

from __future__ import annotations

from typing import Optional


class GpuqError(Exception):
    """Base of every error gpuq reports to a person."""

    exit_code = 1
    prefix: Optional[str] = None  # who speaks, e.g. "gpuq add"; the CLI fills it in when None


class UsageError(GpuqError):
    """A bad command line: the arguments themselves are wrong (exit 2)."""

    exit_code = 2


class Refused(GpuqError):
    """A well-formed request that cannot be carried out now (no such job, wrong state; exit 1)."""

    exit_code = 1
