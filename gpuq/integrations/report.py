"""The progress file a job writes for gpuq: `{"step": 120, "total": 300, "time": ..., "recent": [...]}`,
`recent` the last RECENT (time, step) pairs of this process, so gpuq has a rate from its first look
and a resumed run's rate counts only its own steps. Written atomically. Standard library only."""

from __future__ import annotations

import json
import os
import time
from collections import deque
from typing import Any, Optional

ENV_VAR = "GPUQ_PROGRESS_FILE"
RECENT = 20


class ProgressWriter:
    """Writes the progress file at most every `min_interval` seconds (and always when forced). Never
    raises: a training run must not die because its progress could not be written."""

    def __init__(self, path: Optional[str] = None, min_interval: float = 1.0):
        self.path = path if path is not None else os.environ.get(ENV_VAR)
        self.min_interval = min_interval
        self.recent: deque[tuple[float, float]] = deque(maxlen=RECENT)
        self._last_write = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.path)

    def update(self, step: float, total: Optional[float] = None, force: bool = False, **extra: Any) -> bool:
        """Record that `step` of `total` is reached now; returns True if the file was written."""
        if not self.path:
            return False
        now = time.time()
        if not self.recent or self.recent[-1][1] != step:
            self.recent.append((now, step))
        if not force and now - self._last_write < self.min_interval:
            return False
        data: dict[str, Any] = {"step": step, "total": total, "time": now, "recent": [list(p) for p in self.recent]}
        data.update({k: v for k, v in extra.items() if v is None or isinstance(v, (bool, int, float, str))})
        folder, name = os.path.split(self.path)
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
        try:
            text = json.dumps(data)
            with open(tmp, "w") as fh:
                fh.write(text)
            os.replace(tmp, self.path)
        except (OSError, TypeError, ValueError):
            return False
        self._last_write = now
        return True
