"""Where the original gpuq's queue would lie in a spool home: checked before every command, so it
is kept apart from engine/original/reader.py, whose readers (dataclasses, datetime) a command imports only
when such a queue is there."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Optional

DB_NAME = "gpuq.db"
JSON_NAME = "queue.json"


def find_legacy(home: str | os.PathLike[str]) -> Optional[Path]:
    """The file an import would take from `home`: `gpuq.db` first, then `queue.json`.

    `.bak` files are never returned: they are what an import (the original's own migration
    included) leaves behind. Costs two stats, so it can run before every command.
    """
    for name in (DB_NAME, JSON_NAME):
        path = os.path.join(home, name)
        if os.path.isfile(path):
            from pathlib import Path  # only then: `gpuq status` finds none and does not import pathlib

            return Path(path)
    return None
