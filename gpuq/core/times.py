"""Times as job files hold them (ISO 8601 with the local offset) and durations as people read them."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional, Sequence


def now_iso() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="milliseconds")


def iso_of(epoch: float) -> str:
    """Epoch seconds -> the ISO 8601 form job files use (local offset); "" for a time no platform
    can show (1e300 in another user's lease file)."""
    try:
        return datetime.fromtimestamp(epoch, timezone.utc).astimezone().isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return ""


def clock(epoch: float) -> str:
    """Epoch seconds -> the local time of day, `14:02:11`; "?" for a time no platform can show."""
    try:
        return datetime.fromtimestamp(epoch).strftime("%H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return "?"


def parse_iso(value: Optional[str]) -> Optional[float]:
    """ISO 8601 string -> epoch seconds (None and "" pass through as None)."""
    if not value:
        return None
    return datetime.fromisoformat(value).timestamp()


def duration(seconds: Optional[float]) -> str:
    """`42s`, `3m05s`, `2h10m`; "" for an unknown (None or negative) duration."""
    if seconds is None or seconds < 0:
        return ""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence, as `statistics.median` gives it. Our own because
    `statistics` brings `fractions`, `decimal` and `random` into every `gpuq status` that shows
    an ETA (bench/PROFILE.md, section 12)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
