"""The keys of `gpuq top` that act on the selected job: each makes the request its CLI command makes,
so it is refused for the same reasons, in the same words."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from gpuq.core.states import CANCELLED, FAILED, HELD, INTERRUPTED, PENDING, PREEMPTED, RUNNING, SLURM
from gpuq.engine.lifecycle import requests
from gpuq.spool import Spool


class Action(NamedTuple):
    key: str
    verb: str
    states: tuple[str, ...]
    asks: bool
    call: Callable[[Spool, int], str]

    def question(self, job_id: int, name: str) -> str:
        return f"{self.verb} #{job_id} {name}? [y/N]"


def _on(request: Callable[..., requests.OnJobs], said: Callable[[requests.Done], str]) -> Callable[[Spool, int], str]:

    def call(sp: Spool, job_id: int) -> str:
        done = request(ids=[job_id]).one(sp, job_id, lambda _job_id: None)
        return f"#{job_id} {done.job.name} {said(done)}"

    return call


def _preempt(sp: Spool, job_id: int) -> str:
    outcome = requests.Preempt(id=job_id).run(sp)  # `gpuq preempt`'s default wait, in the app's worker thread
    job = outcome.job
    if outcome.state == PREEMPTED:
        return f"#{job_id} {job.name} preempted: {job.note} (P resumes it)"
    if outcome.left:
        return f"#{job_id} did not stop; left running (`gpuq preempt {job_id} --force` kills what is left)"
    return f"#{job_id} ended on its own meanwhile: {outcome.state}"


ACTIONS = (
    Action("x", "kill", (RUNNING,), True, _on(requests.Kill, lambda d: f"killed (exit {d.job.exit_code})")),
    Action(
        "c",
        "cancel",
        (RUNNING, PENDING, HELD, PREEMPTED, INTERRUPTED, SLURM),
        True,
        _on(requests.Cancel, lambda d: CANCELLED),
    ),
    Action("h", "hold", (PENDING,), False, _on(requests.Hold, lambda d: "held (u puts it back in line)")),
    Action("u", "release", (HELD,), False, _on(requests.Release, lambda d: "back in line")),
    Action("p", "preempt", (RUNNING,), True, _preempt),
    Action(
        "P",
        "resume",
        (PREEMPTED, INTERRUPTED),
        False,
        _on(requests.Resume, lambda d: f"back in the queue (first in line): {d.how}"),
    ),
    Action("r", "retry", (FAILED, CANCELLED), False, _on(requests.Retry, lambda d: f"back in the queue: {d.how}")),
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
    return f"#{job_id} is {state}: {action.verb} applies to {', '.join(action.states)} jobs"
