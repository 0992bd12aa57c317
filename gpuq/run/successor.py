"""Handing a slot on: the line on which the worker names, ahead of time, the jobs a supervisor may
start when its own job ends (spool_layout.md, section 6, "Handing the slot on").

One JSON object per line: the slot's start order with `"next": [[id, rev, file], ...]` added. A send
that cannot go whole closes the worker's side, and a supervisor that reads the end of the line starts
nothing: nobody stands behind an earlier word.
"""

from __future__ import annotations

import json
import os
import socket
from contextlib import suppress
from dataclasses import asdict
from typing import Optional

from gpuq.run.supervisor.order import StartOrder, is_int

MAX_LINE_BYTES = 65536


def offer(slot: StartOrder, following: list[tuple[int, int, str]]) -> bytes:
    """The line naming `following` ((id, rev, pending/ file name) each) after the job of order `slot`."""
    return json.dumps({**asdict(slot), "next": [list(job) for job in following]}).encode() + b"\n"


def send(sock: Optional[socket.socket], line: bytes) -> bool:
    """Send `line` without waiting; False if it could not go whole (our side is then closed, so that
    an earlier word is never taken for the last)."""
    if sock is None:
        return False
    with suppress(OSError):
        if sock.send(line, socket.MSG_DONTWAIT) == len(line):
            return True
    with suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    return False


class Heard:
    def __init__(self, fd: int, received: bytes = b""):
        self.fd = fd
        self.gone = False
        self.named: list[StartOrder] = []  # the orders of the jobs last named for this slot
        self._partial = received  # what came with the hand-over, and then any line not whole yet

    def next_jobs(self) -> list[StartOrder]:
        """The orders of the jobs the worker last named for this slot; none once it has gone or
        closed the line."""
        self.listen()
        return [] if self.gone else self.named

    def listen(self) -> bool:
        data, self._partial = self._partial, b""
        while not self.gone:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            self.gone = not chunk
            data += chunk
        *lines, self._partial = data.split(b"\n")  # what follows the last newline is not a whole line
        for line in lines:
            named = _parse(line)
            if named is not None:
                self.named = named
        return not self.gone


def _parse(line: bytes) -> Optional[list[StartOrder]]:
    try:
        word = json.loads(line) if len(line) <= MAX_LINE_BYTES else None
        if not isinstance(word, dict) or not isinstance(word.get("next"), list):
            return None
        slot = StartOrder.from_fields(word)
    except ValueError:
        return None
    named = word["next"]
    ok = all(isinstance(j, list) and len(j) == 3 and all(map(is_int, j[:2])) and isinstance(j[2], str) for j in named)
    return [slot.for_job(*job) for job in named] if ok else None
