"""`gpuq log -f`: print a log as it grows until its job stops running."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from gpuq.spool import Spool

POLL_SECONDS = 0.2


def follow(spool: Spool, job_id: int, path: Path) -> None:
    try:
        offset = os.path.getsize(path)
    except FileNotFoundError:
        offset = 0
    while True:
        running = spool.find(job_id, ("pending", "running")) is not None
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            offset += len(chunk)
            sys.stdout.write(chunk.decode("utf-8", "replace"))
            sys.stdout.flush()
        elif not running:
            return
        else:
            time.sleep(POLL_SECONDS)  # a log has no event to wait on that works everywhere
