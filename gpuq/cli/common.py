"""What every command shares: the spool it works on."""

from __future__ import annotations

import sys

from gpuq.core.errors import GpuqError
from gpuq.spool import Spool


def spool() -> Spool:
    """The user's spool ($GPUQ_HOME or ~/.gpuq), created on first use and checked. The first
    time, a queue of the original gpuq found there is imported (as the original imported its
    queue.json), and what happened is said on stderr, where it never mixes with JSON output."""
    sp = Spool().ensure()
    from gpuq.engine.legacy_probe import find_legacy  # two stats; engine.legacy only when there is one

    if find_legacy(sp.home) is not None:
        from gpuq.engine.importer import import_on_first_use

        try:
            report = import_on_first_use(sp)
        except GpuqError as exc:
            print(f"gpuq: the original gpuq's queue was not imported: {exc}", file=sys.stderr)
        else:
            for line in report.lines() if report else []:
                print(f"gpuq: {line}", file=sys.stderr)
    return sp
