"""Turning what a user asked for (`gpuq add ...` or a hand-dropped file) into queued jobs: `prepare`
checks and resolves a `Request` without a spool (a bad request leaves none behind), `publish` queues."""

# Real annotations, no future import: see test_the_everyday_commands_compile_no_source.
import os
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence, TypeVar, Union

from gpuq.core import schema, sweep, timespec
from gpuq.core.errors import Refused, UsageError
from gpuq.core.job import MAX_GPUS, MAX_RETRIES, Job, is_url
from gpuq.core.keep import parse_keep
from gpuq.core.resume_arg import check_resume_arg
from gpuq.core.states import HELD, PENDING, RUNNING
from gpuq.core.times import iso_of
from gpuq.core.words import url_text
from gpuq.engine.lifecycle import interpreter
from gpuq.engine.lifecycle.add_request import Request
from gpuq.engine.lifecycle.interpreter import EnqueueError, upward
from gpuq.engine.schedule import diskguard, gpuview
from gpuq.spool import JobRef, Spool
from gpuq.system.procs import current_umask
from gpuq.system.security import display

T = TypeVar("T")

# git's record of a job's code ({"repo", "commit", ...}, or None), asked for early and read when needed
CodeAnswer = Callable[[], Optional[dict[str, Any]]]


def default_name(cwd: Union[str, os.PathLike], cmd: list[str]) -> str:
    """`<dir name>/<script stem>`, as the original gpuq named jobs (`root/...` in `/`), control
    characters written as escapes (`\\x1b`): a file's name must not reach a terminal raw."""
    stem = schema.display_script(cmd).rsplit(".", 1)[0] or "job"
    return display(f"{os.path.basename(os.path.normpath(cwd)) or 'root'}/{stem}")


def missing_jobs(spool: Spool, ids: list[int]) -> str:
    """ "#7, #9" for the ids that name no job in the spool."""
    if not ids:
        return ""  # listing every state is slow with many finished jobs: only when needed
    known = set(spool.jobs.index())
    return ", ".join(f"#{i}" for i in ids if i not in known)


class Variant(NamedTuple):
    """One job of an `add` (a sweep has several)."""

    cmd: list[str]
    name: Optional[str] = None
    options: Optional[dict[str, Any]] = None


def _snapshot(spool: Spool, ids: list[int], repo: str, cwd: str, variants: list[Variant]) -> tuple[dict, list[Variant]]:
    """`add --snapshot`: the repository's tracked files copied now, and every argument that names a
    file of it pointed at the copy: the jobs run in their own directory but with that code."""
    from gpuq.system import gitsnapshot  # copying a repository: only for --snapshot

    try:
        info = spool.snapshots.create(ids[0], ids, lambda dest: gitsnapshot.snapshot(repo, dest))
        here = gitsnapshot.snapshot_cwd(cwd, repo, info["path"])
    except ValueError as exc:
        raise EnqueueError(f"--snapshot: {exc}") from None
    real = os.path.realpath(repo)

    def copied(word: str) -> str:
        path = os.path.realpath(os.path.join(cwd, word))
        rel = os.path.relpath(path, real)
        copy = os.path.join(info["path"], rel)
        inside = rel != os.pardir and not rel.startswith(os.pardir + os.sep) and not word.startswith("-")
        return copy if inside and os.path.isfile(path) and os.path.isfile(copy) else word

    snap = {**{k: info[k] for k in ("path", "files", "bytes", "commit")}, "repo": repo, "cwd": here}
    return snap, [variant._replace(cmd=[copied(word) for word in variant.cmd]) for variant in variants]


def enqueue(spool: Spool, *, cmd: list[str], **common: Any) -> tuple[JobRef, Job]:
    return enqueue_many(spool, [Variant(cmd, common.pop("name", None))], **common)[0]


