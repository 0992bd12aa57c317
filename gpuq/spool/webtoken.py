"""`web-token`: the secret every request to `gpuq web` is signed with (spool_layout.md, section
1). Anyone on the machine can reach the loopback interface, so the page's only key is this file,
readable by its owner alone (0600, as every file of the spool). It is kept across restarts so an
open page and a bookmarked URL keep working; `gpuq web --new-token` makes a new one.
"""

from __future__ import annotations

import os
import stat
from typing import Callable, Optional

from gpuq.spool.files import Files, open_regular
from gpuq.spool.layout import Layout

NAME = "web-token"
TOKEN_BYTES = 32  # 256 bits, as hex: nothing to guess over a socket


class WebToken:
    def __init__(self, layout: Layout, files: Files):
        self.layout, self.files = layout, files

    @property
    def path(self) -> str:
        return self.layout.top_file(NAME)

    def get(self, new: bool = False) -> str:
        """The spool's token, made on first use (or when `new`, or when the file is not one only its
        owner could read: then it may have been read by others)."""
        if not new:
            found = self._read()
            if found is not None:
                return found
        token = os.urandom(TOKEN_BYTES).hex()
        if new or os.path.lexists(self.path):
            self.files.replace(self.path, f"{token}\n".encode(), "web-token")
            return token
        try:
            self.files.place_new(self.path, f"{token}\n".encode(), "web-token")
        except FileExistsError:  # another `gpuq web` made it meanwhile: one token for both
            return self._read() or self.get(new=True)
        return token

    def follow(self) -> Callable[[], Optional[str]]:
        """The token as its file says it now, read again only when the file changed (a stat a call),
        so that a running server honours `--new-token` at once; None while the file is missing or
        others could read it: every request is refused then."""
        seen: list[Optional[object]] = [None, None]  # the file's (inode, mtime, size), its token

        def current() -> Optional[str]:
            try:
                st = os.stat(self.path, follow_symlinks=False)
            except OSError:
                return None
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if key != seen[0]:
                seen[:] = [key, self._read()]
            return seen[1]  # type: ignore[return-value]

        return current

    def _read(self) -> Optional[str]:
        fd = open_regular(self.path)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
                return None
            text = os.read(fd, 4 * TOKEN_BYTES).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        return text if len(text) == 2 * TOKEN_BYTES and all(c in "0123456789abcdef" for c in text) else None
