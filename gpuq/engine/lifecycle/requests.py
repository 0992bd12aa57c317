"""The commands that change jobs, as typed requests: what the CLI's options, the MCP server's tool
arguments and `gpuq top`'s keys all become (`gpuq add`'s is enqueue.Request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple, Optional, Sequence, Union

from gpuq.core.errors import GpuqError, UsageError
from gpuq.core.job import Job
from gpuq.core.states import FINISHED, RAY, RUNNING, SLURM
from gpuq.engine.lifecycle import actions, clearing, edit, preempt
from gpuq.spool import Spool

Stopping = Callable[[int, float], object]  # a running job's id and grace, just before its process group is signalled


class Done(NamedTuple):
    """What a request made of one job: how it goes on (from which checkpoint), whether it was killed."""

    job: Job
    how: str = ""
    killed: bool = False


@dataclass(frozen=True)
class OnJobs:
    ids: Sequence[int]

    def one(self, spool: Spool, job_id: int, stopping: Stopping) -> Done:
        raise NotImplementedError


@dataclass(frozen=True)
class Cancel(OnJobs):
    force: bool = False  # a job on a cluster that cannot be told: cancelled here only

    def one(self, spool: Spool, job_id: int, stopping: Stopping) -> Done:
        killed: list[int] = []

        def killing(grace: float) -> None:
            killed.append(job_id)
            stopping(job_id, grace)

        return Done(actions.cancel(spool, job_id, killing, self.force), killed=bool(killed))


@dataclass(frozen=True)
class Kill(OnJobs):
    def one(self, spool: Spool, job_id: int, stopping: Stopping) -> Done:
        if not spool.jobs.find(job_id, (SLURM, RAY)):  # one on a cluster is stopped there: no signal here
            actions.get(spool, job_id, (RUNNING,))  # refused before anything is said or sent
        return Done(actions.kill(spool, job_id, stopping=lambda grace: stopping(job_id, grace)))


@dataclass(frozen=True)
class Hold(OnJobs):
    def one(self, spool: Spool, job_id: int, stopping: Stopping) -> Done:
        return Done(actions.hold(spool, job_id))


@dataclass(frozen=True)
class Release(OnJobs):
    def one(self, spool: Spool, job_id: int, stopping: Stopping) -> Done:
        return Done(actions.release(spool, job_id))


@dataclass(frozen=True)
class Retry(OnJobs):
    from_scratch: bool = False

    def one(self, spool: Spool, job_id: int, stopping: Stopping) -> Done:
        job, how = actions.retry(spool, job_id, self.from_scratch)
        return Done(job, how.text())


@dataclass(frozen=True)
class Recover(OnJobs):
    """Interrupted jobs back in the queue, whatever they reached."""

    from_scratch: bool = False

    def one(self, spool: Spool, job_id: int, stopping: Stopping) -> Done:
        job, how = actions.recover(spool, job_id, self.from_scratch)
        said = (job.note or "").partition(f"{actions.RECOVERED}; ")[2]  # with a larger share, that too
        return Done(job, said or how.text())


@dataclass(frozen=True)
class Resume(OnJobs):
    require_checkpoint: bool = False
    back: bool = False

    def one(self, spool: Spool, job_id: int, stopping: Stopping) -> Done:
        job = preempt.resume(spool, job_id, self.require_checkpoint, front=not self.back).job
        return Done(job, job.note or "")


def each(
    spool: Spool, request: OnJobs, stopping: Stopping = lambda _job_id, _grace: None
) -> Iterator[tuple[int, Union[Done, GpuqError]]]:
    """Each id once: what the request made of the job, or why it was refused. Those not running come
    first: a running job stopped first would hand its slot to a listed pending one, which would start."""
    running = {ref.id for ref in spool.jobs.refs((RUNNING,))}
    for job_id in sorted(dict.fromkeys(request.ids), key=lambda job_id: job_id in running):
        try:
            yield job_id, request.one(spool, job_id, stopping)
        except GpuqError as exc:
            yield job_id, exc


@dataclass(frozen=True)
class Preempt:
    id: int
    timeout: float = preempt.DEFAULT_TIMEOUT
    force: bool = False

    def run(self, spool: Spool, say: Callable[[str], object] = lambda _text: None) -> preempt.Outcome:
        if self.timeout < 0:
            raise UsageError("--timeout must be 0 or more")
        return preempt.preempt(spool, self.id, self.timeout, self.force, say=say)


@dataclass(frozen=True)
class Edit:
    """`changes`: KEY=VALUE pairs of edit.EDITABLE."""

    id: int
    changes: Sequence[str]

    def run(self, spool: Spool) -> tuple[Optional[Job], list[str]]:
        fields, rev = edit.read(spool, self.id)
        return edit.apply_edited(spool, self.id, fields, edit.with_pairs(fields, list(self.changes)), rev)


@dataclass(frozen=True)
class Clear:
    states: Sequence[str] = FINISHED
    older_than: Optional[float] = None
    logs_only: bool = False

    def select(self, spool: Spool) -> clearing.Selection:
        chosen = clearing.select(spool, tuple(dict.fromkeys(self.states)) or FINISHED, self.older_than)
        if self.logs_only:  # only those with a log left to remove, so that the preview counts what goes
            chosen.refs = [ref for ref in chosen.refs if spool.has_log(ref.id)]
        return chosen

    def run(self, spool: Spool, chosen: clearing.Selection) -> clearing.ClearReport:
        return clearing.clear(spool, chosen, logs_only=self.logs_only)