def enqueue_many(
    spool: Spool, variants: list[Variant], *, cwd: Union[str, os.PathLike], state: str = PENDING, **common: Any
) -> list[tuple[JobRef, Job]]:
    """Publish one job per variant, with consecutive ids, durably, in `state` (`check` has looked at
    their dependencies). All or nothing: should one fail (a full disk), those published are removed."""
    if not os.path.isdir(cwd):
        raise EnqueueError(f"directory not found: {cwd}")
    first = spool.ids.allocate(count=len(variants))
    cwd, options, env = os.fspath(cwd), common.pop("options", None) or {}, common.pop("env")
    if options.get("snapshot"):
        ids = list(range(first, first + len(variants)))
        snap, variants = _snapshot(spool, ids, options["snapshot"]["repo"], cwd, variants)
        options = dict(options, snapshot=snap)
        # modules beside the job's directory come from the copy too (PYTHONPATH first)
        before = env.get("PYTHONPATH") or (common["shell_env"] or os.environ).get("PYTHONPATH")
        env = dict(env, PYTHONPATH=snap["cwd"] + (os.pathsep + before if before else ""), GPUQ_SNAPSHOT=snap["path"])
    published: list[tuple[JobRef, Job]] = []
    for attempt in range(3):
        try:
            jobs = new_jobs(first, variants, cwd=cwd, options=options, env=env, log=spool.layout.log_path, **common)
            for job in jobs:
                published.append((spool.jobs.publish(job, state), job))
            break
        except BaseException as exc:
            for ref, _job in published:
                spool.jobs.remove(ref)
            published = []
            # a file moved in by hand took one of these ids since they were given out: the next
            # ones are taken (not with a snapshot: it is named by its first job)
            if not isinstance(exc, FileExistsError) or attempt == 2 or options.get("snapshot"):
                raise
            first = spool.ids.allocate(count=len(variants))
    spool.files.keep_emergency_room()  # a stat, unless the room was used up: then made again if it fits
    return published


def new_jobs(
    first: int,
    variants: list[Variant],
    *,
    cwd: str,
    options: Optional[dict[str, Any]] = None,
    code: Optional[CodeAnswer] = None,
    log: Callable[[int], str] = lambda _job_id: "",
    **common: Any,
) -> list[Job]:
    """The jobs of `variants`; `common`: schema.new_job's fields. `code`, git's answer, is read only
    here so that git runs meanwhile."""
    jobs = []
    options = dict(options or {})
    if code is not None:
        options["code"] = code()
    for job_id, variant in enumerate(variants, first):
        own = {**options, **(variant.options or {})}
        if own.get("sweep") is not None:
            own["sweep"] = dict(own["sweep"], id=first)
        name = variant.name or default_name(cwd, variant.cmd)
        job = schema.new_job(job_id=job_id, name=name, cmd=variant.cmd, cwd=cwd, log=log(job_id), options=own, **common)
        try:  # what every reader checks: a job that would be rejected once queued is refused now
            jobs.append(schema.validate(job))
        except schema.InvalidJob as exc:
            raise UsageError(f"cannot queue this job: {exc}") from None
    return jobs


# the options a job keeps as they were asked for
AS_ASKED = (
    "urgent", "preemptible", "ckpt_glob", "resume_arg", "cpus", "notify", "on_finish", "no_resume", "retry_oom",
)  # fmt: skip


class Prepared(NamedTuple):
    """A request checked and resolved: the jobs, `enqueue_many`'s fields, what the user should read."""

    variants: list[Variant]
    fields: dict[str, Any]
    notes: list[str]
    warnings: list[str]


