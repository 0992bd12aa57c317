"""Handing a slot on: the worker names, ahead of time, the jobs a supervisor may start when its own
job ends (spool_layout.md, section 6, "Handing the slot on"), so that no round trip through the
worker (the end's file event, its step, the claim, a spare woken) lies between two jobs.

The worker still decides: whenever its answer changes, it tells the supervisor of each job of its
own the jobs it would start in that slot, in order, were that job to end now
(engine/schedule/planner.py, `Planner.successors`), or that there are none. The supervisor acts
on the worker's last word only when its job has ended by itself, and then as the worker would: it
takes a job's claim, and starts it only if its file is still the version named (`rev`). A job
gone from pending/ is passed over; a claim someone else holds or a changed file ends the chain.

The line is the socket over which the worker handed the first job to its supervisor
(run/launcher.py): one JSON object per line, the slot's start order (run/supervisor/order.py) with
`"next": [[id, rev, file], ...]` added. A send that cannot go whole closes the worker's side, and
a supervisor that reads the end of the line starts nothing: nobody stands behind an earlier word.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Optional

from gpuq.run.supervisor.order import StartOrder

MAX_LINE_BYTES = 65536


def offer(slot: StartOrder, following: list[tuple[int, int, str]]) -> bytes:
    """The line naming `following` ((id, rev, pending/ file name) each, in order) as the jobs to
    start in this slot; `slot`: the order of the job running there (its slot, GPUs, settings)."""
    return json.dumps({**slot.to_fields(), "next": [list(job) for job in following]}).encode() + b"\n"


def send(sock: Optional[socket.socket], line: bytes) -> bool:
    """Send `line` without waiting; False if it could not go whole (the line is then closed on our
    side, so that an earlier word is never taken for the last)."""
    if sock is None:
        return False
    try:
        if sock.send(line, socket.MSG_DONTWAIT) == len(line):
            return True
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    return False


class Heard:
    """The supervisor's side: the worker's last word, read from the line when a job has ended."""

    def __init__(self, fd: int, received: bytes = b""):
        self.fd = fd
        self.word: Optional[tuple[StartOrder, list[Any]]] = None  # the slot's order, the jobs named
        self.gone = False
        self._partial = received  # what came with the hand-over, and then any line not whole yet

    def next_jobs(self) -> list[StartOrder]:
        """The orders for the jobs the worker last named for this slot; none once the worker has
        gone or closed the line."""
        self._read()
        if self.gone or self.word is None:
            return []
        slot, named = self.word
        return [slot.for_job(*job) for job in named]

    def named(self) -> bool:
        """Whether the last whole line heard names a job (without reading the line again)."""
        return not self.gone and self.word is not None and bool(self.word[1])

    def listen(self) -> bool:
        """Read what the worker has said so far (while the job still runs: nothing is acted on
        before it ends); whether the line is still open, and so worth listening to."""
        self._read()
        return not self.gone

    def _read(self) -> None:
        data, self._partial = self._partial, b""
        while not self.gone:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.gone = True
            data += chunk
        *lines, self._partial = data.split(b"\n")  # what follows the last newline is not a whole line
        for line in lines:
            word = _parse(line)
            if word is not None:
                self.word = word


def _parse(line: bytes) -> Optional[tuple[StartOrder, list[Any]]]:
    try:
        word = json.loads(line) if len(line) <= MAX_LINE_BYTES else None
        if not isinstance(word, dict) or not isinstance(word.get("next"), list):
            return None
        slot = StartOrder.from_fields(word)
    except ValueError:
        return None
    ok = all(
        isinstance(job, list) and len(job) == 3 and all(isinstance(v, int) for v in job[:2]) and isinstance(job[2], str)
        for job in word["next"]
    )
    return (slot, word["next"]) if ok else None
