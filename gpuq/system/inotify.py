"""Linux inotify, read by the worker's own thread (run/loop.py).

watchdog delivers each event through three threads of its own (a reader, an emitter, a dispatcher)
and an object per event: with a job started every few milliseconds that cost the worker more CPU
than its scheduling step (issue 15, bench/PROFILE.md section 3). Here the inotify descriptor is
watched by the loop's own `select` beside its wake-up pipe, and its events are plain tuples. Where
inotify cannot be had (not Linux, no libc symbol, the watch limit reached) the loop falls back to
watchdog.
"""

from __future__ import annotations

import errno
import os
import struct
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

IN_MODIFY = 0x2
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000  # the kernel's queue overflowed: events were lost
IN_IGNORED = 0x8000  # the watch is gone (its directory was removed)
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
WATCHED_EVENTS = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
WATCHED_EVENTS |= IN_DELETE_SELF | IN_MOVE_SELF  # the watched directory itself went
_GONE = IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
OVERFLOW = ""  # the label of an overflow event


class Watcher:
    """Watches directories (label -> path), non-recursively. `read()` returns the events since the
    last read as (label, mask, name); an overflow comes as (OVERFLOW, mask, ""). `broken` is set
    once a watched directory went away: the caller then starts a new Watcher."""

    def __init__(self, paths: dict[str, str]) -> None:
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, "inotify is Linux only")
        import ctypes  # already loaded by the worker's renames (system/fsutil.py)

        libc: Any = ctypes.CDLL(None, use_errno=True)
        if not hasattr(libc, "inotify_init1"):
            raise OSError(errno.ENOSYS, "no inotify in libc")
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.fd, self.labels, self.broken = fd, {}, False
        for label, path in paths.items():
            wd = libc.inotify_add_watch(fd, os.fsencode(path), WATCHED_EVENTS | IN_ONLYDIR)
            if wd < 0:
                code = ctypes.get_errno()
                os.close(fd)
                raise OSError(code, f"inotify_add_watch {path}: {os.strerror(code)}")
            self.labels[wd] = label

    def fileno(self) -> int:
        return self.fd

    def read(self) -> list[tuple[str, int, str]]:
        out: list[tuple[str, int, str]] = []
        labels, unpack, size = self.labels, _HEADER.unpack_from, _HEADER.size
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            pos = 0
            while pos < len(data):
                wd, mask, _cookie, length = unpack(data, pos)
                raw = data[pos + size : pos + size + length]
                pos += size + length
                if mask & IN_Q_OVERFLOW:
                    out.append((OVERFLOW, mask, ""))
                elif mask & _GONE:
                    self.broken = True
                elif wd in labels and not mask & IN_ISDIR:
                    out.append((labels[wd], mask, os.fsdecode(raw.rstrip(b"\0"))))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
