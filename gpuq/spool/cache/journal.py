"""cache/finished-jobs.journal: the rows of jobs that finished since the finished index was last
written (spool_layout.md, "Derived data"). The code that finishes a job appends its row once the
job's move has committed (engine/lifecycle/ending.py, `landed`), never the store's move itself; the
index's next build takes a file's row from here instead of reading the file, then folds the rows in
and truncates the journal (index.py).

Derived data: never fsynced, and an append that fails is dropped (it only costs that file being
read). A row is believed only for the file it names, in the same state under the same name and
inode (a finished file is never edited in place: a change is a new inode); of several rows for one
name the last appended wins. A line is a tab-separated text: the index's format, the state, the
file name, its inode, and the row's marshal bytes in hex (`bytes.hex`: no module to import on the
way of a plain `status`); a torn line fails to decode and is skipped, and an append after a torn
line starts on a line of its own.
"""

from __future__ import annotations

import marshal
import os
import stat
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
        the job's file is written; this only saves its read."""
        self._write("\t".join((self.tag, state, name, str(inode), marshal.dumps(row).hex())))

    def forget(self, state: str, name: str) -> None:
        """Append that the file `name` left finished `state` (a retry): an earlier row for it is
        believed no more, even for a later file that gets the same inode without a row of its own."""
        self._write("\t".join((self.tag, state, name, "0", "")))

    def _write(self, text: str) -> None:
        line = text.encode() + b"\n"
        try:
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
        except OSError:
            pass

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
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if os.fstat(fd).st_size == size:
                os.ftruncate(fd, 0)
        except OSError:
            pass
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
