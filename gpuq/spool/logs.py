"""Job logs (logs/NNNNNN.log) and the worker's log: opened for writing without following links,
and their tails read. An adopted or imported job's log is the file its `log` field names,
read but never written by gpuq.
"""

from __future__ import annotations

import os
from typing import Optional

from gpuq.core.job import Job
from gpuq.core.states import SOURCE_IMPORTED
from gpuq.spool.files import open_regular, remove_counting
from gpuq.spool.layout import Layout

TAIL_LINES_MAX_BYTES = 4 << 20  # a log with no line breaks must not make `gpuq log` read all of it


class Logs:
    def __init__(self, layout: Layout):
        self.layout = layout

    def path_of(self, job: Job) -> str:
        own = job.adopted or job.source.startswith(SOURCE_IMPORTED)
        if own and job.log:
            return job.log
        return self.layout.log_path(job.id)

    def open_job_log(self, job_id: int) -> int:
        """A descriptor appending to the job's log (created 0600), for the supervisor and the job."""
        return _open_append(self.layout.log_path(job_id))

    def open_worker_log(self) -> int:
        return _open_append(self.layout.worker_log_path())

    def worker_log_path(self) -> str:
        return self.layout.worker_log_path()

    def tail(self, job: Job, limit: int = 65536) -> tuple[bytes, float]:
        return _tail(self.path_of(job), limit)

    def tail_lines(self, job: Job, count: int) -> list[str]:
        """The last `count` lines of the job's log; tqdm's carriage returns count as line breaks."""
        if count <= 0:
            return []
        path, limit = self.path_of(job), 65536
        while True:
            data, _mtime = _tail(path, limit)
            if data.count(b"\n") + data.count(b"\r") > count or len(data) < limit or limit >= TAIL_LINES_MAX_BYTES:
                break
            limit *= 4
        text = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return lines[-count:]

    def read_from(self, job: Job, offset: int, most: int = 1 << 20) -> bytes:
        """Up to `most` bytes of the job's log from `offset` on (1 MiB: `gpuq log -f`)."""
        fd = open_regular(self.path_of(job))
        if fd is None:
            return b""
        try:
            return os.pread(fd, most, offset)
        finally:
            os.close(fd)

    def signature(self, job: Job) -> Optional[list[int]]:
        """[inode, size, mtime in ns] of the job's log (None if it has none): a log that still has
        those has not been written to since (the ETA keeps its reading of the log under them)."""
        try:
            st = os.lstat(self.path_of(job))
        except OSError:
            return None
        return [st.st_ino, st.st_size, st.st_mtime_ns]

    def size(self, job: Job) -> int:
        try:
            return os.stat(self.path_of(job)).st_size
        except OSError:
            return 0

    def put_from(self, job_id: int, offset: int, data: bytes) -> None:
        """The job's log from `offset` on made `data` (what a cluster kept of the attempt that began
        there, fetched again whole at each look), what came before the attempt left as it is."""
        fd = os.open(self.layout.log_path(job_id), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            if os.pread(fd, len(data), offset) != data:
                os.ftruncate(fd, offset)
                os.pwrite(fd, data, offset)
        finally:
            os.close(fd)

    def delete(self, job_id: int) -> int:
        return remove_counting(self.layout.log_path(job_id))


def _open_append(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)


def _tail(path: str, limit: int) -> tuple[bytes, float]:
    """The last `limit` bytes of a regular file and its mtime; (b"", 0.0) if there is none."""
    fd = open_regular(path)
    if fd is None:
        return b"", 0.0
    try:
        st = os.fstat(fd)
        return os.pread(fd, min(limit, st.st_size), max(0, st.st_size - limit)), st.st_mtime
    finally:
        os.close(fd)
