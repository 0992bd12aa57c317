"""A job's newest *complete* checkpoint (`latest_checkpoint`): HF's `checkpoint-N` directories, or
what its --ckpt-glob matches; and training flags from its argv."""

# Real annotations, no future import: see test_the_everyday_commands_compile_no_source.
import glob
import json
import os
import re
from contextlib import suppress
from typing import Any, Callable, NamedTuple, Optional, Sequence, TypeVar

from gpuq.core.job import Job
from gpuq.core.times import parse_iso

# Patterns as text, compiled by `re` at first use (start-up: see core/sweep.py).
HF_DIR_RE = r"^checkpoint-(\d+)$"
HF_COMPLETE_MARKER = "trainer_state.json"
HF_INCOMPLETE_MARKER = "checkpoint-is-incomplete.txt"  # HF 5's JIT save removes it when done
MTIME_SLACK = 1.0  # seconds: file times are coarser than the ISO start time
STEP_RE = r"(?i)(?:step|checkpoint|iter|iteration|global_step)[=_-]?(\d+)"
EPOCH_RE = r"(?i)epoch[=_-]?(\d+)"
TRAILING_RE = r"(\d+)(?:\.[A-Za-z]+)*$"  # the number a name ends in, before its extensions: ck-8, w_0800.pt
OUTPUT_DIR_FLAGS = ("--output_dir", "--output-dir")
MAX_STEPS_FLAGS = ("--max_steps", "--max-steps")
RESUME_FLAGS = ("--resume_from_checkpoint", "--resume-from-checkpoint")
Number = TypeVar("Number", int, float)


class Checkpoint(NamedTuple):
    path: str  # absolute
    step: Optional[int]  # the global step when the name tells it
    epoch: Optional[int] = None


def arg_value(cmd: Sequence[str], names: Sequence[str]) -> Optional[str]:
    """The value of the last `NAME VALUE` or `NAME=VALUE` in `cmd` (argparse keeps the last)."""
    value = None
    for i, word in enumerate(cmd):
        for name in names:
            if word == name and i + 1 < len(cmd):
                value = cmd[i + 1]
            elif word.startswith(name + "="):
                value = word[len(name) + 1 :]
    return value


def start_step(job: Job) -> Optional[float]:
    """The attempt's start step: 0 from scratch, else its checkpoint's (None: unknown, as with `=True`)."""
    if job.resumed_from_step is not None:
        return float(job.resumed_from_step)
    ckpt = job.resumed_from or arg_value(job.cmd, RESUME_FLAGS)
    if not ckpt:
        return 0.0
    step = name_step(os.path.basename(str(ckpt).rstrip("/")))
    return float(step) if step is not None else None


def output_dir(cmd: Sequence[str], cwd: str) -> Optional[str]:
    """The job's --output_dir, absolute."""
    value = arg_value(cmd, OUTPUT_DIR_FLAGS)
    if not value:
        return None
    return os.path.abspath(os.path.join(cwd, os.path.expanduser(value)))


def number_arg(cmd: Sequence[str], names: Sequence[str], kind: Callable[[str], Number]) -> Optional[Number]:
    """The last of `names`' value in the argv; None unless a positive number (HF: -1 = unset)."""
    value = arg_value(cmd, names)
    try:
        number = kind(value) if value is not None else None
    except ValueError:
        return None
    return number if number and number > 0 else None


def max_steps(cmd: Sequence[str]) -> Optional[int]:
    return number_arg(cmd, MAX_STEPS_FLAGS, int)


def trainer_state(ckpt_path: str, key: str, limit: Optional[int] = None) -> Any:
    """`key` of an HF checkpoint's trainer_state.json; None when unreadable or over `limit` bytes."""
    path = os.path.join(ckpt_path, HF_COMPLETE_MARKER)
    try:
        if limit is not None and os.path.getsize(path) > limit:
            return None
        with open(path, "rb") as fh:
            return json.loads(fh.read()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def hf_checkpoints(out_dir: str) -> list[Checkpoint]:
    """Complete `checkpoint-N` directories under `out_dir`, oldest first."""
    try:
        entries = list(os.scandir(out_dir))
    except OSError:
        return []
    found = [
        Checkpoint(os.path.abspath(entry.path), int(m.group(1)))
        for entry in entries
        if (m := re.match(HF_DIR_RE, entry.name)) and entry.is_dir() and _hf_complete(entry.path)
    ]
    return sorted(found, key=lambda c: c.step or 0)


def _hf_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, HF_COMPLETE_MARKER)) and not os.path.exists(
        os.path.join(path, HF_INCOMPLETE_MARKER)
    )