def prepare(request: Request) -> Prepared:
    """UsageError for anything wrong."""
    if request.dir is not None and not request.dir.strip():  # `--dir "$DIR"` with DIR unset: not the current one
        raise UsageError(f"--dir: expected a value, got {request.dir!r}")
    cwd = os.path.abspath(os.path.expanduser(request.dir)) if request.dir else os.getcwd()
    if not os.path.isdir(cwd):
        interpreter.refuse_too_long("--dir", cwd)
        raise UsageError(f"directory not found: {cwd}")
    if not request.cmd:
        raise UsageError("say what to queue: a script or a command")
    for wrong, why in (
        (not 0 <= request.retries <= MAX_RETRIES, f"--retries must be from 0 to {MAX_RETRIES}"),
        (not 0 <= request.retry_oom <= MAX_RETRIES, f"--retry-oom must be from 0 to {MAX_RETRIES}"),
        (not 0 <= request.gpus <= MAX_GPUS, f"--gpus must be from 0 to {MAX_GPUS}"),
        (request.cpus is not None and request.cpus < 1, "--cpus must be 1 or more"),
        (request.gpu_mem is not None and request.gpus == 0, "--gpu-mem needs --gpus 1 or more (--gpus 0 is a CPU job)"),
        # `--conda "$ENV"` with ENV unset would run in the PATH's python: the wrong environment
        (request.conda is not None and not request.conda.strip(), f"--conda: expected a value, got {request.conda!r}"),
        (
            request.python is not None and not request.python.strip(),
            f"--python: expected a value, got {request.python!r}",
        ),
    ):
        if wrong:
            raise UsageError(why)
    if request.name is not None:
        try:
            schema.check_name(request.name)
        except schema.InvalidJob as exc:
            raise UsageError(f"--name: {exc}") from None
    guards, code = _safeguards(request, cwd)  # first: in a repository it starts git, which runs meanwhile
    variants, resolved = _variants(request, cwd)
    env = dict(request.env or {})
    notes = []
    if request.preemptible:
        from gpuq.engine.lifecycle import hf  # HF Trainer's preemption: it looks at the job's packages

        made = [hf.make_preemptible(variant.cmd, resolved.venv) for variant in variants]
        variants = [variant._replace(cmd=cmd) for variant, (cmd, _message) in zip(variants, made)]
        env[hf.PREEMPTIBLE_ENV] = "1"
        notes.append(f"preemptible: {made[-1][1]}")
    problem = request.resume_arg is not None and check_resume_arg(request.resume_arg)
    if problem:
        raise UsageError(problem)
    options = {
        **{key: getattr(request, key) for key in AS_ASKED},
        "conda": resolved.conda,
        "interpreter_from": resolved.found_by,
        "gpu_request": request.gpus,
        "gpu_mem_mib": usage(timespec.parse_memory_mib, request.gpu_mem, "--gpu-mem"),
        "mem_mib": usage(timespec.parse_memory_mib, request.mem, "--mem"),
        "notify_urls": notify_urls(request.notify_url),
        "max_log_bytes": usage(timespec.parse_typed_bytes, request.max_log_size, "--max-log-size"),
        "keep_checkpoints": _keep(request.keep_checkpoints),
        "min_free_bytes": usage(timespec.parse_typed_bytes, request.min_free, "--min-free"),
        **guards,
    }
    fields = {
        "cwd": cwd,
        "venv": resolved.venv,
        "env": env,
        "shell_env": dict(os.environ if request.shell_env is None else request.shell_env),
        "after": list(request.after),
        "after_any": list(request.after_any),
        "retries": request.retries,
        "priority": request.priority,
        "options": options,
        "code": code,
        "umask": current_umask() if request.umask is None else request.umask,
        "state": HELD if request.hold else PENDING,
    }
    hint = interpreter.uv_hint(cwd, resolved)
    return Prepared(variants, fields, notes, [hint] if hint else [])


def notify_urls(urls: Sequence[str], who: str = "gpuq add") -> list[str]:
    """`--notify URL` of `add`, `run` and `edit`: refused where Apprise cannot be imported or does not
    know the URL (the job would end with nobody told)."""
    for url in urls:
        if not is_url(url):
            raise UsageError(f"--notify: not a URL such as ntfy://my-topic: {url!r}")
    if urls:
        from gpuq.system.extras import notify_missing, unknown_to_apprise  # notifications: only with --notify URL

        missing = notify_missing()
        if missing:
            exc = Refused(f"--notify {urls[0]}: {missing}")
            exc.prefix = who
            raise exc
        unknown = unknown_to_apprise(urls)
        if unknown:  # refused now: it would fail only once the job has ended, with nobody told
            error = UsageError(f"--notify: not a URL Apprise knows (a misspelt scheme?): {url_text(unknown)}")
            error.prefix = who
            raise error
    return list(dict.fromkeys(urls))


