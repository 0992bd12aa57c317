"""cache/: data gpuq derives from job files and can always rebuild (ARCHITECTURE.md, "Caches").

`Caches` reads and writes its files. The finished jobs' rows of `gpuq status -a` are kept here as
data, never as text (cli/render.py makes their cells): journal.py is what a finished job's row
holds and cache/finished-journal, appended as jobs finish; finished.py is cache/finished-view, the
rows of every finished job. `gpuq status` imports only this module (bench/PROFILE.md, section 1).
"""

from __future__ import annotations

from gpuq.spool.files import Files, read_small, unlink_quietly
from gpuq.spool.layout import Layout

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Optional


class Caches:
    def __init__(self, layout: Layout, files: Files):
        self.layout, self.files = layout, files

    def read(self, name: str) -> Optional[bytes]:
        """cache/NAME if it is a regular file of ours, else None."""
        return read_small(self.layout.cache_path(name), cap=1 << 34, mine=True)

    def write(self, name: str, data: bytes) -> None:
        """Replace cache/NAME atomically. Not fsynced: a cache lost in a power cut is rebuilt."""
        self.files.replace(self.layout.cache_path(name), data, "cache", durable=False)

    def remove(self, name: str) -> None:
        """Drop cache/NAME if it is there (one an older gpuq wrote and this one no longer reads)."""
        unlink_quietly(self.layout.cache_path(name))
