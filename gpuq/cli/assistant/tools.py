"""The tools of `gpuq mcp`, as a table: each a thin call into what its CLI command calls, returning
what that command's `--json` prints. The skill names every tool's command (tests/test_mcp.py).
`add`'s parameters are read from the options table: an option added there is a parameter here.
"""

from __future__ import annotations

import inspect
import time
from typing import Annotated, Any, Callable, NamedTuple, Optional, Sequence, Union, get_type_hints

from pydantic import Field

from gpuq.cli import cmd_history, cmd_status, cmd_view, common
from gpuq.cli.commands import COMMANDS
from gpuq.cli.options import ADD, FLAG, HIDDEN
from gpuq.core.errors import GpuqError, Refused, UsageError
from gpuq.core.states import CANCELLED, HELD, PENDING, PREEMPTED, RUNNING
from gpuq.engine.lifecycle import actions, edit, enqueue, requests
from gpuq.engine.lifecycle.dryrun import plan_add, starts_now
from gpuq.engine.lifecycle.requests import Done
from gpuq.engine.schedule import gpuview
from gpuq.engine.views import finished_index, history
from gpuq.engine.views.card import not_started
from gpuq.engine.views.status import status
from gpuq.engine.views.triage import triage
from gpuq.spool import Spool

READ, CHANGE, DESTROY = "read", "change", "destroy"  # a tool's effect
EFFECT_SAID = {
    READ: "Read-only.",
    CHANGE: "Changes the queue: confirm with the user before calling it.",
    DESTROY: "Ends or throws away work: confirm with the user before calling it, naming the jobs.",
}

LOG_LINES_DEFAULT, LOG_LINES_MAX = 50, 500
LOG_CHARS_MAX = 64 * 1024  # a log of one endless line (tqdm without \r) must not flood the assistant
Integer = Annotated[int, Field(strict=True)]  # JSON's true is no job #1, though Python's int takes it as 1
# add's integer fields as strict: `"gpus": true` is refused, not taken as one GPU
STRICT = {int: Integer, Optional[int]: Optional[Integer], Sequence[int]: Sequence[Integer]}
STRICT[Union[int, str, None]] = Union[Integer, str, None]
JobIds = Annotated[list[Integer], Field(description="job ids", min_length=1)]
JobId = Annotated[Integer, Field(description="the job id", gt=0)]


class Tool(NamedTuple):
    """The SDK builds the input schema from `run`'s signature, or from `parameters` where it takes
    **keywords; `summary` follows the command's own help, unless not `with_help`."""

    name: str
    cli: str
    effect: str
    run: Callable[..., Any]
    summary: str = ""
    parameters: Optional[Callable[[], list[inspect.Parameter]]] = None
    with_help: bool = True

    def signature(self) -> inspect.Signature:
        if self.parameters is not None:
            return inspect.Signature(self.parameters())
        return inspect.signature(self.run, eval_str=True)

    @property
    def command(self) -> str:
        return self.cli.split()[1]

    @property
    def description(self) -> str:
        help_text = (next(c.help for c in COMMANDS if self.command in c.names) or "") if self.with_help else ""
        parts = [f"{help_text[:1].upper()}{help_text[1:]}." if help_text else "", self.summary]
        return " ".join(p for p in parts if p) + f" Stands for `{self.cli}`. {EFFECT_SAID[self.effect]}"


def spool() -> Spool:
    """The user's spool; the original gpuq's queue is imported by the server, which says so in its
    answer (its report on stderr would reach no one)."""
    return common.spool(first_use_import=False)


def on_ids(
    name: str,
    effect: str,
    request: Any,
    state: str,
    said: Callable[[Done], dict[str, Any]] = lambda _d: {},
    summary: str = "",
) -> Tool:
    """The tool of `gpuq NAME ID...`: `ids`, and the flags of the command's options."""
    flags = [opt for opt in next(c for c in COMMANDS if name in c.names).options if opt.kind == FLAG]

    def run(ids: list[int], **given: bool) -> dict[str, Any]:
        done: list[dict[str, Any]] = []
        refused: list[dict[str, Any]] = []
        for job_id, outcome in requests.each(spool(), request(ids=ids, **given)):
            if isinstance(outcome, GpuqError):
                refused.append({"id": job_id, "error": str(outcome)})
            else:
                done.append(job_said(outcome.job, state, **said(outcome)))
        if refused and not done:  # every job refused: the tool's error
            raise Refused("; ".join(r["error"] for r in refused))
        return {"jobs": done, "refused": refused}

    def parameters() -> list[inspect.Parameter]:
        keyword = inspect.Parameter.KEYWORD_ONLY
        return [inspect.Parameter("ids", keyword, annotation=JobIds)] + [
            inspect.Parameter(opt.dest, keyword, default=False, annotation=Annotated[bool, Field(description=opt.help)])
            for opt in flags
        ]

    return Tool(name, f"gpuq {name}", effect, run, summary, parameters)