def _number(regex: str, name: str) -> Optional[int]:
    found = re.findall(regex, name)
    return int(found[-1]) if found else None


def name_step(name: str) -> Optional[int]:
    """The step a checkpoint's name tells: the number after `step`, `checkpoint`, `iter`..., else the
    number it ends in (`ck-8`) when it is the name's only number: not an epoch's (`model_epoch_3.pt`),
    nor the end of a date or time (`ck-20261208-0100.pt`), which would sort the newest first."""
    step = _number(STEP_RE, name)
    if step is None and not re.search(EPOCH_RE, name) and len(re.findall(r"\d+", name)) == 1:
        step = _number(TRAILING_RE, name)
    return step


def _usable(path: str) -> bool:
    """A non-empty file, or a directory (no HF checkpoint cut short) with a non-empty file under it."""
    try:
        if os.path.isdir(path):
            if re.match(HF_DIR_RE, os.path.basename(path)) and not _hf_complete(path):
                return False
            return _holds_data(path)
        return os.path.getsize(path) > 0
    except OSError:
        return False


def _holds_data(folder: str) -> bool:
    """Whether a non-empty file lies anywhere under `folder` (stops at the first one found)."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with suppress(OSError):
                if os.path.getsize(os.path.join(root, name)) > 0:
                    return True
    return False


def mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def glob_checkpoints(pattern: str, cwd: str) -> list[Checkpoint]:
    """Usable matches of `pattern` in `cwd`, oldest first: by step number, else epoch, else mtime."""
    full = os.path.join(cwd, os.path.expanduser(pattern))
    paths = [os.path.abspath(p) for p in glob.glob(full, recursive=True) if _usable(p)]
    found = [Checkpoint(p, name_step(os.path.basename(p)), _number(EPOCH_RE, os.path.basename(p))) for p in paths]
    key: Callable[[Checkpoint], Any] = lambda c: mtime(c.path)  # noqa: E731
    if found and all(c.step is not None for c in found):
        key = lambda c: (c.step, mtime(c.path))  # noqa: E731
    elif found and all(c.epoch is not None for c in found):
        key = lambda c: (c.epoch, mtime(c.path))  # noqa: E731
    return sorted(found, key=key)


def candidates(job: Job) -> list[Checkpoint]:
    """The complete checkpoints its --ckpt-glob matches, else HF's under its --output_dir, oldest first."""
    if job.ckpt_glob:
        return glob_checkpoints(job.ckpt_glob, job.cwd)
    out = output_dir(job.cmd, job.cwd)
    return hf_checkpoints(out) if out is not None else []


def latest_checkpoint(job: Job) -> Optional[Checkpoint]:
    """The newest complete checkpoint of `job`, not an earlier run's (written before `ckpt_since`)."""
    found = candidates(job)
    since = parse_iso(job.ckpt_since)
    if since is not None:
        found = [c for c in found if written_at(c.path) >= since - MTIME_SLACK]
    return found[-1] if found else None


def written_at(path: str) -> float:
    """When a checkpoint was completed: the newest mtime of it and, for a directory, its entries."""
    newest = mtime(path)
    if os.path.isdir(path):
        with suppress(OSError), os.scandir(path) as entries:
            for entry in entries:
                with suppress(OSError):
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def base_dir(job: Job) -> Optional[str]:
    return base_of(job.cmd, job.cwd, job.ckpt_glob)


def base_of(cmd: list[str], cwd: str, ckpt_glob: Optional[str]) -> Optional[str]:
    """Where a job's checkpoints are looked for, links resolved: --ckpt-glob up to a wildcard, or --output_dir."""
    if ckpt_glob:
        pattern = os.path.join(cwd, os.path.expanduser(ckpt_glob))
        fixed = pattern[: min([pattern.find(c) for c in "*?[" if c in pattern] or [len(pattern)])]
        where = fixed if fixed.endswith(os.sep) else os.path.dirname(fixed)
    else:
        where = output_dir(cmd, cwd) or ""
    return os.path.realpath(where) if where else None


def where_looked(job: Job) -> str:
    if job.ckpt_glob:
        return f"looked for {job.ckpt_glob!r} in {job.cwd}"
    out = output_dir(job.cmd, job.cwd)
    if out is None:
        return "its command has no --output_dir and it has no --ckpt-glob"
    return f"looked for checkpoint-N with trainer_state.json in {out}"
