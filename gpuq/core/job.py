"""One job record: every field of a job file declared once, with its type, its default and its check.
A `Job` is the dict that is the file (so loading one stays one JSON parse), its fields also attributes.
"""

# Real annotations, no future import: see test_the_everyday_commands_compile_no_source.
import math
import os
from operator import itemgetter
from typing import Any, Callable, NamedTuple, Optional, Union

from gpuq.core.times import parse_iso

SCHEMA_VERSION = 1
MAX_ID = 10**15  # far beyond any real queue; keeps file names (NNNNNN-...) well under 255 bytes
MAX_GPUS = 1024
MAX_RETRIES = 100  # of --retries and --retry-oom: beyond that a job is broken, not unlucky
# The first words of each attempt's part of a job's log (run/supervisor/start.begin writes the line):
# what came before it is an earlier attempt's (engine/tracking/progress.py, core/failure.py).
ATTEMPT_HEADER = "=== gpuq: job #"
NOT_OS_TEXT = "has text that cannot be passed to a program (a lone surrogate such as \\ud800)"


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def no_nul(value: Any) -> bool:
    return isinstance(value, str) and "\x00" not in value


def no_control(value: Any) -> bool:
    """No control character (C0, DEL, C1): a name printed by `status` must not colour or retitle a terminal."""
    return isinstance(value, str) and not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in value)


def os_str(value: Any) -> bool:
    """A string the OS can take as an argument, path or variable: no NUL, and encodable (an
    escaped lone surrogate like \\ud800 is valid JSON but no byte string; \\udcXX from an
    undecodable byte in `gpuq add`'s arguments round-trips to that byte)."""
    if not no_nul(value):
        return False
    if value.isascii():  # the common case, and always encodable: no encoding needed to tell
        return True
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        return False
    return True


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _iso(value: Any) -> bool:
    try:
        parse_iso(value)
    except (ValueError, OverflowError, OSError, TypeError):
        return False
    return isinstance(value, str)


def is_number(value: Any) -> bool:
    """A finite int or float (not NaN, 1e999, true, nor an int too large for a float: 10**400)."""
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:
        return False


def _snapshot(value: Any) -> bool:
    return isinstance(value, dict) and os_str(value.get("path")) and value["path"].startswith("/")


def _sweep(value: Any) -> bool:
    if not isinstance(value, dict) or set(value) != {"id", "values"}:
        return False
    values = value["values"]
    ok_values = isinstance(values, dict) and all(isinstance(k, str) and no_nul(v) for k, v in values.items())
    return is_int(value["id"]) and 0 < value["id"] <= MAX_ID and ok_values


def _ray(value: Any) -> bool:
    """The `ray` field of a job handed to a Ray cluster (submission_id null while it waits in ray/ for
    its dependencies)."""
    if not isinstance(value, dict) or not isinstance(value.get("state"), str):
        return False
    return (
        (value.get("submission_id") is None or no_nul(value["submission_id"]))
        and isinstance(value.get("address"), str)
        and (value.get("exit_code") is None or is_int(value["exit_code"]))
        and (value.get("reason") is None or isinstance(value["reason"], str))
    )


def _slurm(value: Any) -> bool:
    """The `slurm` field of a job handed to Slurm (or being handed over: job_id still null)."""
    if not isinstance(value, dict) or not isinstance(value.get("state"), str):
        return False
    opts = value.get("cluster_opts", [])
    return (
        (value.get("job_id") is None or (is_int(value["job_id"]) and value["job_id"] > 0))
        and isinstance(opts, list)
        and all(no_nul(o) for o in opts)
        and (value.get("exit_code") is None or is_int(value["exit_code"]))
        and (value.get("reason") is None or isinstance(value["reason"], str))
    )


def is_url(value: Any) -> bool:
    """A notification URL as --notify takes it: SCHEME://..., one line, at most 4096 characters."""
    return os_str(value) and "://" in value and value.isprintable() and len(value) <= 4096


def _kind(kind: type) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, kind)


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(map(check, v))


