"""Control requests: a note in control/NNNNNN.json telling a running job's supervisor why its job
is about to be signalled (kill, cancel, preempt), so that it records the right end; its own at the
job's time limit (`time-limit`) only tells `status` and `show` why it is stopping.

A cancel is written as a kill said to be by `gpuq cancel` (`{"action": "kill", "by": "cancel"}`):
a supervisor of an older gpuq, still running its job, records it cancelled as it always did, where
an action it does not know would have left the job failed (and retried, with --retries)."""

from __future__ import annotations

import json
import os
import time
from typing import Optional

from gpuq.core.states import CANCEL, KILL
from gpuq.spool.files import Files, read_object, unlink_quietly
from gpuq.spool.layout import Layout


class ControlRequests:
    def __init__(self, layout: Layout, files: Files):
        self.layout, self.files = layout, files

    def request(self, job_id: int, action: str) -> None:
        self.files.with_room(lambda: self.files.replace(self.layout.control_path(job_id), _note(action), "ctl"))

    def request_unless_asked(self, job_id: int, action: str, since: Optional[float]) -> bool:
        """A supervisor's own request at its job's time limit: written only where none made for this
        run (since `since`) is pending, never over one (a kill must stay a kill); whether it was."""
        path = self.layout.control_path(job_id)
        for _attempt in range(2):
            try:
                self.files.with_room(lambda: self.files.place_new(path, _note(action), "ctl"))
                return True
            except FileExistsError:
                if self.peek(job_id, since) is not None:
                    return False
                unlink_quietly(path)  # one left for an earlier run of the job: ours takes its place
        return False

    def peek(self, job_id: int, since: Optional[float] = None) -> Optional[str]:
        """The pending request for a job, left in place; with `since`, only one made from then on."""
        asked = self.asked(job_id, since)
        return asked[0] if asked else None

    def asked(self, job_id: int, since: Optional[float] = None) -> Optional[tuple[str, Optional[float]]]:
        """As `peek`, with when it was asked (None: the note does not say)."""
        found = read_object(self.layout.control_path(job_id)) or {}
        action, at = found.get("action"), found.get("at")
        at = float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None
        if since is not None and at is not None and at < since:
            return None  # meant for an earlier run of the job, which had ended already
        if not isinstance(action, str):
            return None
        return (CANCEL if action == KILL and found.get("by") == CANCEL else action), at

    def take(self, job_id: int, since: Optional[float] = None) -> Optional[str]:
        """The pending request for a job (made since `since`, when given), consumed."""
        action = self.peek(job_id, since)
        unlink_quietly(self.layout.control_path(job_id))
        return action

    def ids(self) -> list[int]:
        names = os.listdir(self.layout.internal_dir("control"))
        return [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()]


def _note(action: str) -> bytes:
    said = {"action": KILL, "by": CANCEL} if action == CANCEL else {"action": action}
    return json.dumps({**said, "at": time.time()}).encode()
