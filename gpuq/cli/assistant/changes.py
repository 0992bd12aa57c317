"""The tools of `gpuq mcp` that change the queue: `add` (and `add_dry_run`, which changes nothing
but takes the same parameters), whose parameters are `gpuq add`'s options read from the one
options table (cli/options.py: an option added there is a parameter here), and the commands of
one or several job ids. Each calls what its CLI command calls (cli/cmd_queue.py,
cmd_preempt.py) and returns what happened as a dict.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Callable, Literal, Optional, Union

from pydantic import Field

from gpuq.cli.cmd_queue import request_from_options
from gpuq.cli.common import spool
from gpuq.cli.options import ADD, APPEND, CONST, FLAG, Opt, gpu_count, ids, positive_id
from gpuq.core.errors import GpuqError, Refused
from gpuq.core.states import CANCELLED, HELD, PENDING, PREEMPTED, RUNNING
from gpuq.engine.lifecycle import actions, edit, enqueue, preempt

JobIds = Annotated[list[int], Field(description="job ids", min_length=1)]
JobId = Annotated[int, Field(description="the job id", gt=0)]

# `gpuq add`'s options that are no request: how the CLI prints (-q, --json), --dry-run (a tool of
# its own); SCRIPT and ARGS are `cmd`
NOT_PARAMETERS = ("quiet", "script", "args", "dry_run", "json")
INTEGERS = (int, gpu_count, positive_id)  # converters of options whose value is a number


# ---- add: its parameters, from the options table ----------------------------------------------


def add_parameters() -> list[inspect.Parameter]:
    """The `add` tool's parameters: `cmd` (SCRIPT and ARGS), then one per option of `gpuq add`
    (options sharing a name, `--urgent` and `--urgent=force`, are one parameter of their values)."""
    words = Field(description="SCRIPT and ARGS, one word each: a .py file or any command", min_length=1)
    params = [inspect.Parameter("cmd", inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[list[str], words])]
    seen: dict[str, list[Opt]] = {}
    for opt in ADD.options:
        if opt.dest not in NOT_PARAMETERS:
            seen.setdefault(opt.dest, []).append(opt)
    for dest, opts in seen.items():
        kind, default = _parameter_type(opts), opts[0].initial()
        default = None if opts[0].kind == APPEND else default
        helps = "; ".join(f"`{o.flags[-1]}`: {o.help}" for o in opts)
        annotation = Annotated[kind, Field(description=f"{helps} (gpuq add)")]
        params.append(inspect.Parameter(dest, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
    return params


def _parameter_type(opts: list[Opt]) -> Any:
    opt = opts[0]
    if opt.kind == FLAG:
        return bool
    if opt.kind == CONST:  # `--urgent` (true) or `--urgent=force` ("force")
        return Literal[(opt.default, *(o.const for o in opts))]
    item: Any = int if opt.convert in INTEGERS else Union[int, str] if opt.convert is ids else str
    return Optional[list[item]] if opt.kind == APPEND else Optional[item]


def add(**given: Any) -> dict[str, Any]:
    prepared = enqueue.prepare(request(given))
    sp = spool()
    running = enqueue.running_jobs(sp) if given.get("urgent") and not given.get("hold") else None
    published = enqueue.publish(sp, prepared)
    jobs = [
        {"id": j.id, "name": j.name, "state": ref.state, "after": j.after, "after_any": j.after_any}
        for ref, j in published
    ]
    out: dict[str, Any] = {
        "jobs": jobs,
        "notes": prepared.notes,
        "warnings": prepared.warnings,
        "worker_running": bool(sp.workers.live()),
    }
    if running is not None:
        out["urgent_outlook"] = enqueue.urgent_outlook(published[0][1], running)
    return out


def add_dry_run(**given: Any) -> dict[str, Any]:
    """What `add` would queue and whether and when it would start; nothing written (as `gpuq add
    --dry-run`, on a spool that is not made if it does not exist)."""
    from gpuq.engine.lifecycle.dryrun import plan_add  # only when asked (the ETA's modules with it)
    from gpuq.spool import Spool  # a spool not made when it does not exist, as `add --dry-run`

    return plan_add(Spool(), request(given))


def request(given: dict[str, Any]) -> enqueue.Request:
    """What `gpuq add` would be asked: the tool's arguments made the command line's words and read
    by its parser (cmd_queue.request_from_options), in the server's environment."""
    options = {name: value for name, value in given.items() if name != "cmd"}
    return request_from_options(given["cmd"], options)


