"""The job-file schema: building, parsing and validating job dictionaries.

A job is a plain dict that round-trips through JSON; spool_layout.md documents every field, and a
test compares that table with REQUIRED and OPTIONAL here. This module knows what a valid job looks
like; it never touches the filesystem.
"""

from __future__ import annotations

import math
import os

from gpuq.core import jsontext
from gpuq.core.errors import GpuqError
from gpuq.core.states import SOURCE_CLI
from gpuq.core.times import now_iso, parse_iso
from gpuq.core.timespec import parse_size_mib

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional

SCHEMA_VERSION = 1
MAX_NAME_LEN = 200
_SLUG_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


class InvalidJob(GpuqError, ValueError):
    """A file or dict that is not a valid job; str(exc) is the reason shown to the user."""


class IncompleteJob(InvalidJob):
    """Bytes that are not (yet) a whole JSON text: a file still being written looks like this."""


def slug(name: str) -> str:
    """The part of a file name that shows the job's name: safe characters only."""
    if not _SLUG_CHARS.issuperset(name):  # each run of other characters becomes one "-"
        # (by hand rather than re.sub: importing `re` would cost every `gpuq add` about 8 ms)
        kept = [c if c in _SLUG_CHARS else "\0" for c in name]
        name = "-".join(filter(None, "".join(kept).split("\0")))
    text = name.strip("-.")
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
    source: str = SOURCE_CLI,
    options: Optional[dict[str, Any]] = None,
    umask: Optional[int] = None,
) -> dict[str, Any]:
    """A new job dict. `options` sets fields of OPTION_DEFAULTS (see there)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "id": job_id,
        "name": name,
        "cmd": list(cmd),
        "cwd": cwd,
        "env": dict(env or {}),
        "shell_env": shell_env,
        "venv": venv,
        "umask": umask,
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
        **{k: list(v) if isinstance(v, list) else v for k, v in OPTION_DEFAULTS.items()},
        **{k: v for k, v in (options or {}).items() if k in OPTION_DEFAULTS},
        "rev": 0,
    }


# Preemption and resume fields (engine/lifecycle/preempt.py; spool_layout.md section 11). Job files
# written before they existed lack them: read them with .get().
PREEMPT_DEFAULTS: dict[str, Any] = {
    "preemptible": False,  # added with --preemptible: HF JIT checkpoint flag / GPUQ_PREEMPTIBLE=1
    "urgent": False,  # --urgent, or "force" (--urgent=force): starts first, preempting if needed (engine/victims)
    "ckpt_glob": None,  # --ckpt-glob: where this job's checkpoints are (else HF checkpoint-N)
    "resume_arg": None,  # --resume-arg: how to pass a checkpoint, e.g. "ckpt_path={ckpt}"
    "checkpoint": None,  # newest complete checkpoint found when it was last preempted
    "preemptions": [],  # one record per preemption: at, by, exit_code, checkpoint(_step), last_step, lost_steps
    "resumed_from": None,  # the checkpoint its current command resumes from (None: from scratch)
    "resumed_from_step": None,  # that checkpoint's global step, when its name tells it
    "auto_resume": False,  # preempted for an urgent job: the worker resumes it by itself
    "queue_front": False,  # resumed: goes before other pending jobs (urgent ones excepted)
}
# GPU fields (engine/schedule/placement.py; spool_layout.md section 12).
GPU_DEFAULTS: dict[str, Any] = {
    "gpu_request": 1,  # --gpus N: how many GPUs it needs; 0 is a CPU job
    "gpu_mem_mib": None,  # --gpu-mem: MiB it needs on each GPU, shared with others; None: whole GPUs
    "gpus": None,  # the GPU indices it holds while it runs ([] for a CPU job; None: no GPUs known)
}
# What happens when the job ends (run/hooks.py; spool_layout.md section 13).
HOOK_DEFAULTS: dict[str, Any] = {
    "notify": False,  # --notify: a desktop notification
    "on_finish": None,  # --on-finish CMD: a shell command run with the job's id, state... in its environment
    "max_log_bytes": None,  # --max-log-size: its log keeps its head and newest tail within this (run/logcap.py)
}
# Continuing from checkpoints after a crash (engine/tracking/continuation.py; spool_layout.md section 11).
CONTINUE_DEFAULTS: dict[str, Any] = {
    "no_resume": False,  # --no-resume: its checkpoints are never reused; every attempt starts over
    "ckpt_since": None,  # when this run began: checkpoints completed before are an earlier run's
    "lost_steps": None,  # steps the interruption before the current attempt cost (done - checkpoint)
}
# Safeguards (issue 17; spool_layout.md section 15).
SAFEGUARD_DEFAULTS: dict[str, Any] = {
    "time_limit": None,  # --time: seconds a run may take before it is stopped
    "begin_at": None,  # --begin: it does not start before this ISO time
    "code": None,  # the git commit, branch, dirty flag and diff hash of its directory when queued
    "snapshot": None,  # --snapshot: the copy of its repository it runs ({path, files, bytes, repo})
}
# A job of a sweep (`gpuq add --sweep lr=1e-4,3e-4`): {"id": the sweep's first job id, "values": {"lr": "1e-4"}}
SWEEP_DEFAULTS: dict[str, Any] = {"sweep": None}
# Fields `gpuq add`'s options set when a job is queued; absent from older files: read with .get().
OPTION_DEFAULTS: dict[str, Any] = {
    **PREEMPT_DEFAULTS,
    **GPU_DEFAULTS,
    **HOOK_DEFAULTS,
    **CONTINUE_DEFAULTS,
    **SWEEP_DEFAULTS,
    **SAFEGUARD_DEFAULTS,
}


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    made = dict(pairs)  # in C; a key given twice shows as fewer keys
    if len(made) == len(pairs):
        return made
    seen: set[str] = set()
    for key, _value in pairs:
        if key in seen:
            raise InvalidJob(f"duplicate key {key!r}")
        seen.add(key)
    return made  # not reached


def _no_constant(word: str) -> Any:
    raise InvalidJob(f"not usable JSON: {word} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise InvalidJob(f"not usable JSON: {text[:20]} is too large a number")
    return value


def parse_bytes(data: bytes) -> dict[str, Any]:
    """Bytes of a job file -> dict, or InvalidJob with a reason a person can act on."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IncompleteJob(f"not valid UTF-8 (byte {exc.start})") from None
    try:
        obj = jsontext.loads(
            text, object_pairs_hook=_reject_duplicate_keys, parse_constant=_no_constant, parse_float=_finite_float
        )
    except RecursionError:  # a parse cut short by depth: judged like any unparsable text
        raise IncompleteJob("not valid JSON: nested too deeply") from None
    except InvalidJob:
        raise
    except ValueError as exc:
        from json import JSONDecodeError  # jsontext raised json's own error, which imported json

        if isinstance(exc, JSONDecodeError):
            raise IncompleteJob(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        raise InvalidJob("not usable JSON: a number has too many digits") from None  # over 4300 digits
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
    if not all(map(_os_str, value)):
        raise InvalidJob(f"{field!r} {NOT_OS_TEXT}")
    return value


def _check_env(value: Any, field: str = "env") -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidJob(f"{field!r} must be an object of strings")
    if _env_ok(value):
        return value
    for key, val in value.items():  # something is wrong: find it, to say which variable
        if not isinstance(val, str):
            raise InvalidJob(f"{field!r} value for {key!r} must be a string, not {type(val).__name__}")
        if not key or "=" in key or "\x00" in key or "\x00" in val:
            raise InvalidJob(f"{field!r} has an invalid variable name {key!r}")
        if not (_os_str(key) and _os_str(val)):
            raise InvalidJob(f"{field!r} variable {key!r} {NOT_OS_TEXT}")
    return value


def _env_ok(env: dict[str, Any]) -> bool:
    """All of _check_env's rules at once, for the usual valid environment: a job file holds the
    shell's fifty-odd variables, and `gpuq status -a` may read 100,000 files, so one join and one
    encode instead of two checks per variable. Python never merges two lone surrogates into a pair,
    so the joined text encodes exactly when every part does."""
    if "" in env:
        return False
    try:
        keys, texts = "".join(env), "".join(env.values())
    except TypeError:  # a value that is not a string
        return False
    if "=" in keys or "\x00" in keys or "\x00" in texts:
        return False
    try:
        os.fsencode(keys + texts)
    except UnicodeEncodeError:
        return False
    return True


def _check_ids(value: Any, field: str) -> list[int]:
    if _is_int(value):
        value = [value]
    if not isinstance(value, list) or not all(_is_int(x) and x > 0 for x in value):
        raise InvalidJob(f"{field!r} must be a list of positive job ids")
    return sorted(set(value))


def _check_cmd(value: Any) -> list[str]:
    if isinstance(value, str):  # a hand-written job file's command line (shlex: not on status's path)
        import shlex

        try:
            value = shlex.split(value)
        except ValueError as exc:
            raise InvalidJob(f"'cmd' cannot be split like a shell line: {exc}") from None
    cmd = _check_str_list(value, "cmd")
    if not cmd or not cmd[0]:
        raise InvalidJob("'cmd' is empty")
    return cmd


DROPPED_FIELDS = {"cmd", "cwd", "name", "env", "after", "after_any", "retries", "priority", "gpus", "gpu_mem"}
MAX_GPUS = 1024


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
        if not _os_str(obj["cwd"]) or not obj["cwd"].startswith("/") or len(obj["cwd"]) > 4096:
            raise InvalidJob("'cwd' must be an absolute path")
        clean["cwd"] = obj["cwd"]
    if obj.get("name") is not None:
        clean["name"] = check_name(obj["name"])
    clean["env"] = _check_env(obj.get("env", {}))
    clean["after"] = _check_ids(obj.get("after", []), "after")
    clean["after_any"] = _check_ids(obj.get("after_any", []), "after_any")
    for field in ("retries", "priority"):
        value = obj.get(field, 0)
        if not _is_int(value) or (field == "retries" and not 0 <= value <= 100):
            raise InvalidJob(f"{field!r} must be an integer" + (" from 0 to 100" if field == "retries" else ""))
        clean[field] = value
    clean.update(_dropped_gpu_request(obj))
    return clean


def _dropped_gpu_request(obj: dict[str, Any]) -> dict[str, Any]:
    """`gpus` (how many, default 1; 0 is a CPU job) and `gpu_mem` ("20G", or MiB as a number)."""
    out: dict[str, Any] = {}
    gpus = obj.get("gpus", 1)
    if not _is_int(gpus) or not 0 <= gpus <= MAX_GPUS:
        raise InvalidJob(f"'gpus' must be how many GPUs the job needs, 0 to {MAX_GPUS}")
    out["gpu_request"] = gpus
    mem = obj.get("gpu_mem")
    if mem is not None:
        if _is_int(mem) and mem > 0:
            out["gpu_mem_mib"] = mem
        elif isinstance(mem, str):
            try:
                out["gpu_mem_mib"] = parse_size_mib(mem, "'gpu_mem'")
            except ValueError as exc:
                raise InvalidJob(str(exc)) from None
        else:
            raise InvalidJob("'gpu_mem' must be a size such as \"20G\" or a number of MiB")
        if gpus == 0:
            raise InvalidJob("'gpu_mem' needs 'gpus' of 1 or more ('gpus': 0 is a CPU job)")
    return out


def check_name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidJob("'name' must be a non-empty string")
    if len(value) > MAX_NAME_LEN or any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise InvalidJob(f"'name' must be at most {MAX_NAME_LEN} printable characters")
    return value


MAX_ID = 10**15  # far beyond any real queue; keeps file names (NNNNNN-...) well under 255 bytes


def _no_nul(value: Any) -> bool:
    return isinstance(value, str) and "\x00" not in value


NOT_OS_TEXT = "has text that cannot be passed to a program (a lone surrogate such as \\ud800)"


def _os_str(value: Any) -> bool:
    """A string the OS can take as an argument, path or variable: no NUL, and encodable (an
    escaped lone surrogate like \\ud800 is valid JSON but no byte string; \\udcXX from an
    undecodable byte in `gpuq add`'s arguments round-trips to that byte)."""
    if not _no_nul(value):
        return False
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        return False
    return True


def _opt(check: Any) -> Any:
    return lambda v: v is None or check(v)


def _iso(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        parse_iso(value)
    except (ValueError, OverflowError, OSError):
        return False
    return True


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _snapshot(value: Any) -> bool:
    return isinstance(value, dict) and _os_str(value.get("path")) and value["path"].startswith("/")


def _sweep(value: Any) -> bool:
    if not isinstance(value, dict) or set(value) != {"id", "values"}:
        return False
    values = value["values"]
    ok_values = isinstance(values, dict) and all(isinstance(k, str) and _no_nul(v) for k, v in values.items())
    return _is_int(value["id"]) and 0 < value["id"] <= MAX_ID and ok_values


def _id_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(x) and 0 < x <= MAX_ID for x in value)


def _slurm(value: Any) -> bool:
    """The `slurm` field of a job handed to Slurm (or being handed over: job_id still null)."""
    if not isinstance(value, dict) or not isinstance(value.get("state"), str):
        return False
    opts = value.get("cluster_opts", [])
    return (
        (value.get("job_id") is None or (_is_int(value["job_id"]) and value["job_id"] > 0))
        and isinstance(opts, list)
        and all(_no_nul(o) for o in opts)
        and (value.get("exit_code") is None or _is_int(value["exit_code"]))
        and (value.get("reason") is None or isinstance(value["reason"], str))
    )


_STR_LIST = "a non-empty list of strings without NUL, the first one non-empty"
# field -> (check, what it must be). Every field some part of gpuq reads from a job file is here,
# so that a file that passes validate() cannot crash the scheduler, the supervisor or `status`.
REQUIRED: dict[str, tuple[Any, str]] = {
    "id": (lambda v: _is_int(v) and 0 < v <= MAX_ID, f"an integer from 1 to {MAX_ID}"),
    "name": (lambda v: _no_nul(v) and bool(v), "a non-empty string"),
    "cmd": (lambda v: isinstance(v, list) and bool(v) and all(map(_os_str, v)) and bool(v[0]), _STR_LIST),
    "cwd": (lambda v: _os_str(v) and v.startswith("/"), "an absolute path"),
    "env": (lambda v: isinstance(v, dict), "an object of strings"),
    "after": (_id_list, "a list of job ids"),
    "log": (lambda v: isinstance(v, str), "a string"),
    "rev": (lambda v: _is_int(v) and v >= 0, "an integer of 0 or more"),
}
OPTIONAL: dict[str, tuple[Any, str]] = {
    "after_any": (_id_list, "a list of job ids"),
    "shell_env": (_opt(lambda v: isinstance(v, dict)), "null or an object of strings"),
    "venv": (_opt(_os_str), "null or a path"),
    "retries": (lambda v: _is_int(v) and v >= 0, "an integer of 0 or more"),
    "priority": (_is_int, "an integer"),
    "attempts": (lambda v: _is_int(v) and v >= 0, "an integer of 0 or more"),
    "created_at": (_opt(_iso), "null or an ISO 8601 time"),
    "started_at": (_opt(_iso), "null or an ISO 8601 time"),
    "finished_at": (_opt(_iso), "null or an ISO 8601 time"),
    "pid": (_opt(lambda v: _is_int(v) and 0 < v < 2**31), "null or a process id"),  # 0 would signal our own group
    "pid_create_time": (_opt(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)), "null or a number"),
    "boot_id": (_opt(lambda v: isinstance(v, str)), "null or a string"),
    "host": (_opt(lambda v: isinstance(v, str)), "null or a string"),
    "supervisor": (_opt(lambda v: isinstance(v, dict)), "null or an object"),
    "slot": (_opt(_no_nul), "null or a string"),
    "exit_code": (_opt(_is_int), "null or an integer"),
    "previous_exit_code": (_opt(_is_int), "null or an integer"),
    "signal": (_opt(lambda v: isinstance(v, str)), "null or a string"),
    "note": (_opt(lambda v: isinstance(v, str)), "null or a string"),
    "history": (lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v), "a list of objects"),
    "source": (lambda v: isinstance(v, str), "a string"),
    "adopted": (lambda v: isinstance(v, bool), "true or false"),
    "umask": (_opt(lambda v: _is_int(v) and 0 <= v <= 0o777), "null or a file mode mask (0 to 511)"),
    # the preemption fields (PREEMPT_DEFAULTS), typed as preempt.py writes them
    **{f: (lambda v: isinstance(v, bool), "true or false") for f in ("preemptible", "auto_resume", "queue_front")},
    "urgent": (lambda v: isinstance(v, bool) or v == "force", 'true, false or "force"'),
    **{f: (_opt(_os_str), "null or a string") for f in ("ckpt_glob", "resume_arg", "checkpoint", "resumed_from")},
    "resumed_from_step": (_opt(_is_int), "null or an integer"),
    "no_resume": (lambda v: isinstance(v, bool), "true or false"),
    "time_limit": (_opt(lambda v: _number(v) and v > 0), "null or a positive number of seconds"),
    "begin_at": (_opt(_iso), "null or an ISO 8601 time"),
    "code": (_opt(lambda v: isinstance(v, dict)), "null or an object"),
    "code_changed": (_opt(lambda v: isinstance(v, str)), "null or a string"),
    "code_at_start": (_opt(lambda v: isinstance(v, dict)), "null or an object"),
    "snapshot": (_opt(_snapshot), 'null or {"path": an absolute path, ...}'),
    "reason": (_opt(lambda v: isinstance(v, str)), "null or a string"),
    "sweep": (_opt(_sweep), 'null or {"id": a job id, "values": an object of strings}'),
    "ckpt_since": (_opt(_iso), "null or an ISO 8601 time"),
    "lost_steps": (_opt(lambda v: _is_int(v) and v >= 0), "null or an integer of 0 or more"),
    "notify": (lambda v: isinstance(v, bool), "true or false"),
    "max_log_bytes": (_opt(lambda v: _is_int(v) and v > 0), "null or a positive number of bytes"),
    "on_finish": (_opt(_os_str), "null or a shell command"),
    "gpu_request": (lambda v: _is_int(v) and 0 <= v <= MAX_GPUS, f"an integer from 0 to {MAX_GPUS}"),
    "gpu_mem_mib": (_opt(lambda v: _is_int(v) and v > 0), "null or a positive integer (MiB)"),
    "gpus": (
        _opt(lambda v: isinstance(v, list) and all(_is_int(x) and 0 <= x < 2**31 for x in v)),
        "null or a list of GPU indices",
    ),
    "preemptions": (lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v), "a list of objects"),
    "slurm": (_opt(_slurm), 'null or {"job_id": null or a Slurm job id, "state": a string, ...}'),
}