_str, _dict, _bool = _kind(str), _kind(dict), _kind(bool)
_objects, _urls = _list_of(_dict), _list_of(is_url)
_id_list = _list_of(lambda x: is_int(x) and 0 < x <= MAX_ID)


def _count(value: Any) -> bool:
    return is_int(value) and value >= 0


def _positive(value: Any) -> bool:
    return is_int(value) and value > 0


NO_DEFAULT = object()  # the default of a field every valid job file holds
_SHARED = (type(None), bool, int, float, str)  # defaults that need no copy per job


class Field(NamedTuple):
    """One field of a job file: its default (NO_DEFAULT: none), its check and the words for it.
    `option`: `gpuq add`'s options set it (new_job's `options`); `later`: a new job lacks it,
    a change of state writes it (new_job writes every other field, in the order declared)."""

    default: Any
    check: Callable[[Any], bool]
    what: str
    option: bool = False
    later: bool = False
    name: str = ""  # set by _record, from the attribute's name

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT

    def fresh(self) -> Any:
        """The default as a new job holds it: a list or object of its own (required: None)."""
        if self.required:
            return None
        return self.default if isinstance(self.default, _SHARED) else type(self.default)(self.default)


def field(default: Any, check: Callable[[Any], bool], what: str, *, option: bool = False, later: bool = False) -> Any:
    """A Field, typed Any so that the annotation beside it is the attribute's type."""
    return Field(default, check, what, option, later)


_STR_LIST = "a non-empty list of strings without NUL, the first one non-empty"
_NULL_STR = "null or a string"
_NULL_ISO = "null or an ISO 8601 time"