LOST = "The steps since each one's last checkpoint are lost."


def queue(all: Annotated[bool, Field(description="every finished job, not only the newest (as -a)")] = False) -> Any:
    return cmd_status.json_rows(spool(), all)


def job(
    id: JobId,
    env: Annotated[bool, Field(description="the values of the shell's environment it was queued from")] = False,
) -> Any:
    """`show --json`; of the shell's environment (tokens among them) only the names, unless `env`."""
    sp = spool()
    ref, found = actions.get(sp, id)
    shown = cmd_view.show_json(sp, ref, found, secrets=False)
    if not env:
        shown["shell_env_names"] = sorted(shown.pop("shell_env", None) or {})
    return shown


def log_tail(
    id: JobId,
    lines: Annotated[int, Field(description=f"how many lines (at most {LOG_LINES_MAX})", ge=1)] = LOG_LINES_DEFAULT,
) -> Any:
    sp = spool()
    ref, found = actions.get(sp, id)
    why = not_started(sp, ref, found)
    tail = [] if why else sp.logs.tail_lines(found, min(lines, LOG_LINES_MAX))
    text, cut = "\n".join(tail), False
    if len(text) > LOG_CHARS_MAX:
        text, cut = text[-LOG_CHARS_MAX:], True
    return {"id": id, "state": ref.state, "not_started": why, "log": text, "cut": cut}


def eta(id: Annotated[Optional[Integer], Field(description="one job (default: every running and pending one)")] = None):
    sp = spool()
    if id is not None:
        actions.get(sp, id)  # "no such job #N"
    fields = ("id", "name", "state", "progress", "eta_seconds", "starts_in_seconds", "eta_method", "progress_source")
    rows = [cmd_status.json_row(r) for r in status(sp, recent=0).rows if r.estimate is not None]
    return [{k: row[k] for k in fields} for row in rows if id is None or row["id"] == id]


def gpus() -> Any:
    return gpuview.listed(cmd_view.gpus_view(spool()), time.time())


def history_groups(
    since: Annotated[Optional[str], Field(description="only runs that ended since: 7d, 12h, 2w or a date")] = None,
    by: Annotated[str, Field(description="group by: dir, script, day or sweep")] = "dir",
) -> Any:
    if by not in ("dir", "script", "day", "sweep"):
        raise UsageError(f"by: expected dir, script, day or sweep, got {by!r}")
    start = enqueue.usage(history.parse_since, since or None, time.time())
    groups = cmd_history.history_groups(finished_index.history_records(spool()), start, by)
    return history.to_json(groups)


def triage_job(
    id: JobId,
    lines: Annotated[int, Field(description="the log's last lines to give (at most 500)", ge=1)] = 30,
) -> Any:
    return triage(spool(), id, lines)


NOT_ASKED = ("umask", "shell_env")  # the request's fields the server fills in: its own


def add_parameters() -> list[inspect.Parameter]:
    """The fields of enqueue.Request, each described by the help of its options."""
    helps: dict[str, list[str]] = {"cmd": ["SCRIPT and ARGS, one word each: a .py file or any command"]}
    for opt in ADD.options:
        if opt.help != HIDDEN and not opt.positional:
            helps.setdefault(opt.dest, []).append(f"`{opt.flags[-1]}`: {opt.help}")
    helps["notify_url"] = ["URLs its events are sent to, as `--notify URL`"]
    types = {name: STRICT.get(hint, hint) for name, hint in get_type_hints(enqueue.Request).items()}
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
    free_now = running is not None and starts_now(sp, prepared)  # asked before it is queued
    published = enqueue.publish(sp, prepared)
    out: dict[str, Any] = {
        "jobs": [
            {"id": j.id, "name": j.name, "state": ref.state, "after": j.after, "after_any": j.after_any}
            for ref, j in published
        ],
        "notes": prepared.notes,
        "warnings": prepared.warnings,
        "worker_running": bool(sp.workers.live()),
    }
    if running is not None:
        out["urgent_outlook"] = enqueue.urgent_outlook(published[0][1], running, free_now)
    return out


def add_dry_run(**given: Any) -> dict[str, Any]:
    return plan_add(Spool(), request(given))


def request(given: dict[str, Any]) -> enqueue.Request:
    return enqueue.Request(**given)


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
        checkpoint = None if record.get("starts_over") else record.get("checkpoint")  # none it continues from
        return job_said(job, PREEMPTED, exit_code=job.exit_code, note=job.note, checkpoint=checkpoint)
    if outcome.left and outcome.state == RUNNING and job.pid in outcome.left:
        raise Refused(
            f"job #{id} did not exit within {timeout:g}s; asked to stop: it is still saving; "
            "it will be recorded preempted when it exits (force=true kills it)"
        )
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


