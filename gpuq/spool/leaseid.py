"""`lease-id`: how this spool's jobs name it in the GPU leases and tickets that every user of the
machine reads (lease_layout.md, section 3): random, made once, so that it tells its owner's gpuq
which queue a job is in and others nothing (the hash of its path that an earlier gpuq wrote could be
checked against a guessed path). Both paths to a spool reached through a link read the same file.
The id is bound to the spool's directory (its device and inode): a copy of the spool (`cp -a`, a
backup restored beside it) has the file but not the directory, so it makes an id of its own instead
of taking the original's jobs for its own.
"""

from __future__ import annotations

import os
import re
from typing import Optional

from gpuq.spool.files import Files, read_small
from gpuq.spool.layout import Layout
from gpuq.spool.mutex import held

NAME = "lease-id"
_ID = re.compile(r"[0-9a-f]{16}\Z")  # 8 random bytes: as long as the hash it replaces


class LeaseId:
    def __init__(self, layout: Layout, files: Files):
        self.layout, self.path, self.files = layout, layout.top_file(NAME), files

    def get(self) -> Optional[str]:
        """The spool's id, made by the first of its jobs to take a lease (anew over a file that is no
        id, or another directory's); None where it cannot be written (a full disk): its leases then
        name it as an earlier gpuq did."""
        found = self.read()
        if found is not None:
            return found
        try:
            with held(self.layout, NAME):  # two makers at once would write two ids: one is made, both read it
                found = self.read()
                if found is None:
                    found = os.urandom(8).hex()
                    self.files.replace(self.path, f"{found} {self._directory()}\n".encode(), NAME)
        except OSError:  # no room
            return self.read()
        return found

    def read(self) -> Optional[str]:
        """The id, None while none is made for this directory."""
        data = read_small(self.path, cap=128)
        if data is None:
            return None
        made, _, where = data.decode("ascii", "replace").strip().partition(" ")
        return made if _ID.match(made) and where == self._directory() else None

    def _directory(self) -> Optional[str]:
        """What tells the spool's directory from a copy of it, whatever path (a link) reached it."""
        try:
            st = os.stat(self.layout.home)
        except OSError:  # the spool's directory is gone
            return None
        return f"{st.st_dev}:{st.st_ino}"
