"""`lease-id`: how this spool's jobs name it in the GPU leases and tickets that every user of the
machine reads (lease_layout.md, section 3): random, made once, so that it tells its owner's gpuq
which queue a job is in and others nothing (the hash of its path that an earlier gpuq wrote could be
checked against a guessed path). Both paths to a spool reached through a link read the same file.
"""

from __future__ import annotations

import os
import re
from typing import Optional

from gpuq.spool.files import Files, open_regular
from gpuq.spool.layout import Layout

NAME = "lease-id"
_ID = re.compile(r"[0-9a-f]{16}\Z")  # 8 random bytes: as long as the hash it replaces


class LeaseId:
    def __init__(self, layout: Layout, files: Files):
        self.path, self.files = layout.top_file(NAME), files

    def get(self) -> Optional[str]:
        """The spool's id, made by the first of its jobs to take a lease (anew over a file that is no id);
        None where it cannot be written (a full disk): its leases then name it as an earlier gpuq did."""
        found = self.read()
        if found is not None:
            return found
        made = os.urandom(8).hex()
        try:
            write = self.files.replace if os.path.lexists(self.path) else self.files.place_new
            write(self.path, f"{made}\n".encode(), NAME)
        except OSError:  # another of its jobs made it meanwhile (one id for both), or no room
            return self.read()
        return made

    def read(self) -> Optional[str]:
        """The id, None while none is made."""
        fd = open_regular(self.path)
        if fd is None:
            return None
        try:
            text = os.read(fd, 64).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        return text if _ID.match(text) else None
