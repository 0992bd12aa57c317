"""A running job's checkpoints kept by its rule (engine/tracking/retention.py): looked at every
GPUQ_CKPT_KEEP_SECONDS while it runs, as one of the wait's samplers, and once more when it ends;
each removal said in the job's log. The rule: its `--keep-checkpoints` (`all`: every checkpoint),
else `keep_checkpoints` in ~/.config/gpuq/config.toml, else every checkpoint is kept."""

from __future__ import annotations

import math
import time
from typing import Optional

from gpuq.core.keep import ALL, Keep, parse_keep
from gpuq.engine.tracking import retention
from gpuq.run.notify.config import config_path, read_config
from gpuq.run.notify.send import env_seconds
from gpuq.run.supervisor.start import Run, log_line

PERIOD_ENV = "GPUQ_CKPT_KEEP_SECONDS"
DEFAULT_PERIOD = 30.0
CONFIG_KEY = "keep_checkpoints"


def rule(run: Run) -> Optional[Keep]:
    """The job's rule, else the config file's; a bad config value is said in the log and ignored."""
    if run.job.keep_checkpoints is not None:
        return None if run.job.keep_checkpoints == ALL else run.job.keep_checkpoints
    try:
        value = read_config().get(CONFIG_KEY)
        return None if value is None or parse_keep(value) == ALL else parse_keep(value)
    except (OSError, ValueError) as exc:
        log_line(run.log_fd, f"{config_path()}: {CONFIG_KEY} not used: {exc}")
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


class Keeper:
    """The periodic look, one of the wait's samplers (never ends the wait)."""

    def __init__(self, run: Run, keep: Keep):
        self.run, self.keep = run, keep
        self.period = env_seconds(PERIOD_ENV, DEFAULT_PERIOD, math.inf)
        self.due = time.time() + self.period

    def seconds_left(self) -> float:
        return max(0.0, self.due - time.time())

    def take_if_due(self) -> bool:
        now = time.time()
        if now >= self.due:
            self.due = now + self.period
            prune(self.run, self.keep)
        return False


def keeper(run: Run) -> Optional[Keeper]:
    keep = rule(run)
    return None if keep is None else Keeper(run, keep)