# ---- commands of job ids ----------------------------------------------------------------------


def on_each(ids: list[int], act: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    """`act` on each id, as the CLI's commands of several ids do: the ones refused are listed with
    gpuq's one-line reason; when every one was refused, that is the tool's error."""
    done, refused = [], []
    for job_id in dict.fromkeys(ids):
        try:
            done.append(act(job_id))
        except GpuqError as exc:
            refused.append({"id": job_id, "error": str(exc)})
    if refused and not done:
        raise Refused("; ".join(r["error"] for r in refused))
    return {"jobs": done, "refused": refused}


def _said(job: dict[str, Any], state: str, **more: Any) -> dict[str, Any]:
    return dict({"id": job.id, "name": job.name, "state": state}, **more)


def cancel(ids: JobIds) -> dict[str, Any]:
    sp = spool()

    def one(job_id: int) -> dict[str, Any]:
        killed: list[int] = []
        job = actions.cancel(sp, job_id, lambda: killed.append(job_id))
        return _said(job, CANCELLED, killed=bool(killed), exit_code=job.exit_code)

    return on_each(ids, one)


def kill(ids: JobIds) -> dict[str, Any]:
    sp = spool()

    def one(job_id: int) -> dict[str, Any]:
        actions.get(sp, job_id, (RUNNING,))  # refused before anything is sent
        job = actions.kill(sp, job_id)
        return _said(job, CANCELLED, exit_code=job.exit_code)

    return on_each(ids, one)


def hold(ids: JobIds) -> dict[str, Any]:
    sp = spool()
    return on_each(ids, lambda job_id: _said(actions.hold(sp, job_id), HELD))


def release(ids: JobIds) -> dict[str, Any]:
    sp = spool()
    return on_each(ids, lambda job_id: _said(actions.release(sp, job_id), PENDING))


def retry(
    ids: JobIds, from_scratch: Annotated[bool, Field(description="start over, ignoring checkpoints")] = False
) -> dict[str, Any]:
    sp = spool()

    def one(job_id: int) -> dict[str, Any]:
        job, how = actions.retry(sp, job_id, from_scratch)
        return _said(job, PENDING, how=how.text())

    return on_each(ids, one)


def resume(
    ids: JobIds,
    require_checkpoint: Annotated[bool, Field(description="refuse a job without a checkpoint")] = False,
    back: Annotated[bool, Field(description="queue it in normal order instead of first in line")] = False,
) -> dict[str, Any]:
    sp = spool()

    def one(job_id: int) -> dict[str, Any]:
        job = preempt.resume(sp, job_id, require_checkpoint, front=not back).job
        return _said(job, PENDING, note=job.note)

    return on_each(ids, one)


def preempt_job(
    id: JobId,
    timeout: Annotated[float, Field(description="seconds to wait for it to exit", ge=0, le=600)] = 60.0,
    force: Annotated[bool, Field(description="SIGKILL whatever is left when the timeout is up")] = False,
) -> dict[str, Any]:
    said: list[str] = []
    outcome = preempt.preempt(spool(), id, timeout, force, say=said.append)
    job = outcome.job
    if outcome.state == PREEMPTED:
        record = (job.preemptions or [{}])[-1]
        return _said(job, PREEMPTED, exit_code=job.exit_code, note=job.note, checkpoint=record.get("checkpoint"))
    if outcome.left and outcome.state == RUNNING and job.pid in outcome.left:
        raise Refused(f"job #{id} did not exit within {timeout:g}s; left running, unchanged (force=true kills it)")
    if outcome.left:
        raise Refused(f"job #{id}: processes {', '.join(map(str, outcome.left))} ignore SIGTERM; it keeps its slot")
    raise Refused(f"job #{id} ended on its own meanwhile: {outcome.state}")


def edit_job(
    id: JobId,
    changes: Annotated[
        list[str], Field(description='KEY=VALUE each, as `gpuq edit --set` (VALUE as JSON: 5, ["a"], or text)')
    ],
) -> dict[str, Any]:
    sp = spool()
    fields, rev = edit.read(sp, id)
    changed = edit.with_pairs(fields, changes)
    if changed == fields:
        return {"id": id, "changed": []}
    job = edit.apply(sp, id, changed, rev)
    return {"id": id, "name": job.name, "changed": [k for k in changed if changed[k] != fields.get(k)]}
