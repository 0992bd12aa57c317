"""`kept-runs`: what `gpuq clear` keeps of the finished jobs it removes (spool_layout.md, "What clear
keeps"), so that history and the ETA forget nothing: one JSON line per job, RECORD. One clear's lines
are appended in one `write` and fsynced before any of those jobs' files goes: a crash in between
leaves a record whose job still has its file, which readers skip by its id. Primary data, not a
cache: written durably, and only by `gpuq clear`.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any, Optional

from gpuq.core.states import DONE
from gpuq.spool.errors import full_or
from gpuq.spool.files import read_small
from gpuq.spool.layout import Layout
from gpuq.system import fsutil

NAME = "kept-runs"
FORMAT = 1
# A record: the job's id, the finished state it was cleared from, its name, its command key and
# past (spool/cache/runs.py's JSON texts, as a finished row holds them), its run time in seconds
# (null: unknown or adopted), its end (epoch seconds, null: unknown) and its tail (seconds its run
# took after its last step, null: not known).
RECORD = ("id", "state", "name", "key", "run", "past", "end", "tail")
_NUMBER = (int, float, type(None))
_TYPES: tuple[Any, ...] = (int, str, str, str, _NUMBER, str, _NUMBER, _NUMBER)
MAX_READ = 1 << 34
Runs = dict[str, list[tuple[int, float]]]  # command key -> (job id, run seconds)
Tails = dict[str, list[tuple[float, float, int]]]  # command key -> (end, tail seconds, job id)


class KeptRuns:
    def __init__(self, layout: Layout):
        self.layout = layout

    def path(self) -> str:
        return self.layout.top_file(NAME)

    def append(self, records: list[tuple[Any, ...]]) -> None:
        """Append `records` (RECORD tuples) durably; SpoolFull, none of them left, without room."""
        if not records:
            return
        data = b"".join(json.dumps([FORMAT, *record]).encode() + b"\n" for record in records)
        path = self.path()
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)  # read: its last byte
        try:
            before = os.fstat(fd).st_size
            if before and os.pread(fd, 1, before - 1) != b"\n":
                data = b"\n" + data  # after a torn line (a crash mid-write): ours start on a line of their own
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(errno.ENOSPC, "short write")
                os.fsync(fd)
            except OSError as exc:
                if os.fstat(fd).st_size > before:
                    os.ftruncate(fd, before)  # not a half record: they are all kept, or none
                raise full_or(self.layout.home, exc) from None
        finally:
            os.close(fd)
        if before == 0:
            fsutil.fsync_dir(self.layout.home)

    def read(self) -> list[tuple[Any, ...]]:
        """Every valid record (RECORD tuples) in the order appended; torn, damaged or other formats' lines skipped."""
        data = read_small(self.path(), cap=MAX_READ, mine=True)
        out = []
        for line in data.split(b"\n") if data else ():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if type(value) is list and len(value) == len(RECORD) + 1 and value[0] == FORMAT:
                record = tuple(value[1:])
                if all(isinstance(v, t) for v, t in zip(record, _TYPES)) and type(record[0]) is int:
                    out.append(record)
        return out

    def signature(self) -> Optional[tuple[int, int, int]]:
        """(inode, mtime_ns, size) of the file, or None when there is none: what caches of it check."""
        try:
            st = os.stat(self.path(), follow_symlinks=False)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size


def summarise(records: list[tuple[Any, ...]]) -> tuple[Runs, Tails]:
    """The run times (of done jobs) and tails of each command in `records`, as the ETA learns from
    them (it takes the newest); a job kept twice (a clear cut short, then run again) counts once."""
    runs: Runs = {}
    tails: Tails = {}
    for job_id, state, _name, key, run, _past, end, tail in {record[0]: record for record in records}.values():
        if state == DONE and run is not None:
            runs.setdefault(key, []).append((job_id, float(run)))
        if tail is not None and end is not None:
            tails.setdefault(key, []).append((float(end), float(tail), job_id))
    return runs, tails