READING = (
    Tool(
        "queue",
        "gpuq status --json",
        READ,
        queue,
        "One object per job: its fields, `state`, `waiting` (why it waits), `progress`, `eta_seconds`, "
        "`reason` (why it failed); the newest finished jobs, or with all=true every one. A job file that "
        "is no valid job (damaged) is an object with `damaged` true, its `file`, `id`, `state` and, in `reason`, "
        "why; its other fields null.",
    ),
    Tool(
        "job",
        "gpuq show --json",
        READ,
        job,
        "The job's file as it is, with `state`, `file` and `gpu_use`; of the environment inherited from the shell "
        "that queued it only the names (`shell_env_names`), unless env=true.",
    ),
    Tool(
        "log_tail",
        "gpuq log",
        READ,
        log_tail,
        f"The last lines of a job's log (default {LOG_LINES_DEFAULT}, at most {LOG_LINES_MAX}), read from its "
        "end however big it is; `not_started` says why a job that never ran has none.",
    ),
    Tool("eta", "gpuq eta", READ, eta, "Per job: `progress` (0 to 1), `eta_seconds`, `starts_in_seconds`, the method."),
    Tool(
        "gpus",
        "gpuq gpus --json",
        READ,
        gpus,
        "Per GPU: memory, gpuq's `jobs`, other processes (`foreign`), every user's `leases`.",
    ),
    Tool(
        "history",
        "gpuq history --json",
        READ,
        history_groups,
        "Where the GPU hours went, per group (dir, script, day or sweep): runs, failures, GPU-hours, median "
        "duration, what the GPUs did.",
        with_help=False,  # the command's help names its timeline, a picture: not here
    ),
    Tool(
        "triage",
        "gpuq triage --json",
        READ,
        triage_job,
        "`waiting_for`, or `exit_code`, `signal`, `reason` (CUDA out of memory with the size it tried, time limit, "
        "OOM killer...), `log_tail`, `checkpoint`, and `fixes`: gpuq command lines that would fix it, each with why.",
    ),
    Tool(
        "add_dry_run",
        "gpuq add --dry-run",
        READ,
        add_dry_run,
        "What `add` with the same parameters would queue (per job of a sweep: the command, the interpreter found, "
        "directory, environment, GPUs, limits, dependencies) and `would_start`: now, or why not and when. "
        "Nothing is written.",
        parameters=add_parameters,
        with_help=False,  # add's help says it queues
    ),
)

CHANGING = (
    Tool(
        "add",
        "gpuq add",
        CHANGE,
        add,
        "Takes `cmd` (the script and its arguments, one word each) and every option of `gpuq add` by its "
        "name (dir, gpus, gpu_mem, after, time, sweep, priority, env as an object...). Returns the new ids.",
        parameters=add_parameters,
    ),
    on_ids("cancel", DESTROY, requests.Cancel, CANCELLED, lambda d: {"killed": d.killed, "exit_code": d.job.exit_code}),
    on_ids("kill", DESTROY, requests.Kill, CANCELLED, lambda d: {"exit_code": d.job.exit_code}, LOST),
    on_ids("hold", CHANGE, requests.Hold, HELD),
    on_ids("release", CHANGE, requests.Release, PENDING),
    on_ids("retry", CHANGE, requests.Retry, PENDING, lambda d: {"how": d.how}),
    Tool(
        "preempt",
        "gpuq preempt",
        DESTROY,
        preempt_job,
        "Steps since its last checkpoint are lost. Returns `checkpoint`: the one `resume` continues it from; "
        "null when it left none, or was queued with no_resume (it starts over: every step is lost).",
    ),
    on_ids("resume", CHANGE, requests.Resume, PENDING, lambda d: {"note": d.job.note}),
    Tool(
        "edit",
        "gpuq edit --set",
        CHANGE,
        edit_job,
        f"Change a pending or held job: `changes` are KEY=VALUE pairs of the keys {', '.join(edit.EDITABLE)} "
        "(a dropped job file's), checked as such a file is.",
        with_help=False,  # the command's help names the editor, which a tool has not
    ),
)

TOOLS = READING + CHANGING

# The commands of the skill's command list that have no tool, and why.
CLI_ONLY = {
    "top": "a full-screen view for the person at the terminal; the queue and gpus tools give its facts",
    "web": "serves a page to the person's browser until Ctrl-C; the queue, job and log_tail tools give its facts",
    "run": "starts a worker, a long-lived process: `gpuq run --daemon` in a shell",
    "stop": "stops the workers of the whole queue: the person's decision, in a shell",
    "wait": "blocks until jobs end; poll the queue tool instead",
    "lease": "runs a command in the foreground under a GPU lease: a shell's job",
    "adopt": "takes a process of the user's into the queue, by its pid: rare, in a shell",
    "recover": "after a reboot, by the person; the resume tool takes interrupted jobs one by one",
    "service": "installs a systemd service: setting up the machine",
    "slurm": "hands jobs to a cluster: needs Slurm and the person's say",
    "import": "brings the original gpuq's queue in, once",
    "clear": "removes finished jobs and their logs (their history is kept): the person's decision",
    "rejected": "hand-dropped job files that were not jobs: for the person who dropped them",
}
