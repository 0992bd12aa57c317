"""Regular expressions compiled on first use.

Compiling a pattern runs Python code (re's compiler): the dozens of module-level patterns of
progress parsing, time specs and checkpoints cost `gpuq status` and `gpuq add` several
milliseconds at every start, while most runs use none of them.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    import re
    from typing import Any

# re.IGNORECASE's value, for the flags of a lazy pattern: importing `re` for its name alone would
# cost the start-up this module exists to spare (tests/test_jsontext.py checks it is re's).
IGNORECASE = 2


class LazyPattern:
    """Stands for `re.compile(pattern, flags)` (its methods and attributes), compiled on first use.
    Not a re.Pattern: pass `.compiled` where one is required. The first use of a method keeps the
    compiled pattern's bound method in the instance, so later calls go straight to it: progress
    parsing calls these thousands of times for one log tail."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self._args = (pattern, flags)
        self._compiled: Any = None

    @property
    def compiled(self) -> re.Pattern:
        if self._compiled is None:
            import re  # here, not at the top: `re` (with `enum`) costs a start-up that compiles nothing

            self._compiled = re.compile(*self._args)
        return self._compiled

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.compiled, name)
        setattr(self, name, value)
        return value


def lazy(pattern: str, flags: int = 0) -> Any:
    """A LazyPattern, typed as Any so that callers use it as the re.Pattern it stands for."""
    return LazyPattern(pattern, flags)
