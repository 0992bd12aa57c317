"""cache/finished-jobs.journal: the rows of jobs finished since the finished index was last written,
appended by the code that finishes a job once its move has committed (engine/lifecycle/ending.py,
`landed`; never the store's move), taken by the index's next build instead of reading those files.
spool_layout.md ("Derived data") gives the line format and when a row is believed. Derived data:
never fsynced, and an append that fails is dropped (it only costs that file being read).
"""

from __future__ import annotations

import marshal
import os
import stat
from contextlib import suppress
from typing import Optional

from gpuq.core.states import FINISHED
from gpuq.spool.files import MIN_FREE_TO_START, free_bytes, read_small
from gpuq.spool.layout import Layout

NAME = "finished-jobs.journal"
MAX_BYTES = 128 << 20  # some 250,000 rows: past it (no index written for that long) rows are dropped
END_FIELDS = 8  # a row's end (index.END)
ROW_FIELDS = 7  # index.ROW

Rows = dict[tuple[str, str], tuple[int, tuple]]  # (state, file name) -> (inode, row)


class Journal:
    def __init__(self, layout: Layout, form: int) -> None:
        self.layout, self.tag = layout, str(form)

    @property
    def path(self) -> str:
        return self.layout.cache_path(NAME)

    def append(self, state: str, name: str, inode: int, row: tuple) -> None:
        """Append the row of the file `name` (inode `inode`) in finished `state`. Never raises:
        the job's file is written; this only saves its read. The row in hex: `bytes.hex` needs no
        module imported on the way of a plain `status`."""
        self._write("\t".join((self.tag, state, name, str(inode), marshal.dumps(row).hex())))

    def forget(self, state: str, name: str) -> None:
        """Append that the file `name` left finished `state` (a retry): an earlier row for it is
        believed no more, even for a later file that gets the same inode without a row of its own."""
        self._write("\t".join((self.tag, state, name, "0", "")))

    def _write(self, text: str) -> None:
        line = text.encode() + b"\n"
        with suppress(OSError):
            if free_bytes(self.layout.home) < MIN_FREE_TO_START:
                return  # the disk's last room is for job files (spool_layout.md section 14)
            flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.path, flags, 0o600)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size >= MAX_BYTES:
                    return
                if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n":
                    line = b"\n" + line  # a torn line before: never joined to this one
                os.write(fd, line)  # one write: appenders at once do not interleave within a line
            finally:
                os.close(fd)

    def read(self) -> tuple[int, Rows]:
        """(the journal's size as read, its rows); empty when it is missing, not ours or damaged
        (a damaged line is skipped)."""
        data = read_small(self.path, cap=MAX_BYTES + (1 << 20), mine=True) or b""
        rows: Rows = {}
        lines = data.decode("ascii", "replace").split("\n")  # what gpuq writes is ASCII
        lines.pop()  # after the last line break: nothing, or a torn line
        for line in lines:
            parts = line.split("\t")
            if len(parts) != 5 or parts[0] != self.tag or parts[1] not in FINISHED or not parts[3].isdigit():
                continue  # another format's or a damaged line
            row = _decoded(parts[4]) if parts[4] else ()  # () for a file that left (inode 0)
            if row is not None and (row or parts[3] == "0"):
                rows[(parts[1], parts[2])] = (int(parts[3]), row)
        return len(data), rows

    def fold(self, size: int) -> None:
        """Truncate the journal once its rows, read at `size`, are in the index just written; a
        journal that grew since holds rows the index may lack: it stays for the next build."""
        with suppress(OSError):
            fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                if os.fstat(fd).st_size == size:
                    os.ftruncate(fd, 0)
            finally:
                os.close(fd)


def _decoded(text: str) -> Optional[tuple]:
    """A row as `append` wrote it; None for anything else (a torn or damaged line)."""
    try:
        row = marshal.loads(bytes.fromhex(text))
    except (EOFError, ValueError, TypeError):
        return None
    if type(row) is not tuple or len(row) != ROW_FIELDS or type(row[3]) is not tuple or len(row[3]) != END_FIELDS:
        return None
    return row