def check(spool: Spool, prepared: Prepared, views: Any = None, gpus: bool = True) -> None:
    """Refused before anything is written: a job this machine (or the user's cap on it) can never
    start, a dependency that is no job."""
    options = prepared.fields["options"]
    if gpus and (options["gpu_request"] > 1 or options["gpu_mem_mib"] is not None):
        problem = gpuview.never_fits(spool, options["gpu_request"], options["gpu_mem_mib"], views)
        if problem:
            raise UsageError(problem)
    for variant in prepared.variants[:1]:  # the variants differ in arguments, not in where they write
        problem = diskguard.never_fits(
            options["min_free_bytes"], variant.cmd, prepared.fields["cwd"], options["ckpt_glob"]
        )
        if problem:
            raise UsageError(f"{problem}: this job could never start")
    for key in ("after", "after_any"):
        missing = missing_jobs(spool, prepared.fields[key])
        if missing:
            raise Refused(f"--{key.replace('_', '-')}: no such job {missing}")


def publish(spool: Spool, prepared: Prepared) -> list[tuple[JobRef, Job]]:
    check(spool, prepared)
    return enqueue_many(spool, prepared.variants, **prepared.fields)


def running_jobs(spool: Spool) -> list[Job]:
    return [job for _ref, job in spool.jobs.load_many(RUNNING)]


def urgent_outlook(job: Job, running: list[Job], free_now: bool) -> str:
    """`free_now`: a slot it fits is free (dryrun.starts_now, asked before it was queued)."""
    if free_now:
        return "urgent: first in line, and a slot it fits is free: it starts now, preempting nothing"
    from gpuq.engine.schedule import victims  # urgent preemption: it looks at running jobs' checkpoints

    return victims.foreseen(job, running)


def _variants(request: Request, cwd: str) -> tuple[list[Variant], interpreter.Resolved]:
    """The job to queue, or with --sweep one per combination of values, its command resolved."""
    conda = interpreter.find_conda(request.conda, request.shell_env or os.environ) if request.conda else None

    def resolve(words: Sequence[str]) -> interpreter.Resolved:
        env = request.shell_env
        return interpreter.resolve_command(words[0], list(words[1:]), cwd, request.python, conda, env)

    if not request.sweep:
        resolved = resolve(request.cmd)
        return [Variant(resolved.cmd, request.name)], resolved
    try:
        combinations = sweep.expand(
            [sweep.parse_sweep(t) for t in request.sweep], list(request.cmd), allow_more=request.yes
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    variants = []
    for combination in combinations:
        resolved = resolve(combination.words)
        name = sweep.sweep_name(request.name or default_name(cwd, resolved.cmd), combination.values)
        variants.append(Variant(resolved.cmd, name, {"sweep": {"id": 0, "values": combination.values}}))
    return variants, resolved


def usage(parse: Callable[..., T], text: Optional[str], *more: Any) -> Optional[T]:
    """`parse(text, *more)`, None for None; its ValueError a UsageError."""
    try:
        return None if text is None else parse(text, *more)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _keep(value: Any) -> Any:
    """--keep-checkpoints as asked (the CLI gives it parsed; the MCP server's tool as text)."""
    try:
        return None if value is None else parse_keep(value)
    except ValueError as exc:
        raise UsageError(f"--keep-checkpoints: {exc}") from None


def _safeguards(request: Request, cwd: str) -> tuple[dict[str, Any], Optional[CodeAnswer]]:
    out: dict[str, Any] = {}
    if request.time is not None:
        out["time_limit"] = usage(timespec.parse_duration, request.time, "--time")
    if request.begin is not None:
        out["begin_at"] = usage(lambda text: iso_of(timespec.parse_begin(text, time.time(), "--begin")), request.begin)
    if not any(os.path.exists(os.path.join(directory, ".git")) for directory in upward(cwd)):
        if request.snapshot:
            raise UsageError(f"--snapshot needs a git repository; {cwd} is not in one")
        return out, None
    from gpuq.system import gitinfo  # git: only inside a repository

    asked = gitinfo.ask(cwd)  # read where the jobs are written (new_jobs): git runs meanwhile
    if request.snapshot:
        code = asked.answer()  # kept: new_jobs reads the same answer
        if code is None:
            raise UsageError(f"--snapshot: git cannot read the repository of {cwd}")
        out["snapshot"] = {"repo": code["repo"]}  # copied once the job has its id
    return out, asked.answer
