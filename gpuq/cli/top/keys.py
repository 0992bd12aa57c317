"""The keys of `gpuq top` that act on the selected job: each calls the library function its CLI
command calls (gpuq/engine/lifecycle/), so it is refused for the same reasons, in the same words.
The ones that stop a job ask first, and only `y` does it. The engine's actions are imported by the
first key that needs them: looking needs none of them."""

from __future__ import annotations

from typing import Any, Callable

from gpuq.core.states import CANCELLED, FAILED, HELD, INTERRUPTED, PENDING, PREEMPTED, RUNNING, SLURM
from gpuq.spool import Spool


class Action:
    """A key, what it does in words (`kill`), the states it applies to, whether it asks first, and
    the call: (spool, job id) -> the line to show once done."""

    __slots__ = ("key", "verb", "states", "asks", "call")

    def __init__(
        self, key: str, verb: str, states: tuple[str, ...], asks: bool, call: Callable[[Spool, int], str]
    ) -> None:
        self.key, self.verb, self.states, self.asks, self.call = key, verb, states, asks, call

    def question(self, job_id: int, name: str) -> str:
        return f"{self.verb} #{job_id} {name}? [y/N]"


def lifecycle() -> Any:
    """gpuq.engine.lifecycle with its actions and preempt modules."""
    import gpuq.engine.lifecycle.actions  # by the first key that acts: the first frame does not wait
    import gpuq.engine.lifecycle.preempt  # for them (about 60 ms of imports)

    return gpuq.engine.lifecycle


def _kill(sp: Spool, job_id: int) -> str:
    job = lifecycle().actions.kill(sp, job_id)
    return f"#{job_id} {job.name} killed (exit {job.exit_code})"


def _cancel(sp: Spool, job_id: int) -> str:
    job = lifecycle().actions.cancel(sp, job_id)
    return f"#{job_id} {job.name} cancelled"


def _hold(sp: Spool, job_id: int) -> str:
    job = lifecycle().actions.hold(sp, job_id)
    return f"#{job_id} {job.name} held (u puts it back in line)"


def _release(sp: Spool, job_id: int) -> str:
    job = lifecycle().actions.release(sp, job_id)
    return f"#{job_id} {job.name} back in line"


def _preempt(sp: Spool, job_id: int) -> str:
    outcome = lifecycle().preempt.preempt(sp, job_id)  # `gpuq preempt`'s default wait, in the app's worker thread
    job = outcome.job
    if outcome.state == PREEMPTED:
        return f"#{job_id} {job.name} preempted: {job.note} (P resumes it)"
    if outcome.left:
        return f"#{job_id} did not stop; left running (`gpuq preempt {job_id} --force` kills what is left)"
    return f"#{job_id} ended on its own meanwhile: {outcome.state}"


def _resume(sp: Spool, job_id: int) -> str:
    job = lifecycle().preempt.resume(sp, job_id).job
    return f"#{job_id} {job.name} back in the queue (first in line): {job.note}"


def _retry(sp: Spool, job_id: int) -> str:
    job, how = lifecycle().actions.retry(sp, job_id)
    return f"#{job_id} {job.name} back in the queue: {how.text()}"


ACTIONS = (
    Action("x", "kill", (RUNNING,), True, _kill),
    Action("c", "cancel", (RUNNING, PENDING, HELD, PREEMPTED, INTERRUPTED, SLURM), True, _cancel),
    Action("h", "hold", (PENDING,), False, _hold),
    Action("u", "release", (HELD,), False, _release),
    Action("p", "preempt", (RUNNING,), True, _preempt),
    Action("P", "resume", (PREEMPTED, INTERRUPTED), False, _resume),
    Action("r", "retry", (FAILED, CANCELLED), False, _retry),
)
BY_KEY = {action.key: action for action in ACTIONS}

HELP = [
    ("up/down, j/k", "select a job"),
    ("enter, l", "its log, following while it runs (esc or q: back)"),
    ("x", "kill the running job (asks)"),
    ("c", "cancel the job; a running one is killed first (asks)"),
    ("h / u", "hold a pending job / release a held one"),
    ("p / P", "preempt a running job, keeping its checkpoint (asks) / resume a preempted one"),
    ("r", "retry a failed or cancelled job"),
    ("?", "this help"),
    ("q", "leave (the jobs and the worker go on)"),
]


def refusal(action: Action, state: str, job_id: Any) -> str:
    """Said instead of asking when the key does not apply to the job's state: the CLI would refuse."""
    return f"#{job_id} is {state}: {action.verb} applies to {', '.join(action.states)} jobs"
