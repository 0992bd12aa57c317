"""A running job's checkpoints kept by its rule (engine/tracking/retention.py): looked at every
GPUQ_CKPT_KEEP_SECONDS while it runs, as a sampler around the others of the wait, and once more when
it ends; each removal said in the job's log. The rule: its `--keep-checkpoints`, else
`keep_checkpoints` in ~/.config/gpuq/config.toml, else every checkpoint is kept."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

from gpuq.core.keep import Keep, parse_keep
from gpuq.engine.tracking import retention
from gpuq.run.notify.config import config_path
from gpuq.run.supervisor.start import Run, log_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9 and 3.10: the tomli dependency
    import tomli as tomllib

PERIOD_ENV = "GPUQ_CKPT_KEEP_SECONDS"
DEFAULT_PERIOD = 30.0
CONFIG_KEY = "keep_checkpoints"


def rule(run: Run) -> Optional[Keep]:
    """The job's rule, else the config file's; a bad config value is said in the log and ignored."""
    if run.job.keep_checkpoints is not None:
        return run.job.keep_checkpoints
    path = config_path()
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as fh:
            value = tomllib.load(fh).get(CONFIG_KEY)
        return None if value is None else parse_keep(value)
    except (OSError, ValueError) as exc:  # TOMLDecodeError is a ValueError
        log_line(run.log_fd, f"{path}: {CONFIG_KEY} not used: {exc}")
        return None


def prune(run: Run, keep: Optional[Keep]) -> None:
    """Remove what the rule lets go of now, and say it in the job's log."""
    if keep is None:
        return
    try:
        removed = retention.remove(run.job, keep)
    except OSError as exc:  # the job's own directory: its trouble must not end the supervisor
        log_line(run.log_fd, f"checkpoints not pruned: {exc}")
        return
    if removed:
        log_line(run.log_fd, retention.said(removed, keep))


def period() -> float:
    try:
        seconds = float(os.environ.get(PERIOD_ENV) or DEFAULT_PERIOD)
    except ValueError:
        return DEFAULT_PERIOD
    return seconds if seconds > 0 else DEFAULT_PERIOD  # NaN compares false: the default


class Keeper:
    """The periodic look, as a sampler around the wait's others (never ends the wait itself)."""

    def __init__(self, run: Run, keep: Keep, inner: Optional[Any]):
        self.run, self.keep, self.inner = run, keep, inner
        self.period = period()
        self.due = time.time() + self.period

    def seconds_left(self) -> float:
        left = max(0.0, self.due - time.time())
        return left if self.inner is None else min(left, self.inner.seconds_left())

    def take_if_due(self) -> bool:
        stop = self.inner.take_if_due() if self.inner is not None else False
        now = time.time()
        if now >= self.due:
            self.due = now + self.period
            prune(self.run, self.keep)
        return bool(stop)


def keeping(run: Run, inner: Optional[Any]) -> Optional[Any]:
    keep = rule(run)
    return inner if keep is None else Keeper(run, keep, inner)
