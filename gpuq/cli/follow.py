"""`gpuq log -f`: print a log as it grows until its job stops running."""

from __future__ import annotations

import sys
import time
from typing import Any

from gpuq.core.states import ACTIVE
from gpuq.spool import Spool

POLL_SECONDS = 0.2  # a log has no event to wait on that works everywhere


def follow(spool: Spool, job: dict[str, Any]) -> None:
    offset = spool.logs.size(job)
    while True:
        running = spool.jobs.find(job["id"], ACTIVE) is not None
        chunk = spool.logs.read_from(job, offset)
        if chunk:
            offset += len(chunk)
            sys.stdout.write(chunk.decode("utf-8", "replace"))
            sys.stdout.flush()
        elif not running:
            return
        else:
            time.sleep(POLL_SECONDS)
