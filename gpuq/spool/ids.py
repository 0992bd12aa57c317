"""Job ids: unique and increasing across concurrent adders, and never given out twice. The counter
is in `next_id` and, as a copy, in `ids.lock` (whose flock serialises allocations): either one
keeps the high-water mark after `gpuq clear` removed the highest ids; only without both is it
rebuilt from the tree. A job file put in by hand (from another spool) may carry an id the counter
has not reached: the allocator passes the ids in the unfinished states, and whoever lists a state
calls `seen` (the finished ones are many: their index does), so such an id is never given out.
"""

from __future__ import annotations

import fcntl
import os

from gpuq.core.job import MAX_ID
from gpuq.core.states import PENDING, UNFINISHED
from gpuq.spool.dropbox import Dropbox
from gpuq.spool.errors import SpoolError, full_or
from gpuq.spool.files import Files, read_small
from gpuq.spool.layout import Layout
from gpuq.spool.store import JobStore


class NoIdLeft(SpoolError):
    """The counter has reached the largest id a job may have: nothing is given out or written."""


class IdCounter:
    def __init__(self, layout: Layout, files: Files, store: JobStore):
        self.layout, self.files, self.store = layout, files, store
        self._passed = 0  # an id this process knows the counter to be past (it only grows)

    def allocate(self, count: int = 1, at_least: int = 1) -> int:
        """The next job id; with `count`, the first of that many consecutive ids, all reserved.
        With `at_least`, the counter first moves up to that id (ids below it stay unused). NoIdLeft
        when an id given out (or, with count 0, passed over) would be above MAX_ID."""
        fd = os.open(self.layout.top_file("ids.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            next_id = max(self._stored(), _number(os.pread(fd, 32, 0)), 1)
            if next_id == 1:  # no record at all: rebuilt from what the tree holds
                next_id = self._highest_in_tree() + 1
            # a file moved in by hand: its id is in use whatever the counter says
            # (the finished ones are many: their index calls seen())
            next_id = max(next_id, at_least, max((ref.id + 1 for ref in self.store.refs(UNFINISHED)), default=1))
            _check_room(next_id, count)
            after = f"{next_id + count}\n".encode()
            # Both copies are fsynced before the id is given out. The spool directory is not
            # fsynced for next_id's rename: ids.lock, written in place and fsynced, holds the
            # counter over a power cut whichever next_id survives (the larger copy counts); only a
            # new ids.lock needs its name synced.
            new_lock = os.fstat(fd).st_size == 0
            try:  # padded, so that a longer old number leaves no digits behind
                os.pwrite(fd, after.ljust(32), 0)
                os.fsync(fd)
            except OSError as exc:
                raise full_or(self.layout.home, exc) from None
            self.files.replace(self.layout.top_file("next_id"), after, "id", sync_dir=new_lock)
            self._passed = next_id + count - 1
            return next_id
        finally:
            os.close(fd)

    def seen(self, job_id: int) -> None:
        """A job file with this id is in the spool: the counter moves past it if it had not (a file
        moved in by hand), so the id is never given out again. Reads the counter only for an id above
        the highest this process knows given out; a spool it cannot write is left as it is."""
        if job_id <= self._passed:
            return
        self._passed = max(self._stored(), _number(read_small(self.layout.top_file("ids.lock"), 32) or b"")) - 1
        if job_id > self._passed:
            try:
                self.allocate(count=0, at_least=job_id + 1)
            except (OSError, SpoolError):
                return

    def peek(self) -> int:
        """The id the next `allocate` would give now, read without the lock and with nothing
        reserved or written (`gpuq add --dry-run`): another `add` may take it first. NoIdLeft as
        `allocate`."""
        next_id = max(self._stored(), _number(read_small(self.layout.top_file("ids.lock"), 32) or b""), 1)
        if next_id == 1 and os.path.isdir(self.layout.state_dir(PENDING)):
            next_id = self._highest_in_tree() + 1
        _check_room(next_id, 1)
        return next_id

    def _stored(self) -> int:
        return _number(read_small(self.layout.top_file("next_id"), 32) or b"")

    def _highest_in_tree(self) -> int:
        intakes = Dropbox(self.layout, self.files).leftovers()  # ids given to dropped files mid-intake
        return max([ref.id for ref in self.store.refs()] + [job_id for job_id, _name in intakes], default=0)


def _check_room(next_id: int, count: int) -> None:
    """A job file could not hold an id above MAX_ID: such an id is refused, never written."""
    if next_id + count - 1 > MAX_ID:
        needed = f" ({count} needed)" if count > 1 else ""
        raise NoIdLeft(f"no job id left: ids end at {MAX_ID} and this spool's counter is at {next_id}{needed}")


def _number(data: bytes) -> int:
    try:
        return int(data.split(b"\n", 1)[0] or b"0")
    except ValueError:
        return 0
