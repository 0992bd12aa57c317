"""`--keep-checkpoints N|best|all` as typed, and as the config file gives it (`keep_checkpoints = 3`):
how many of a job's newest complete checkpoints are kept, "best" (the newest one and the best
by the metric its trainer records), or "all" (a job's own: none removed, whatever the config file
says). engine/tracking/retention.py applies the rule."""

from __future__ import annotations

from typing import Any, Union

BEST = "best"
ALL = "all"
Keep = Union[int, str]


def parse_keep(text: Any) -> Keep:
    """A positive number of checkpoints, "best" or "all"; ValueError saying what it is not."""
    if isinstance(text, int) and not isinstance(text, bool) and text > 0:
        return text
    if isinstance(text, str) and text.strip().lower() in (BEST, ALL):
        return text.strip().lower()
    if isinstance(text, str) and text.strip().isdigit() and int(text) > 0:
        return int(text)
    raise ValueError(f"not a number of checkpoints (1 or more), 'best' or 'all': {text!r}")
