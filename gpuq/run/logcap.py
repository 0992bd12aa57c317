"""A job's log with a size cap (`--max-log-size`): its head and newest tail kept and the middle cut out,
so that what `gpuq log`, the ETA and the progress readers look at (the end) is always there.
"""

from __future__ import annotations

import os
import threading

MARKER = "\n=== gpuq: log cut here (--max-log-size): {dropped:>15} bytes left out ===\n"
MIN_CAP = 64 * 1024
COPY_CHUNK = 1 << 20


class CappedLog:
    """Writes to the log at `path` (whose current content counts too), never past `cap` bytes."""

    def __init__(self, append_fd: int, path: str, cap: int):
        self.append_fd = append_fd  # the supervisor's O_APPEND descriptor of the log
        self.edit_fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)  # for cutting: no O_APPEND
        self.cap = max(cap, MIN_CAP)
        self.head = self.cap // 4
        self.keep = self.cap // 4
        self.dropped = 0

    def write(self, data: bytes) -> None:
        while data:
            size = os.fstat(self.edit_fd).st_size
            room = self.cap - size
            if room <= 0:
                self._cut()
                continue
            part, data = data[:room], data[room:]
            os.write(self.append_fd, part)

    def _cut(self) -> None:
        """Keep the head, a marker, and the newest `keep` bytes copied down behind it."""
        size = os.fstat(self.edit_fd).st_size
        marker = MARKER.format(dropped=0).encode()
        start = self.head + len(marker)  # where the kept tail begins after the cut
        tail_from = size - self.keep
        self.dropped += tail_from - (start if self.dropped else self.head)
        os.pwrite(self.edit_fd, MARKER.format(dropped=self.dropped).encode(), self.head)
        offset, dest = tail_from, start
        while offset < size:  # forwards: the destination is always below the source
            chunk = os.pread(self.edit_fd, min(COPY_CHUNK, size - offset), offset)
            os.pwrite(self.edit_fd, chunk, dest)
            offset += len(chunk)
            dest += len(chunk)
        os.ftruncate(self.edit_fd, dest)

    def close(self) -> None:
        os.close(self.edit_fd)


def pump(read_fd: int, log: CappedLog) -> threading.Thread:
    """Copy the pipe into the capped log, in a thread, until every process holding it is gone."""

    def run() -> None:
        try:
            while True:
                data = os.read(read_fd, 65536)
                if not data:
                    return
                try:
                    log.write(data)
                except OSError:
                    continue  # a full disk: this output is lost, the job goes on
        finally:
            os.close(read_fd)

    thread = threading.Thread(target=run, name="gpuq-log", daemon=True)
    thread.start()
    return thread
