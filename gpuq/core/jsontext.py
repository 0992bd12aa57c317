"""json.loads and json.dumps for gpuq's own files, without importing the `json` package.

`import json` imports `re` (its decoder and encoder each compile patterns at import), and `re`
imports `enum`: together about 10 ms of every `gpuq status` and `gpuq add`, more than the rest
of what those commands import (bench/PROFILE.md, section 1). The parsing itself is the same C
scanner `json` uses (`_json.make_scanner`), so a file parses to the same objects and fails with
the same `json.JSONDecodeError`; the encoder writes what `json.dumps` writes for the values job
files hold (tests/test_jsontext.py compares them). Anything else, and an interpreter without
`_json`, goes to `json` itself.
"""

from __future__ import annotations

try:
    from _json import encode_basestring as _quote_text
    from _json import encode_basestring_ascii as _quote_ascii
    from _json import make_scanner as _make_scanner
except ImportError:  # another Python implementation: the json package does all of it
    _make_scanner = None

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

_WHITESPACE = " \t\n\r"  # what json's decoder skips around the value
_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class _Options:
    """The attributes `_json.make_scanner` reads from a json.JSONDecoder."""

    def __init__(self, object_pairs_hook: Any, parse_float: Any, parse_constant: Any) -> None:
        self.strict = True
        self.object_hook = None
        self.object_pairs_hook = object_pairs_hook
        self.parse_float = parse_float or float
        self.parse_int = int
        self.parse_constant = parse_constant or _CONSTANTS.__getitem__
        self.memo: dict = {}


_SCANNERS: dict[tuple, Callable] = {}


def loads(
    text: str | bytes,
    *,
    object_pairs_hook: Optional[Callable] = None,
    parse_float: Optional[Callable] = None,
    parse_constant: Optional[Callable] = None,
) -> Any:
    """json.loads(text, ...) for these options; raises json.JSONDecodeError as it does."""
    if isinstance(text, (bytes, bytearray)):
        if text[:4].count(0) or text.startswith((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")) or not _make_scanner:
            # a byte order mark, or UTF-16/32: json's own detection of the encoding decides
            return _json().loads(
                text, object_pairs_hook=object_pairs_hook, parse_float=parse_float, parse_constant=parse_constant
            )
        text = text.decode("utf-8", "surrogatepass")  # what json.loads decodes these bytes as
    key = (object_pairs_hook, parse_float, parse_constant)
    scan = _SCANNERS.get(key)
    if scan is None:
        if _make_scanner is None:
            return _json().loads(
                text, object_pairs_hook=object_pairs_hook, parse_float=parse_float, parse_constant=parse_constant
            )
        scan = _SCANNERS[key] = _make_scanner(_Options(*key))
    if text.startswith("\ufeff"):
        raise _error("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = scan(text, start)
    except StopIteration as stop:
        raise _error("Expecting value", text, stop.value) from None
    except SystemError:
        # Before 3.12 the scanner finds json.JSONDecodeError only in a json.decoder already
        # imported, and fails this way without it: import it, and the same scan says what is wrong.
        _json()
        value, end = scan(text, start)
    if end < len(text):
        rest = len(text) - len(text[end:].lstrip(_WHITESPACE))
        if rest < len(text):
            raise _error("Extra data", text, rest)
    return value


def dumps(
    value: Any, *, indent: Optional[int] = None, ensure_ascii: bool = True, separators: Optional[tuple[str, str]] = None
) -> str:
    """json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators)."""
    quote = _quote_ascii if ensure_ascii else _quote_text
    item, colon = separators or ((", " if indent is None else ","), ": ")  # json's defaults
    parts: list[str] = []
    try:
        if _make_scanner is None:
            raise _Unusual
        _encode(value, parts, _Style(quote, item, colon, " " * (indent or 0)), None if indent is None else "\n")
    except (_Unusual, RecursionError):  # a type or key json converts, a cycle json names: its own words
        return _json().dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators)
    return "".join(parts)


class _Style:
    """How values are written: the quoting of strings, the separators, one level's indent."""

    __slots__ = ("quote", "item", "colon", "step")

    def __init__(self, quote: Callable, item: str, colon: str, step: str) -> None:
        self.quote, self.item, self.colon, self.step = quote, item, colon, step


class _Unusual(Exception):
    """A value this encoder leaves to json."""


def _encode(value: Any, parts: list[str], style: _Style, newline: Optional[str]) -> None:
    kind = type(value)
    if kind is str:
        parts.append(style.quote(value))
    elif value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif kind is int:
        parts.append(int.__repr__(value))
    elif kind is float:
        parts.append(_float(value))
    elif isinstance(value, dict):  # a Job (core/job.py) too, as json encodes dict subclasses
        _encode_dict(value, parts, style, newline)
    elif kind is list or kind is tuple:
        _encode_list(value, parts, style, newline)
    else:
        raise _Unusual


def _encode_dict(value: dict, parts: list[str], style: _Style, newline: Optional[str]) -> None:
    if not value:
        parts.append("{}")
        return
    inner = None if newline is None else newline + style.step
    parts.append("{" if inner is None else "{" + inner)
    comma = style.item if inner is None else style.item + inner
    first = True
    for key, item in value.items():
        if type(key) is not str:
            raise _Unusual
        if not first:
            parts.append(comma)
        first = False
        parts.append(style.quote(key))
        parts.append(style.colon)
        _encode(item, parts, style, inner)
    parts.append("}" if newline is None else newline + "}")


def _encode_list(value: list | tuple, parts: list[str], style: _Style, newline: Optional[str]) -> None:
    if not value:
        parts.append("[]")
        return
    inner = None if newline is None else newline + style.step
    parts.append("[" if inner is None else "[" + inner)
    comma = style.item if inner is None else style.item + inner
    first = True
    for item in value:
        if not first:
            parts.append(comma)
        first = False
        _encode(item, parts, style, inner)
    parts.append("]" if newline is None else newline + "]")


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


def _error(message: str, text: str, position: int) -> Exception:
    return _json().JSONDecodeError(message, text, position)


def _json() -> Any:
    """The json package, for what this module leaves to it (errors, unusual values)."""
    import json

    return json
