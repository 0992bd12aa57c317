"""Files people drop into pending/ by hand: taking them in without losing or doubling one across a
crash (renamed first to .intake-NNNNNN-NAME, carrying the new id), and moving those that are not
jobs to rejected/ with the reason.
"""

from __future__ import annotations

import errno
import os
import zlib
from contextlib import AbstractContextManager

from gpuq.core.states import PENDING
from gpuq.spool.files import Files, read_small, unlink_quietly
from gpuq.spool.layout import INTAKE_RE, Layout, is_job_name
from gpuq.spool.mutex import turn
from gpuq.system import fsutil

REASON = ".reason"  # rejected/NAME.reason: why NAME was rejected
SEEN_STAMP = ".seen"  # rejected/.seen: the rejected files `gpuq rejected` has listed


class Dropbox:
    def __init__(self, layout: Layout, files: Files):
        self.layout, self.files = layout, files

    def turn(self) -> AbstractContextManager[bool]:
        """True for the one process taking in dropped files right now (others skip their turn),
        so several workers do not race for the same file and waste ids on it."""
        return turn(self.layout, "intake")

    def dropped(self) -> list[str]:
        """`*.json` files in pending/ that are not (yet) gpuq job files: candidates for intake."""
        return self.foreign()[0]

    def foreign(self) -> tuple[list[str], list[str]]:
        """The files in pending/ that are not gpuq job files, from one listing: the dropped ones
        (`*.json`) and the others (notes, editor backups), which are never taken in nor touched."""
        try:
            entries = os.listdir(self.layout.state_dir(PENDING))
        except FileNotFoundError:
            return [], []
        names = sorted(n for n in entries if not n.startswith(".") and not is_job_name(n))
        return [n for n in names if n.endswith(".json")], [n for n in names if not n.endswith(".json")]

    def leftovers(self) -> list[tuple[int, str]]:
        """(id, hidden name) of intakes a crash interrupted."""
        names = os.listdir(self.layout.state_dir(PENDING))
        found = (name.startswith(".intake-") and INTAKE_RE.match(name) for name in names)  # a plain name: no match
        return sorted((int(match.group(1)), match.string) for match in found if match)

    def begin(self, name: str, job_id: int) -> str:
        hidden = f".intake-{job_id:06d}-{name}"
        pending = self.layout.state_dir(PENDING)
        fsutil.rename_noreplace(os.path.join(pending, name), os.path.join(pending, hidden))
        return hidden

    def finish(self, hidden: str) -> None:
        os.unlink(self.layout.job_path(PENDING, hidden))
        fsutil.fsync_dir(self.layout.state_dir(PENDING))

    def reject(self, name: str, reason: str, *, hidden_name: str = "") -> str:
        """Move a file that is not a valid job from pending/ to rejected/, its reason beside it
        in NAME.reason; returns the name it got there. The reason is written first: a disk too
        full for it (SpoolFull) leaves the file in pending/, to be rejected once there is room."""
        source = self.layout.job_path(PENDING, hidden_name or name)
        if not os.path.lexists(source):
            # Already rejected or taken in (the worker's view of pending/ lags its events): a reason
            # placed for nothing would show in rejected/ until the move below failed.
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(source))
        base = _short_name(name)  # room for ".N.reason" within the 255-byte name limit
        target = base
        for n in range(1, 10000):
            reason_path = self.layout.rejected_path(target + REASON)
            try:  # created, not replaced: the reason holds the name for its file against another rejecter
                self.files.place_new(reason_path, f"{reason}\n".encode(), "reason")
            except FileExistsError:
                target = f"{base}.{n}"
                continue
            try:
                fsutil.rename_noreplace(source, self.layout.rejected_path(target))
                return target
            except FileExistsError:
                unlink_quietly(reason_path)  # a file left there without its reason
            except BaseException:
                unlink_quietly(reason_path)  # gone, or no room in rejected/: no reason without its file
                raise
            target = f"{base}.{n}"
        raise FileExistsError(self.layout.rejected_path(base))

    def rejected(self) -> list[str]:
        """The names of the files in rejected/ (not their `.reason` files, not the seen stamp)."""
        try:
            entries = os.listdir(self.layout.rejected_path(""))
        except FileNotFoundError:
            return []
        return sorted(n for n in entries if not n.startswith(".") and not n.endswith(REASON))

    def rejected_at(self, name: str) -> float:
        """When `name` was rejected: its reason file's mtime (written then; the file itself keeps
        the mtime it was dropped with), or the file's own if the reason is missing; 0.0 if gone."""
        for path in (self.layout.rejected_path(name + REASON), self.layout.rejected_path(name)):
            try:
                return os.lstat(path).st_mtime
            except OSError:
                continue
        return 0.0

    def reason(self, name: str) -> str:
        """The one-line reason `name` was rejected for ("" if its reason file is missing)."""
        data = read_small(self.layout.rejected_path(name + REASON), cap=64 << 10)
        return data.decode("utf-8", "replace").strip() if data else ""

    def unseen(self, names: list[str]) -> list[str]:
        """Those of `names` (rejected/'s) that `mark_seen` has not recorded."""
        if not names:
            return []  # the common case: no stamp to read
        stamp = read_small(self.layout.rejected_path(SEEN_STAMP), mine=True) or b""
        seen = set(os.fsdecode(n) for n in stamp.split(b"\0"))
        return [n for n in names if n not in seen]

    def mark_seen(self, names: list[str]) -> None:
        """rejected/.seen: the names seen, NUL-separated (no file name holds a NUL)."""
        data = b"\0".join(os.fsencode(n) for n in names)
        self.files.replace(self.layout.rejected_path(SEEN_STAMP), data, "seen", durable=False)


def _short_name(name: str, limit: int = 200) -> str:
    """`name`, or if its encoding is longer than `limit` bytes, a prefix of it plus a hash."""
    raw = os.fsencode(name)
    if len(raw) <= limit:
        return name
    return os.fsdecode(raw[: limit - 9]) + f"~{zlib.crc32(raw):08x}"
