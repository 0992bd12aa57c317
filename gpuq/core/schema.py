"""The job-file schema: building, parsing and validating jobs (core/job.py declares the fields)."""

from __future__ import annotations

import json
import math
import re
import shlex
from typing import Any, Optional

from gpuq.core.errors import GpuqError
from gpuq.core.job import (
    FIELDS,
    MAX_GPUS,
    MAX_RETRIES,
    NOT_OS_TEXT,
    SCHEMA_VERSION,
    Job,
    is_int,
    is_url,
    no_control,
    os_str,
)
from gpuq.core.keep import parse_keep
from gpuq.core.states import SOURCE_CLI
from gpuq.core.times import now_iso
from gpuq.core.timespec import parse_size_bytes, parse_size_mib

MAX_NAME_LEN = 200
_UNSAFE = r"[^A-Za-z0-9._-]+"


class InvalidJob(GpuqError, ValueError):
    """A file or dict that is not a valid job; str(exc) is the reason shown to the user."""


class IncompleteJob(InvalidJob):
    """Bytes that are not (yet) a whole JSON text: a file still being written looks like this."""


def filename(job_id: int, name: str) -> str:
    """NNNNNN-NAME.json, each run of characters unsafe in a file name one "-" in NAME."""
    slug = re.sub(_UNSAFE, "-", name).strip("-.")[:60] or "job"
    return f"{job_id:06d}-{slug}.json"


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
    source: str = SOURCE_CLI,
    options: Optional[dict[str, Any]] = None,
    umask: Optional[int] = None,
) -> Job:
    """A new job: every field a new file holds, in order, at its default unless given here (or, of
    `gpuq add`'s options, in `options`)."""
    job = Job((f.name, f.fresh()) for f in FIELDS.values() if not f.later)
    job.update(
        schema_version=SCHEMA_VERSION,
        id=job_id,
        name=name,
        cmd=list(cmd),
        cwd=cwd,
        env=dict(env or {}),
        shell_env=shell_env,
        venv=venv,
        umask=umask,
        after=sorted(set(after or [])),
        after_any=sorted(set(after_any or [])),
        retries=retries,
        priority=priority,
        created_at=now_iso(),
        log=log,
        source=source,
        rev=0,
    )
    job.update((k, v) for k, v in (options or {}).items() if k in FIELDS and FIELDS[k].option)
    return job


# Every field a job file may hold; a write of any other field is a bug (spool.store.JobStore.move).
KNOWN_FIELDS = frozenset(FIELDS)
REQUIRED = tuple(name for name, field in FIELDS.items() if field.required)
# The fields whose check passes null: a null there needs no call of the check (about half of a
# job's fields are null in its file).
NULL_PASSES = frozenset(name for name, field in FIELDS.items() if field.check(None))
_ABSENT = object()


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    made = dict(pairs)
    if len(made) < len(pairs):
        keys = [key for key, _ in pairs]
        key = next(key for n, key in enumerate(keys) if key in keys[:n])
        raise InvalidJob(f"duplicate key {key!r}")
    return made


