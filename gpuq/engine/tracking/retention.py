"""Checkpoints kept by rule (`--keep-checkpoints N|best`): a job's older complete checkpoints removed
so that the next save does not fill the disk. What may go is proved, never guessed: checkpoints are
ordered by the step number in their names (sorting names as text once removed the newest), and one
without a number is never removed.

Never removed: the newest complete checkpoint; one still being written (an HF directory without
trainer_state.json or with its incomplete marker; a --ckpt-glob match empty or changed in the last
QUIET_SECONDS); the one resumed from until a newer complete one exists; an earlier run's (before
`ckpt_since`); a symbolic link, or anything outside the checkpoints' directory, links resolved.
"""

from __future__ import annotations

import os
import shutil
import time
from contextlib import suppress
from typing import NamedTuple, Optional

from gpuq.core.job import Job
from gpuq.core.keep import ALL, BEST, Keep
from gpuq.core.times import parse_iso
from gpuq.engine.tracking import checkpoints
from gpuq.engine.tracking.checkpoints import Checkpoint

QUIET_SECONDS = 2.0  # a --ckpt-glob match changed more recently than this may still be being written


class Removed(NamedTuple):
    path: str
    step: int
    bytes: int


def removable(job: Job, keep: Keep, now: Optional[float] = None) -> list[Checkpoint]:
    """The complete checkpoints `keep` lets go of, oldest first (none when any doubt remains)."""
    now = time.time() if now is None else now
    base = checkpoints.base_dir(job)
    if base is None or keep == ALL:
        return []
    found = [c for c in checkpoints.candidates(job) if c.step is not None]
    since = parse_iso(job.ckpt_since)
    if since is not None:  # an earlier run's checkpoints in the same directory are not this job's
        found = [c for c in found if checkpoints.written_at(c.path) >= since - checkpoints.MTIME_SLACK]
    if job.ckpt_glob:  # no completeness marker: a match still changing may be being written
        found = [c for c in found if now - checkpoints.written_at(c.path) >= QUIET_SECONDS]
    found.sort(key=lambda c: c.step or 0)
    if len(found) < 2:
        return []
    newest = found[-1]
    if keep == BEST:
        best = _best(newest.path)
        if best is None:
            return []  # no metric recorded: which one is best cannot be told, so none goes
        kept = {newest.path, best}
    else:
        kept = {c.path for c in found[-int(keep) :]}
    resumed = job.resumed_from and os.path.abspath(job.resumed_from.rstrip("/"))
    out = []
    for ckpt in found[:-1]:
        if ckpt.path in kept or (resumed and ckpt.path == resumed and (ckpt.step or 0) >= (newest.step or 0)):
            continue
        if _inside(ckpt.path, base):
            out.append(ckpt)
    return out


def remove(job: Job, keep: Keep, now: Optional[float] = None) -> list[Removed]:
    """Remove what `removable` allows; each removal as done (a failed one is left out)."""
    done = []
    for ckpt in removable(job, keep, now):
        size = tree_bytes(ckpt.path)
        try:
            if os.path.isdir(ckpt.path) and not os.path.islink(ckpt.path):
                shutil.rmtree(ckpt.path)  # removes links inside it, never what they point to
            else:
                os.unlink(ckpt.path)
        except OSError:
            continue
        done.append(Removed(ckpt.path, ckpt.step or 0, size))
    return done


def said(removed: list[Removed], keep: Keep) -> str:
    """The job log's line for what was removed."""
    names = ", ".join(os.path.basename(r.path) for r in removed)
    freed = sum(r.bytes for r in removed)
    rule = "the newest and the best" if keep == BEST else f"the newest {keep}"
    return f"removed {names} ({freed / (1 << 20):.1f} MiB): --keep-checkpoints {keep} keeps {rule}"


def newest_bytes(job: Job) -> Optional[int]:
    """The size of its newest complete checkpoint of this run (the disk guard's measure), or None."""
    newest = checkpoints.latest_checkpoint(job)
    return tree_bytes(newest.path) if newest is not None else None


def tree_bytes(path: str) -> int:
    """Bytes of a file, or of a directory's files, links not followed."""
    try:
        if not os.path.isdir(path) or os.path.islink(path):
            return os.lstat(path).st_size
    except OSError:
        return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _inside(path: str, base: str) -> bool:
    """Not a link itself, and within `base` once every link on its way is resolved."""
    if os.path.islink(path):
        return False
    real = os.path.realpath(path)
    return real != base and real.startswith(base.rstrip(os.sep) + os.sep)


def _best(newest: str) -> Optional[str]:
    """The newest checkpoint's `best_model_checkpoint` (HF Trainer's by its metric), absolute, or None."""
    best = checkpoints.trainer_state(newest, "best_model_checkpoint")
    if not isinstance(best, str) or not best:
        return None
    # HF records it as the trainer saw it (often relative to its cwd): the name in the same directory
    return os.path.join(os.path.dirname(newest), os.path.basename(best.rstrip("/")))
