"""gpuq's errors: one base class that carries the exit code the CLI exits with; every message is one
line meant for the user."""

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


class Damaged(Refused):
    """The job's file is no valid job (cut short by a crash, edited by hand): it never runs."""
