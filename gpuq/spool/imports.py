"""Records of queues imported from the original gpuq (imports/FINGERPRINT.json), so that the same
queue is never imported twice, whatever its file is called by then."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

from gpuq.spool.files import Files, read_object
from gpuq.spool.layout import Layout

FINGERPRINT_RE = r"^[0-9a-f]{16,128}$"


class ImportRecords:
    def __init__(self, layout: Layout, files: Files):
        self.layout, self.files = layout, files

    def find(self, fingerprint: str) -> Optional[dict[str, Any]]:
        if not re.match(FINGERPRINT_RE, fingerprint):
            return None
        return read_object(self.layout.import_path(fingerprint), mine=True)

    def write(self, fingerprint: str, record: dict[str, Any]) -> None:
        if not re.match(FINGERPRINT_RE, fingerprint):
            raise ValueError(f"not a fingerprint: {fingerprint!r}")
        self.files.replace(self.layout.import_path(fingerprint), json.dumps(record, indent=2).encode(), "import")

    def all(self) -> list[dict[str, Any]]:
        """Every import recorded here, oldest first."""
        folder = self.layout.internal_dir("imports")
        try:
            names = sorted(n[:-5] for n in os.listdir(folder) if n.endswith(".json"))
        except FileNotFoundError:
            return []
        found = [record for record in map(self.find, names) if record is not None]
        return sorted(found, key=lambda record: str(record.get("at", "")))