def _no_constant(word: str) -> Any:
    raise InvalidJob(f"not usable JSON: {word} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise InvalidJob(f"not usable JSON: {text[:20]} is too large a number")
    return value


# One decoder for every file (json.loads with hooks would make one, and its scanner, per file).
_DECODER = json.JSONDecoder(
    object_pairs_hook=_reject_duplicate_keys, parse_constant=_no_constant, parse_float=_finite_float
)


def parse_bytes(data: bytes) -> dict[str, Any]:
    """Bytes of a job file -> dict, or InvalidJob with a reason a person can act on."""
    try:
        text = data.decode("utf-8-sig")  # a byte order mark, as some editors write, is no part of the JSON
    except UnicodeDecodeError as exc:
        raise IncompleteJob(f"not valid UTF-8 (byte {exc.start})") from None
    try:
        obj = _DECODER.decode(text)
    except RecursionError:  # a parse cut short by depth: judged like any unparsable text
        raise IncompleteJob("not valid JSON: nested too deeply") from None
    except InvalidJob:
        raise
    except json.JSONDecodeError as exc:
        raise IncompleteJob(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError:
        raise InvalidJob("not usable JSON: a number has too many digits") from None  # over 4300 digits
    if not isinstance(obj, dict):
        raise InvalidJob(f"a job file must hold a JSON object, not {type(obj).__name__}")
    return obj


def _check_env(value: Any, field: str = "env") -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidJob(f"{field!r} must be an object of strings")
    if _plain_env(value):
        return value
    for key, val in value.items():
        if not isinstance(val, str):
            raise InvalidJob(f"{field!r} value for {key!r} must be a string, not {type(val).__name__}")
        if not key or "=" in key or "\x00" in key or "\x00" in val:
            raise InvalidJob(f"{field!r} has an invalid variable name {key!r}")
        if not (os_str(key) and os_str(val)):
            raise InvalidJob(f"{field!r} variable {key!r} {NOT_OS_TEXT}")
    return value


def _plain_env(value: dict[str, Any]) -> bool:
    """The common case at a glance: every value a string, no empty name, and all names and values
    ASCII without `=` in a name or NUL anywhere (a `shell_env` holds the whole environment of the
    shell that queued the job, and every `status` reads the queue's files)."""
    if "" in value:
        return False
    try:
        names, values = "".join(value), "".join(value.values())
    except TypeError:  # a name or value that is no string: the careful loop says which
        return False
    text = names + values
    return "=" not in names and "\x00" not in text and text.isascii()


def _check_ids(value: Any, field: str) -> list[int]:
    if is_int(value):
        value = [value]
    if not isinstance(value, list) or not all(is_int(x) and x > 0 for x in value):
        raise InvalidJob(f"{field!r} must be a list of positive job ids")
    return sorted(set(value))


def _check_cmd(value: Any) -> list[str]:
    if isinstance(value, str):  # a hand-written job file's command line
        try:
            value = shlex.split(value)
        except ValueError as exc:
            raise InvalidJob(f"'cmd' cannot be split like a shell line: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise InvalidJob("'cmd' must be a list of strings")
    if any("\x00" in x for x in value):
        raise InvalidJob("'cmd' must not contain NUL characters")
    if not all(map(os_str, value)):
        raise InvalidJob(f"'cmd' {NOT_OS_TEXT}")
    if not value or not value[0]:
        raise InvalidJob("'cmd' is empty")
    return value


DROPPED_FIELDS = {"cmd", "cwd", "name", "env", "after", "after_any", "retries", "priority", "gpus", "gpu_mem", "conda"}
DROPPED_FIELDS |= {"mem", "cpus", "notify_urls"}  # --mem/--cpus; --notify URL (run/notify/)
# core/oom.py; core/keep.py with where the checkpoints are; the disk guard
DROPPED_FIELDS |= {"retry_oom", "keep_checkpoints", "ckpt_glob", "min_free"}


def normalize_dropped(obj: dict[str, Any]) -> dict[str, Any]:
    """Check a hand-written job (`{"cmd": ...}` plus optional fields) and return its clean fields."""
    unknown = sorted(set(obj) - DROPPED_FIELDS)
    if unknown:
        fields = "field" if len(unknown) == 1 else "fields"
        raise InvalidJob(
            f"unknown {fields} {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(DROPPED_FIELDS))}"
        )
    if "cmd" not in obj:
        raise InvalidJob("missing 'cmd' (a list of strings or a shell-like string)")
    clean: dict[str, Any] = {"cmd": _check_cmd(obj["cmd"])}
    # conda: a prefix, as a file has no shell whose environments a name would be looked up in
    for key, what in (("cwd", "an absolute path"), ("conda", "the absolute path of a conda environment")):
        path = obj.get(key)
        if path is not None:
            if not os_str(path) or not path.startswith("/") or len(path) > 4096:
                raise InvalidJob(f"'{key}' must be {what}")
            clean[key] = path
    if obj.get("name") is not None:
        clean["name"] = check_name(obj["name"])
    clean["env"] = _check_env(obj.get("env", {}))
    clean["after"] = _check_ids(obj.get("after", []), "after")
    clean["after_any"] = _check_ids(obj.get("after_any", []), "after_any")
    for field in ("retries", "priority"):
        value = obj.get(field, 0)
        if not is_int(value) or (field == "retries" and not 0 <= value <= MAX_RETRIES):
            raise InvalidJob(
                f"{field!r} must be an integer" + (f" from 0 to {MAX_RETRIES}" if field == "retries" else "")
            )
        clean[field] = value
    gpus = obj.get("gpus", 1)  # how many; 0 is a CPU job
    if not is_int(gpus) or not 0 <= gpus <= MAX_GPUS:
        raise InvalidJob(f"'gpus' must be how many GPUs the job needs, 0 to {MAX_GPUS}")
    clean["gpu_request"] = gpus
    gpu_mem = _dropped_size(obj, "gpu_mem", 'a size such as "20G" or a number of MiB')
    if gpu_mem is not None:
        if gpus == 0:
            raise InvalidJob("'gpu_mem' needs 'gpus' of 1 or more ('gpus': 0 is a CPU job)")
        clean["gpu_mem_mib"] = gpu_mem
    mem = _dropped_size(obj, "mem", 'a size of host memory such as "32G" or a number of MiB')
    if mem is not None:  # absent or null: the job reserves none
        clean["mem_mib"] = mem
    cpus = obj.get("cpus")
    if cpus is not None:
        if not is_int(cpus) or cpus < 1:
            raise InvalidJob("'cpus' must be how many CPUs the job needs: a whole number of 1 or more")
        clean["cpus"] = cpus
    urls = obj.get("notify_urls", [])
    if not isinstance(urls, list) or not all(map(is_url, urls)):
        raise InvalidJob("'notify_urls' must be a list of URLs such as \"ntfy://my-topic\"")
    clean["notify_urls"] = urls
    clean.update(_dropped_waste_rules(obj))
    return clean


def _dropped_waste_rules(obj: dict[str, Any]) -> dict[str, Any]:
    """`--retry-oom`, `--keep-checkpoints` (with `--ckpt-glob`) and `--min-free` as a dropped file
    says them."""
    clean: dict[str, Any] = {}
    retry_oom = obj.get("retry_oom", 0)
    if not is_int(retry_oom) or not 0 <= retry_oom <= MAX_RETRIES:
        raise InvalidJob(f"'retry_oom' must be an integer from 0 to {MAX_RETRIES} (retries after out-of-memory)")
    clean["retry_oom"] = retry_oom
    keep = obj.get("keep_checkpoints")
    if keep is not None:  # absent or null: the config file's rule, else every checkpoint kept
        try:
            clean["keep_checkpoints"] = parse_keep(keep)
        except ValueError as exc:
            raise InvalidJob(f"'keep_checkpoints': {exc}") from None
    pattern = obj.get("ckpt_glob")
    if pattern is not None:  # relative to its cwd, as `--ckpt-glob` is
        if not isinstance(pattern, str) or not pattern.strip() or not os_str(pattern) or len(pattern) > 4096:
            raise InvalidJob("'ckpt_glob' must be where its checkpoints are, such as \"ckpts/step_*\"")
        clean["ckpt_glob"] = pattern
    min_free = obj.get("min_free")
    if isinstance(min_free, str) and min_free.strip()[-1:].isalpha():  # "50G", "500K": a unit, bytes exact
        try:
            clean["min_free_bytes"] = parse_size_bytes(min_free, "'min_free'")
        except ValueError:
            forms = '"50G", "500M" or MiB as a number'
            raise InvalidJob(f"'min_free': cannot read {min_free!r} as a size; use {forms}") from None
    else:  # a bare number is MiB, as every size in a job file
        mib = _dropped_size(obj, "min_free", 'a size of free disk space such as "50G" or a number of MiB')
        if mib is not None:
            clean["min_free_bytes"] = mib << 20
    return clean


def _dropped_size(obj: dict[str, Any], key: str, what: str) -> Optional[int]:
    """A dropped file's size field in MiB: "20G", or MiB as a positive number; None when absent."""
    value = obj.get(key)
    if value is None:
        return None
    if is_int(value) and value > 0:
        return value
    if not isinstance(value, str):
        raise InvalidJob(f"'{key}' must be {what}")
    try:
        return parse_size_mib(value, f"'{key}'")
    except ValueError as exc:
        raise InvalidJob(str(exc)) from None


def check_name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidJob("'name' must be a non-empty string")
    if len(value) > MAX_NAME_LEN:
        raise InvalidJob(f"'name' must be at most {MAX_NAME_LEN} characters, not {len(value)}")
    if not no_control(value):
        raise InvalidJob("'name' must be printable: it holds a control character")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise InvalidJob("'name' must be printable: it holds a lone surrogate, which no terminal can print")
    return value


def validate(obj: dict[str, Any], expected_id: Optional[int] = None) -> Job:
    """Check a gpuq job file (one with schema_version) and return it as a Job; InvalidJob otherwise."""
    _check_version(obj)
    # Every field some part of gpuq reads is checked: a file that passes cannot crash the scheduler,
    # the supervisor or `status`.
    for name, field in FIELDS.items():
        value = obj.get(name, _ABSENT)
        if value is None and name in NULL_PASSES:
            continue
        if value is _ABSENT:
            if field.required:
                raise InvalidJob(f"missing field {name!r}")
        elif not field.check(value):
            raise InvalidJob(f"field {name!r} must be {field.what}, not {_shown(value)}")
    _check_env(obj["env"])
    if obj.get("shell_env") is not None:
        _check_env(obj["shell_env"], "shell_env")
    if expected_id is not None:
        _check_id(obj, expected_id)
    if obj["id"] in obj["after"] or obj["id"] in obj.get("after_any", []):
        raise InvalidJob("a job cannot wait for itself")
    return obj if type(obj) is Job else Job(obj)


def validate_fields(obj: dict[str, Any], names: tuple[str, ...], expected_id: int) -> Job:
    """validate() of the fields `names` alone (every required field must still be there), for a
    reader that reads no other field: a finished job's row reads neither its environment nor what
    it waited for."""
    _check_version(obj)
    for required in REQUIRED:
        if required not in obj:
            raise InvalidJob(f"missing field {required!r}")
    for name in names:
        field = FIELDS[name]
        if name in obj and not field.check(obj[name]):
            raise InvalidJob(f"field {name!r} must be {field.what}, not {_shown(obj[name])}")
    _check_id(obj, expected_id)
    return Job(obj)


def _check_version(obj: dict[str, Any]) -> None:
    version = obj.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:  # `true` and 1.0 compare equal to 1
        raise InvalidJob(f"unknown schema_version {version!r} (this gpuq reads {SCHEMA_VERSION})")


def _check_id(obj: dict[str, Any], expected_id: int) -> None:
    if obj["id"] != expected_id:
        raise InvalidJob(f"file name says id {expected_id} but the file says {obj['id']}")


def _shown(value: Any) -> str:
    """A short description of a bad value for an error message."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except ValueError:
        text = ""
    return text if 0 < len(text) <= 40 else f"a {type(value).__name__}"


DEFAULT_JOB_UMASK = 0o022  # the umask of a hand-dropped job (its `umask` is null)


def display_script(cmd: list[str]) -> str:
    """The word that tells a person which script a command runs (train.py for `torchrun train.py`),
    control characters written as escapes (`\\x1b`): `status` prints it to a terminal."""
    word = next((w for w in (cmd[1:] if len(cmd) > 1 else cmd) if w.endswith((".py", ".sh"))), cmd[0])
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in word.rsplit("/", 1)[-1])
