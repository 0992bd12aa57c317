"""What the named tuples on the start-up path are built from (spool.store.JobRef,
engine.scheduler.Wait): `collections.namedtuple` would import collections (with operator,
keyword, reprlib) on every `gpuq status` and `gpuq add` (bench/PROFILE.md, section 1)."""

from __future__ import annotations

try:
    from _operator import itemgetter  # the C module: `operator` itself is a Python module on top
except ImportError:  # another Python implementation
    from operator import itemgetter

__all__ = ["itemgetter"]