# Every field a job file may hold; a write of any other field is a bug (spool.store.JobStore.move).
KNOWN_FIELDS = frozenset(REQUIRED) | frozenset(OPTIONAL) | {"schema_version"}


def validate(obj: dict[str, Any], expected_id: Optional[int] = None) -> dict[str, Any]:
    """Check a gpuq job file (one with schema_version) and return it; InvalidJob otherwise."""
    version = obj.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:  # `true` and 1.0 compare equal to 1
        raise InvalidJob(f"unknown schema_version {version!r} (this gpuq reads {SCHEMA_VERSION})")
    for field, (ok, what) in REQUIRED.items():
        if field not in obj:
            raise InvalidJob(f"missing field {field!r}")
        if not ok(obj[field]):
            raise InvalidJob(f"field {field!r} must be {what}, not {_shown(obj[field])}")
    for field, (ok, what) in OPTIONAL.items():
        if field in obj and not ok(obj[field]):
            raise InvalidJob(f"field {field!r} must be {what}, not {_shown(obj[field])}")
    _check_env(obj["env"])
    if obj.get("shell_env") is not None:
        _check_env(obj["shell_env"], "shell_env")
    if expected_id is not None and obj["id"] != expected_id:
        raise InvalidJob(f"file name says id {expected_id} but the file says {obj['id']}")
    if obj["id"] in obj["after"] or obj["id"] in obj.get("after_any", []):
        raise InvalidJob("a job cannot wait for itself")
    return obj


def _shown(value: Any) -> str:
    """A short description of a bad value for an error message."""
    try:
        text = jsontext.dumps(value, ensure_ascii=True)
    except ValueError:
        text = ""
    return text if 0 < len(text) <= 40 else f"a {type(value).__name__}"


DEFAULT_JOB_UMASK = 0o022  # the umask of a hand-dropped job (its `umask` is null)


def display_script(cmd: list[str]) -> str:
    """The word that tells a person which script a command runs (train.py for `torchrun train.py`)."""
    for word in cmd[1:] if len(cmd) > 1 else cmd:
        if word.endswith((".py", ".sh")):
            return word.rsplit("/", 1)[-1]
    return cmd[0].rsplit("/", 1)[-1]
