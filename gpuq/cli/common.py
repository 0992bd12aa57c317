"""What every command shares: the spool it works on."""

from __future__ import annotations

from gpuq.spool import Spool


def spool() -> Spool:
    """The user's spool ($GPUQ_HOME or ~/.gpuq), created on first use and checked."""
    return Spool().ensure()
