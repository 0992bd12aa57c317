"""The tools of `gpuq mcp` that change the queue (and `add_dry_run`). `add`'s parameters are read
from the options table: an option added there is a parameter here.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Callable, get_type_hints

from pydantic import Field

from gpuq.cli.common import spool
from gpuq.cli.options import ADD, HIDDEN
from gpuq.core.errors import GpuqError, Refused
from gpuq.core.states import PREEMPTED, RUNNING
from gpuq.engine.lifecycle import enqueue, requests
from gpuq.engine.lifecycle.dryrun import plan_add
from gpuq.engine.lifecycle.requests import Done
from gpuq.spool import Spool

JobIds = Annotated[list[int], Field(description="job ids", min_length=1)]
JobId = Annotated[int, Field(description="the job id", gt=0)]

NOT_ASKED = ("umask", "shell_env")  # the request's fields the server fills in: its own


def add_parameters() -> list[inspect.Parameter]:
    """The fields of enqueue.Request, each described by the help of its options."""
    helps: dict[str, list[str]] = {"cmd": ["SCRIPT and ARGS, one word each: a .py file or any command"]}
    for opt in ADD.options:
        if opt.help != HIDDEN and not opt.positional:
            helps.setdefault(opt.dest, []).append(f"`{opt.flags[-1]}`: {opt.help}")
    helps["notify_url"] = ["URLs its events are sent to, as `--notify URL`"]
    types = get_type_hints(enqueue.Request)
    params = []
    for name in enqueue.Request._fields:
        if name not in NOT_ASKED:
            said = "; ".join(helps[name]) + ("" if name == "cmd" else " (gpuq add)")
            field = Field(description=said, min_length=1 if name == "cmd" else None)
            default = enqueue.Request._field_defaults.get(name, inspect.Parameter.empty)
            kind = inspect.Parameter.KEYWORD_ONLY
            params.append(inspect.Parameter(name, kind, default=default, annotation=Annotated[types[name], field]))
    return params


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
    return plan_add(Spool(), request(given))


def request(given: dict[str, Any]) -> enqueue.Request:
    return enqueue.Request(**given)


def on_each(request: requests.OnJobs, said: Callable[[Done], dict[str, Any]]) -> dict[str, Any]:
    """When every job was refused, that is the tool's error."""
    done: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    for job_id, outcome in requests.each(spool(), request):
        if isinstance(outcome, GpuqError):
            refused.append({"id": job_id, "error": str(outcome)})
        else:
            done.append(said(outcome))
    if refused and not done:
        raise Refused("; ".join(r["error"] for r in refused))
    return {"jobs": done, "refused": refused}


def job_said(job: Any, state: str, **more: Any) -> dict[str, Any]:
    return dict({"id": job.id, "name": job.name, "state": state}, **more)


def preempt_job(
    id: JobId,
    timeout: Annotated[float, Field(description="seconds to wait for it to exit", ge=0, le=600)] = 60.0,
    force: Annotated[bool, Field(description="SIGKILL whatever is left when the timeout is up")] = False,
) -> dict[str, Any]:
    outcome = requests.Preempt(id=id, timeout=timeout, force=force).run(spool())
    job = outcome.job
    if outcome.state == PREEMPTED:
        record = (job.preemptions or [{}])[-1]
        return job_said(job, PREEMPTED, exit_code=job.exit_code, note=job.note, checkpoint=record.get("checkpoint"))
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
    job, changed = requests.Edit(id=id, changes=changes).run(spool())
    return {"id": id, "changed": []} if job is None else {"id": id, "name": job.name, "changed": changed}
