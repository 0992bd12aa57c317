"""The job files an earlier `gpuq status` parsed and checked, kept for the next one (cache/status-jobs).

Reading, parsing and checking the 20-30 pending, running and recent job files of a researcher's
queue cost `gpuq status` some 4 ms of every call (bench/PROFILE.md, section 6), though few of them
change between two calls. A job file is never edited in place: every change writes a new file and
renames it over the old one (a new inode) or moves it, so a file that keeps its name, inode, mtime
and size holds what it held when it was parsed, and the job kept under that signature is the job
a read would give. Each file is still lstat()ed at every call; a file that is new, changed or not
a valid job is read as before (one that is not valid is never kept: it may still be being written),
and so is one whose mode, owner or links changed (a read checks them: system/security.py).
The jobs are kept as they were checked by this code (the stat of core/schema.py and core/job.py
names it): another gpuq's are read again.
"""

from __future__ import annotations

import marshal
import os

from gpuq.core import schema
from gpuq.core.job import Job
from gpuq.spool.files import MIN_FREE_TO_START

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional, Union

    from gpuq.spool import JobRef, Spool

CACHE_NAME = "status-jobs"
_FORMAT = 1


def code_stamp(*modules: str) -> tuple:
    """The (mtime, size) of each of gpuq's source files `modules` ("core/schema"), (0, 0) for one
    that is not there: what a cache made by that code is kept under, so that a new gpuq makes it
    again (without importing those modules: their stat is enough)."""
    top = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))  # the gpuq package
    out = []
    for module in modules:
        try:
            st = os.stat(os.path.join(top, f"{module}.py"))
        except OSError:
            out.append((0, 0))
        else:
            out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)


def room_for_caches(spool: Spool) -> bool:
    """Whether a cache may be written: not with less than MIN_FREE_TO_START free, the disk's last
    room being for job files (spool_layout.md section 14)."""
    return spool.disk_space()[1] >= MIN_FREE_TO_START


class KeptJobs:
    """The jobs of one `gpuq status`: those kept from the last one where their files did not
    change, the others read. Also the parse cache engine/schedule/queue_read.read_queue takes
    (its PendingCache's methods: begin, load, forget, forget_missing)."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self.stamp = (_FORMAT, marshal.version, code_stamp("core/schema", "core/job"))
        self.kept = self._read()
        self.now: dict[tuple[str, str], tuple[tuple[int, ...], dict[str, Any]]] = {}

    def _read(self) -> dict[tuple[str, str], Any]:
        data = self.spool.cache.read(CACHE_NAME)
        try:
            stamp, kept = marshal.loads(data) if data else (None, None)
        except (EOFError, ValueError, TypeError):
            return {}  # damaged: every file is read, and the cache written again
        return kept if stamp == self.stamp and type(kept) is dict else {}

    def job(self, ref: JobRef) -> Job:
        """The valid job of `ref`, as spool.jobs.load gives it: schema.InvalidJob or
        FileNotFoundError otherwise."""
        path = self.spool.layout.job_path(ref.state, ref.name)
        before = _signature(path)
        hit = self.kept.get((ref.state, ref.name))
        if before is not None and type(hit) is tuple and len(hit) == 2 and hit[0] == before and type(hit[1]) is dict:
            self.now[(ref.state, ref.name)] = hit
            return Job(hit[1])
        job = self.spool.jobs.load(ref)
        if before is not None and _signature(path) == before:  # the file read is the one stat()ed
            self.now[(ref.state, ref.name)] = (before, dict(job))
        return job

    def load(self, _spool: Spool, ref: JobRef) -> Union[Job, schema.InvalidJob, None]:
        """read_queue's reading: the job, the reason it is not one, or None if the file is gone."""
        try:
            return self.job(ref)
        except FileNotFoundError:
            return None
        except schema.InvalidJob as exc:
            return exc

    def begin(self, _spool: Spool) -> None:
        """Every file is lstat()ed: no directory is trusted as a whole."""

    def forget(self, state: str, name: str) -> None:
        self.now.pop((state, name), None)

    def forget_missing(self, present: set[tuple[str, str]]) -> None:
        """Files no longer listed are simply not kept by save()."""

    def save(self) -> None:
        """Keep the jobs of this call for the next one, if they are not those kept already."""
        if self.now == self.kept or not room_for_caches(self.spool):
            return
        try:
            self.spool.cache.write(CACHE_NAME, marshal.dumps((self.stamp, self.now)))
        except (OSError, ValueError):
            pass  # a read-only or full spool reads its files every time


def _signature(path: str) -> Optional[tuple[int, ...]]:
    """What a job file is known by: inode, mtime and size, and what a read checks of it beyond its
    content (system/security.job_file_problem: its type and mode, owner, links)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode, st.st_uid, st.st_nlink
