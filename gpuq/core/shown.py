"""The few fields of a job file that a row of `gpuq status -a` shows, checked alone.

A finished job's file is mostly its shell's environment; `gpuq status -a` over 100,000 of them
cannot afford the full check of every file (issue 15): a parse of all of it, then some 60 field
checks. A file that begins and ends as gpuq writes it (`jsontext.dumps(indent=2)`, spool/store.py:
encode) is parsed less its `shell_env` member (never shown; half of its bytes), cut out at the
first line indented as the top level after its start: a raw newline never occurs inside a JSON
string and nested lines are indented further, so in gpuq's layout that is the member whole, and
any other cut leaves nesting that no longer balances, which the parse refuses. The rest is parsed
as schema.parse_bytes parses a file (a key given twice is refused); any surprise sends the file to
the full parse. Either way, only the fields a row shows (and the version and id) are checked, each
by the schema's own check of that field.

What this trusts: damage outside the shown fields (a bad environment variable, a field of the
wrong type that no row shows) goes unnoticed by a row; `gpuq show ID` and anything that runs or
moves the job check the whole file. Damage in a shown field is reported as such
(schema.InvalidJob), never a crash.
"""

from __future__ import annotations

from gpuq.core import jsontext, schema

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional

_HEAD = b'{\n  "schema_version": %d,\n  "id": ' % schema.SCHEMA_VERSION
_TAIL = b"\n}\n"


def load_shown(data: bytes, expected_id: int, fields: tuple[str, ...]) -> dict[str, Any]:
    """A job file's bytes as a dict whose version, id and `fields` are checked as schema.validate
    checks them; schema.InvalidJob with the reason otherwise."""
    found = _parse_fast(data)
    if found is None:
        found = schema.parse_bytes(data)
    return check_shown(found, expected_id, fields)


def check_shown(job: dict[str, Any], expected_id: int, fields: tuple[str, ...]) -> dict[str, Any]:
    """The checks of schema.validate that concern `fields` (and the version and id)."""
    version = job.get("schema_version")
    if type(version) is not int or version != schema.SCHEMA_VERSION:
        raise schema.InvalidJob(f"unknown schema_version {version!r} (this gpuq reads {schema.SCHEMA_VERSION})")
    rules = _RULES.get(fields)
    if rules is None:
        rules = _RULES[fields] = _rules(fields)
    for field, required, nullable, ok, what in rules:
        if field not in job:
            if required:
                raise schema.InvalidJob(f"missing field {field!r}")
            continue
        value = job[field]
        if value is None and nullable:
            continue
        if field == "cmd" and _plain_words(value):
            continue  # the usual command: its rule's per-word encoding check is a third of the time
        if not ok(value):
            raise schema.InvalidJob(f"field {field!r} must be {what}, not {schema._shown(value)}")
    if job["id"] != expected_id:
        raise schema.InvalidJob(f"file name says id {expected_id} but the file says {job['id']}")
    return job


_RULES: dict[tuple[str, ...], list[tuple[str, bool, bool, Any, str]]] = {}


def _rules(fields: tuple[str, ...]) -> list[tuple[str, bool, bool, Any, str]]:
    """(field, required, may be null, check, what it must be) of the id and each of `fields`."""
    out = []
    for field in ("id", *fields):
        required = field in schema.REQUIRED
        ok, what = schema.REQUIRED[field] if required else schema.OPTIONAL[field]
        out.append((field, required, bool(ok(None)), ok, what))
    return out


def _plain_words(value: Any) -> bool:
    """A non-empty list of ASCII strings without NUL, the first non-empty: what the rule of `cmd`
    accepts, decided at once for the usual case (False: ask the rule)."""
    if type(value) is not list or not value or not value[0] or not all(type(w) is str for w in value):
        return False
    joined = "".join(value)
    return joined.isascii() and "\x00" not in joined


def _parse_fast(data: bytes) -> Optional[dict[str, Any]]:
    """The file less its `shell_env` parsed as schema.parse_bytes parses a file, if it is in
    gpuq's own layout; None otherwise (the full parse then decides, and says why)."""
    if not (data.startswith(_HEAD) and data.endswith(_TAIL)):
        return None
    try:
        job = jsontext.loads(
            _without_environment(data.decode()),
            object_pairs_hook=schema._reject_duplicate_keys,
            parse_constant=schema._no_constant,
            parse_float=schema._finite_float,
        )
    except (ValueError, RecursionError):
        return None
    return job if type(job) is dict else None


_ENV_START = '\n  "shell_env": {\n'
_ENV_END = "\n  },"  # in gpuq's layout, the first line at this indentation after the start ends it


def _without_environment(text: str) -> str:
    """The text without its `shell_env` member: half of the bytes, none of them shown. Cut at its
    first line indented as the top level: a member whole (it is in gpuq's layout), or nesting that
    no longer balances, which the parse refuses."""
    start = text.find(_ENV_START)
    if start < 0:
        return text
    end = text.find(_ENV_END, start)
    if end < 0:
        raise ValueError("no end of shell_env")
    return text[:start] + text[end + len(_ENV_END) :]
