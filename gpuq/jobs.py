"""The job-file schema: building, parsing and validating job dictionaries.

A job is a plain dict that round-trips through JSON; spool_layout.md documents every field.
This module knows what a valid job looks like; it never touches the filesystem.
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import datetime, timezone
from typing import Any, Optional

SCHEMA_VERSION = 1
MAX_NAME_LEN = 200
SLUG_RE = re.compile(r"[^A-Za-z0-9._-]+")


class InvalidJob(ValueError):
    """A file or dict that is not a valid job; str(exc) is the reason shown to the user."""


def now_iso() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="milliseconds")


def parse_iso(value: Optional[str]) -> Optional[float]:
    """ISO 8601 string -> epoch seconds (None passes through)."""
    if not value:
        return None
    return datetime.fromisoformat(value).timestamp()


def slug(name: str) -> str:
    """The part of a file name that shows the job's name: safe characters only."""
    text = SLUG_RE.sub("-", name).strip("-.")
    return text[:60] or "job"


def filename(job_id: int, name: str) -> str:
    return f"{job_id:06d}-{slug(name)}.json"


def new_job(
    *,
    job_id: int,
    name: str,
    cmd: list[str],
    cwd: str,
    log: str,
    env: Optional[dict[str, str]] = None,
    shell_env: Optional[dict[str, str]] = None,
    venv: Optional[str] = None,
    after: Optional[list[int]] = None,
    after_any: Optional[list[int]] = None,
    retries: int = 0,
    priority: int = 0,
    source: str = "cli",
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "id": job_id,
        "name": name,
        "cmd": list(cmd),
        "cwd": cwd,
        "env": dict(env or {}),
        "shell_env": shell_env,
        "venv": venv,
        "after": sorted(set(after or [])),
        "after_any": sorted(set(after_any or [])),
        "retries": retries,
        "priority": priority,
        "attempts": 0,
        "created_at": now_iso(),
        "started_at": None,
        "finished_at": None,
        "pid": None,
        "pid_create_time": None,
        "boot_id": None,
        "host": None,
        "supervisor": None,
        "slot": None,
        "exit_code": None,
        "signal": None,
        "log": log,
        "note": None,
        "history": [],
        "source": source,
        "rev": 0,
    }


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise InvalidJob(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def parse_bytes(data: bytes) -> dict[str, Any]:
    """Bytes of a job file -> dict, or InvalidJob with a reason a person can act on."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidJob(f"not valid UTF-8 (byte {exc.start})") from None
    try:
        obj = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise InvalidJob(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise InvalidJob("not valid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise InvalidJob(f"a job file must hold a JSON object, not {type(obj).__name__}")
    return obj


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_str_list(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise InvalidJob(f"{field!r} must be a list of strings")
    if any("\x00" in x for x in value):
        raise InvalidJob(f"{field!r} must not contain NUL characters")
    return value


def _check_env(value: Any, field: str = "env") -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidJob(f"{field!r} must be an object of strings")
    for key, val in value.items():
        if not isinstance(val, str):
            raise InvalidJob(f"{field!r} value for {key!r} must be a string, not {type(val).__name__}")
        if not key or "=" in key or "\x00" in key or "\x00" in val:
            raise InvalidJob(f"{field!r} has an invalid variable name {key!r}")
    return value


def _check_ids(value: Any, field: str) -> list[int]:
    if _is_int(value):
        value = [value]
    if not isinstance(value, list) or not all(_is_int(x) and x > 0 for x in value):
        raise InvalidJob(f"{field!r} must be a list of positive job ids")
    return sorted(set(value))


def _check_cmd(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as exc:
            raise InvalidJob(f"'cmd' cannot be split like a shell line: {exc}") from None
    cmd = _check_str_list(value, "cmd")
    if not cmd or not cmd[0]:
        raise InvalidJob("'cmd' is empty")
    return cmd


DROPPED_FIELDS = {"cmd", "cwd", "name", "env", "after", "after_any", "retries", "priority"}


def normalize_dropped(obj: dict[str, Any]) -> dict[str, Any]:
    """Check a hand-written job (`{"cmd": ...}` plus optional fields) and return its clean fields."""
    unknown = sorted(set(obj) - DROPPED_FIELDS)
    if unknown:
        raise InvalidJob(
            f"unknown field(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(DROPPED_FIELDS))}"
        )
    if "cmd" not in obj:
        raise InvalidJob("missing 'cmd' (a list of strings or a shell-like string)")
    clean: dict[str, Any] = {"cmd": _check_cmd(obj["cmd"])}
    if obj.get("cwd") is not None:
        if not isinstance(obj["cwd"], str) or not obj["cwd"].startswith("/"):
            raise InvalidJob("'cwd' must be an absolute path")
        clean["cwd"] = obj["cwd"]
    if obj.get("name") is not None:
        clean["name"] = _check_name(obj["name"])
    clean["env"] = _check_env(obj.get("env", {}))
    clean["after"] = _check_ids(obj.get("after", []), "after")
    clean["after_any"] = _check_ids(obj.get("after_any", []), "after_any")
    for field in ("retries", "priority"):
        value = obj.get(field, 0)
        if not _is_int(value) or (field == "retries" and not 0 <= value <= 100):
            raise InvalidJob(f"{field!r} must be an integer" + (" from 0 to 100" if field == "retries" else ""))
        clean[field] = value
    return clean


def _check_name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidJob("'name' must be a non-empty string")
    if len(value) > MAX_NAME_LEN or any(ord(c) < 32 for c in value):
        raise InvalidJob(f"'name' must be at most {MAX_NAME_LEN} printable characters")
    return value


REQUIRED = {
    "id": _is_int,
    "name": lambda v: isinstance(v, str) and bool(v),
    "cmd": lambda v: isinstance(v, list) and bool(v) and all(isinstance(x, str) for x in v),
    "cwd": lambda v: isinstance(v, str) and v.startswith("/"),
    "env": lambda v: isinstance(v, dict),
    "after": lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
    "log": lambda v: isinstance(v, str),
    "rev": _is_int,
}


def validate(obj: dict[str, Any], expected_id: Optional[int] = None) -> dict[str, Any]:
    """Check a gpuq job file (one with schema_version) and return it; InvalidJob otherwise."""
    version = obj.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InvalidJob(f"unknown schema_version {version!r} (this gpuq reads {SCHEMA_VERSION})")
    for field, ok in REQUIRED.items():
        if field not in obj:
            raise InvalidJob(f"missing field {field!r}")
        if not ok(obj[field]):
            raise InvalidJob(f"field {field!r} has the wrong type or value")
    _check_env(obj["env"])
    if obj.get("shell_env") is not None:
        _check_env(obj["shell_env"], "shell_env")
    if expected_id is not None and obj["id"] != expected_id:
        raise InvalidJob(f"file name says id {expected_id} but the file says {obj['id']}")
    if obj["id"] in obj["after"] or obj["id"] in obj.get("after_any", []):
        raise InvalidJob("a job cannot wait for itself")
    return obj


def display_script(cmd: list[str]) -> str:
    """The word that tells a person which script a command runs (train.py for `torchrun train.py`)."""
    for word in cmd[1:] if len(cmd) > 1 else cmd:
        if word.endswith((".py", ".sh")):
            return word.rsplit("/", 1)[-1]
    return cmd[0].rsplit("/", 1)[-1]
