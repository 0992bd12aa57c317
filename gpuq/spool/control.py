"""Control requests: a note in control/NNNNNN.json telling a running job's supervisor why its job
is about to be signalled (kill, preempt), so that it records the right end."""

from __future__ import annotations

import json
import os
import time
from typing import Optional

from gpuq.spool.files import Files, read_small, unlink_quietly
from gpuq.spool.layout import Layout


class ControlRequests:
    def __init__(self, layout: Layout, files: Files):
        self.layout, self.files = layout, files

    def request(self, job_id: int, action: str) -> None:
        data = json.dumps({"action": action, "at": time.time()}).encode()
        self.files.with_room(lambda: self.files.replace(self.layout.control_path(job_id), data, "ctl"))

    def peek(self, job_id: int) -> Optional[str]:
        """The pending request for a job, left in place."""
        data = read_small(self.layout.control_path(job_id), 65536)
        try:
            action = json.loads(data).get("action") if data else None
        except (ValueError, AttributeError):
            return None
        return action if isinstance(action, str) else None

    def take(self, job_id: int) -> Optional[str]:
        """The pending request for a job, consumed."""
        action = self.peek(job_id)
        unlink_quietly(self.layout.control_path(job_id))
        return action

    def ids(self) -> list[int]:
        names = os.listdir(self.layout.internal_dir("control"))
        return [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()]