class Job(dict[str, Any]):
    """A job file's fields (spool_layout.md describes each), as the dict itself and as attributes, in
    a new job file's order."""

    __slots__ = ()

    def __missing__(self, key: str) -> Any:
        """A field this (older) file lacks reads as its default; else KeyError, as in a plain dict."""
        found = FIELDS.get(key)
        if found is None or found.required:
            raise KeyError(key)
        return found.fresh()

    def __setattr__(self, name: str, value: Any) -> None:
        """`job.note = ...` writes the field into the dict; a name that is no field is refused."""
        if name not in FIELDS:
            raise AttributeError(f"a job has no field {name!r}")
        self[name] = value

    schema_version: int = field(NO_DEFAULT, lambda v: type(v) is int and v == SCHEMA_VERSION, str(SCHEMA_VERSION))
    id: int = field(NO_DEFAULT, lambda v: is_int(v) and 0 < v <= MAX_ID, f"an integer from 1 to {MAX_ID}")
    # not no_control: job files written before names were checked for control characters must load
    name: str = field(NO_DEFAULT, lambda v: no_nul(v) and bool(v), "a non-empty string")
    cmd: list[str] = field(
        NO_DEFAULT, lambda v: isinstance(v, list) and bool(v) and all(map(os_str, v)) and bool(v[0]), _STR_LIST
    )
    cwd: str = field(NO_DEFAULT, lambda v: os_str(v) and v.startswith("/"), "an absolute path")
    env: dict[str, str] = field(NO_DEFAULT, _dict, "an object of strings")
    shell_env: Optional[dict[str, str]] = field(None, _opt(_dict), "null or an object of strings")
    venv: Optional[str] = field(None, _opt(os_str), "null or a path")
    conda: Optional[str] = field(
        None, _opt(lambda v: os_str(v) and v.startswith("/")), "null or an absolute path", option=True
    )
    interpreter_from: Optional[str] = field(None, _opt(_str), _NULL_STR, option=True)
    umask: Optional[int] = field(
        None, _opt(lambda v: is_int(v) and 0 <= v <= 0o777), "null or a file mode mask (0 to 511)"
    )
    after: list[int] = field(NO_DEFAULT, _id_list, "a list of job ids")
    after_any: list[int] = field([], _id_list, "a list of job ids")
    retries: int = field(0, _count, "an integer of 0 or more")
    # --retry-oom: attempts after an out-of-memory failure, beyond --retries (core/oom.py)
    retry_oom: int = field(0, _count, "an integer of 0 or more", option=True)
    priority: int = field(0, is_int, "an integer")
    attempts: int = field(0, _count, "an integer of 0 or more")
    created_at: Optional[str] = field(None, _opt(_iso), _NULL_ISO)
    started_at: Optional[str] = field(None, _opt(_iso), _NULL_ISO)
    finished_at: Optional[str] = field(None, _opt(_iso), _NULL_ISO)
    # 0 would signal our own process group
    pid: Optional[int] = field(None, _opt(lambda v: is_int(v) and 0 < v < 2**31), "null or a process id")
    pid_create_time: Optional[float] = field(
        None, _opt(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)), "null or a number"
    )
    boot_id: Optional[str] = field(None, _opt(_str), _NULL_STR)
    host: Optional[str] = field(None, _opt(_str), _NULL_STR)
    supervisor: Optional[dict[str, Any]] = field(None, _opt(_dict), "null or an object")
    slot: Optional[str] = field(None, _opt(no_nul), _NULL_STR)
    exit_code: Optional[int] = field(None, _opt(is_int), "null or an integer")
    signal: Optional[str] = field(None, _opt(_str), _NULL_STR)
    log: str = field(NO_DEFAULT, _str, "a string")
    note: Optional[str] = field(None, _opt(_str), _NULL_STR)
    history: list[dict[str, Any]] = field([], _objects, "a list of objects")
    source: str = field("", _str, "a string")  # cli, adopt, dropped:NAME, import:sqlite (core/states.py)

    # Preemption and resume (engine/lifecycle/preempt.py; spool_layout.md section 11)
    preemptible: bool = field(False, _bool, "true or false", option=True)  # HF JIT checkpoint / GPUQ_PREEMPTIBLE=1
    urgent: Union[bool, str] = field(
        False, lambda v: isinstance(v, bool) or v == "force", 'true, false or "force"', option=True
    )
    ckpt_glob: Optional[str] = field(None, _opt(os_str), _NULL_STR, option=True)  # where its checkpoints are
    resume_arg: Optional[str] = field(None, _opt(os_str), _NULL_STR, option=True)  # e.g. "ckpt_path={ckpt}"
    checkpoint: Optional[str] = field(None, _opt(os_str), _NULL_STR, option=True)  # newest when last preempted
    preemptions: list[dict[str, Any]] = field([], _objects, "a list of objects", option=True)
    resumed_from: Optional[str] = field(None, _opt(os_str), _NULL_STR, option=True)
    resumed_from_step: Optional[int] = field(None, _opt(is_int), "null or an integer", option=True)
    auto_resume: bool = field(False, _bool, "true or false", option=True)  # preempted for an urgent job
    queue_front: bool = field(False, _bool, "true or false", option=True)  # resumed: before other pending jobs

    # GPUs (engine/schedule/placement.py; spool_layout.md section 12)
    gpu_request: int = field(
        1, lambda v: is_int(v) and 0 <= v <= MAX_GPUS, f"an integer from 0 to {MAX_GPUS}", option=True
    )
    gpu_mem_mib: Optional[int] = field(None, _opt(_positive), "null or a positive integer (MiB)", option=True)
    gpus: Optional[list[int]] = field(
        None,
        _opt(lambda v: isinstance(v, list) and all(is_int(x) and 0 <= x < 2**31 for x in v)),
        "null or a list of GPU indices",
        option=True,
    )
    # what its attempt holds of its GPUs, each --gpu-mem share as its MiB over its GPU's memory (history's GPU-hours)
    gpu_share: Optional[float] = field(None, _opt(lambda v: is_number(v) and v >= 0), "null or a number of 0 or more")

    # Host memory and CPUs it reserves while it runs (spool_layout.md section 12a)
    mem_mib: Optional[int] = field(None, _opt(_positive), "null or a positive integer (MiB)", option=True)  # --mem
    cpus: Optional[int] = field(None, _opt(_positive), "null or a positive integer", option=True)  # --cpus

    # When it ends (run/hooks.py; spool_layout.md section 13)
    notify: bool = field(False, _bool, "true or false", option=True)  # --notify: a desktop notification
    notify_urls: list[str] = field([], _urls, "a list of URLs (SCHEME://...)", option=True)
    on_finish: Optional[str] = field(None, _opt(os_str), "null or a shell command", option=True)  # --on-finish
    max_log_bytes: Optional[int] = field(None, _opt(_positive), "null or a positive number of bytes", option=True)

    # Continuing from checkpoints after a crash (engine/tracking/continuation.py; spool_layout.md section 11)
    no_resume: bool = field(False, _bool, "true or false", option=True)  # --no-resume: every attempt starts over
    ckpt_since: Optional[str] = field(None, _opt(_iso), _NULL_ISO, option=True)
    lost_steps: Optional[int] = field(
        None, _opt(lambda v: is_int(v) and v >= 0), "null or an integer of 0 or more", option=True
    )
    # Checkpoints kept by rule (engine/tracking/retention.py) and the disk guard (engine/schedule/diskguard.py)
    keep_checkpoints: Optional[Union[int, str]] = field(
        None,
        _opt(lambda v: (is_int(v) and v > 0) or v in ("best", "all")),
        'null, a positive integer, "best" or "all"',
        option=True,
    )
    min_free_bytes: Optional[int] = field(None, _opt(_positive), "null or a positive number of bytes", option=True)

    sweep: Optional[dict[str, Any]] = field(
        None, _opt(_sweep), 'null or {"id": a job id, "values": an object of strings}', option=True
    )

    # Safeguards (spool_layout.md section 15)
    time_limit: Optional[float] = field(
        None, _opt(lambda v: is_number(v) and v > 0), "null or a positive number of seconds", option=True
    )  # --time: seconds a run may take before it is stopped
    begin_at: Optional[str] = field(None, _opt(_iso), _NULL_ISO, option=True)  # --begin: not started before
    code: Optional[dict[str, Any]] = field(None, _opt(_dict), "null or an object", option=True)
    snapshot: Optional[dict[str, Any]] = field(
        None, _opt(_snapshot), 'null or {"path": an absolute path, ...}', option=True
    )

    rev: int = field(NO_DEFAULT, lambda v: is_int(v) and v >= 0, "an integer of 0 or more")

    # Written by changes of state only (core/transitions.py, engine/lifecycle/adopt.py, run/supervisor/)
    previous_exit_code: Optional[int] = field(None, _opt(is_int), "null or an integer", later=True)
    adopted: bool = field(False, _bool, "true or false", later=True)
    code_changed: Optional[str] = field(None, _opt(_str), _NULL_STR, later=True)
    code_at_start: Optional[dict[str, Any]] = field(None, _opt(_dict), "null or an object", later=True)
    reason: Optional[str] = field(None, _opt(_str), _NULL_STR, later=True)  # why its last attempt failed
    host_limits_by: Optional[str] = field(None, _opt(_str), _NULL_STR, later=True)
    oom_retries: int = field(0, _count, "an integer of 0 or more", later=True)  # GPUQ_OOM_RETRY of the next attempt
    gpu_largest: bool = field(False, _bool, "true or false", later=True)  # placed on the GPUs with the most memory
    ckpt_bytes: Optional[int] = field(None, _opt(_count), "null or a number of bytes", later=True)  # last checkpoint
    slurm: Optional[dict[str, Any]] = field(
        None, _opt(_slurm), 'null or {"job_id": null or a Slurm job id, "state": a string, ...}', later=True
    )
    ray: Optional[dict[str, Any]] = field(
        None,
        _opt(_ray),
        'null or {"submission_id": null or a string, "address": a URL, "state": a string, ...}',
        later=True,
    )


def _record(cls: type) -> dict[str, Field]:
    """The Fields declared in `cls`, in order, each replaced there by its attribute `job[name]`."""
    fields = {}
    for name, value in list(vars(cls).items()):
        if isinstance(value, Field):
            fields[name] = value._replace(name=name)
            setattr(cls, name, property(itemgetter(name), doc=value.what))
    return fields


FIELDS: dict[str, Field] = _record(Job)
