"""Turning what a user asked for (`gpuq add ...` or a hand-dropped file) into a queued job.

`gpuq add`: its `Request` is checked and resolved by `prepare` (no spool needed: a bad request
leaves none behind), then `publish` queues the jobs. Directories are plain strings (os.path):
`gpuq add` does not import pathlib (bench/PROFILE.md).
"""

from __future__ import annotations

import os
import time

from gpuq.core import schema
from gpuq.core.errors import Refused, UsageError
from gpuq.core.job import Job, is_url
from gpuq.core.states import HELD, PENDING, RUNNING, SOURCE_CLI
from gpuq.engine.lifecycle import interpreter
from gpuq.engine.lifecycle.interpreter import EnqueueError, upward
from gpuq.spool import JobRef, Spool

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional

    from gpuq.system.fsutil import StrPath
    from gpuq.system.gitstate import CacheFiles


def default_name(cwd: StrPath, cmd: list[str]) -> str:
    """`<dir name>/<script stem>`, as the original gpuq named jobs (`root/...` in `/`)."""
    stem = schema.display_script(cmd).rsplit(".", 1)[0] or "job"
    return f"{os.path.basename(os.path.normpath(cwd)) or 'root'}/{stem}"


def missing_jobs(spool: Spool, ids: list[int]) -> str:
    """ "#7, #9" for the ids that name no job in the spool, "" when all exist."""
    if not ids:
        return ""  # listing every state costs ~0.1 s per 100,000 finished jobs: only when needed
    known = set(spool.jobs.index())
    return ", ".join(f"#{i}" for i in ids if i not in known)


class NoSuchDependency(Refused):
    """--after names a job that does not exist."""


def _snapshot(spool: Spool, first: int, ids: list[int], repo: str, cwd: StrPath) -> dict[str, Any]:
    """Copy the repository's tracked files now (`add --snapshot`): the jobs run this code."""
    from gpuq.system import gitinfo  # git, only for --snapshot

    try:
        info = spool.snapshots.create(first, ids, lambda dest: gitinfo.snapshot(repo, dest))
        here = gitinfo.snapshot_cwd(os.fspath(cwd), repo, info["path"])
    except ValueError as exc:
        raise EnqueueError(f"--snapshot: {exc}") from None
    keep = ("path", "files", "bytes", "commit")
    return {**{k: info[k] for k in keep}, "repo": repo, "cwd": here}


def _snapshot_cmd(cmd: list[str], cwd: StrPath, snap: dict[str, Any]) -> list[str]:
    """The command with every argument that names a file of the repository (the script, a config)
    pointing at its copy: the job runs in its own directory, with its data and outputs, but the
    code it was queued with."""
    from pathlib import Path  # only for --snapshot

    base = Path(cwd)
    out = []
    for word in cmd:
        path = (base / word) if not os.path.isabs(word) else Path(word)
        inside = not word.startswith("-") and path.is_file() and _within(path, snap["repo"])
        copy = Path(snap["path"]) / os.path.relpath(os.path.realpath(path), os.path.realpath(snap["repo"]))
        out.append(str(copy) if inside and copy.is_file() else word)
    return out


def _within(path: StrPath, repo: str) -> bool:
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(repo))
    return not (rel == os.pardir or rel.startswith(os.pardir + os.sep))


def _snapshot_env(snap: dict[str, Any], env: dict[str, str], shell_env: Optional[dict[str, str]]) -> dict[str, str]:
    """Modules beside the job's directory come from the copy too (PYTHONPATH first)."""
    before = env.get("PYTHONPATH") or (shell_env or os.environ).get("PYTHONPATH")
    return {"PYTHONPATH": snap["cwd"] + (os.pathsep + before if before else ""), "GPUQ_SNAPSHOT": snap["path"]}


def _own(common: Optional[dict[str, Any]], own: dict[str, Any], first: int) -> dict[str, Any]:
    """A variant's fields: a sweep is named by the id of its first job."""
    out = {**(common or {}), **own}
    if out.get("sweep") is not None:
        out["sweep"] = dict(out["sweep"], id=first)
    return out


class Variant:
    """One job of an `add`: its command, name and fields of its own (a sweep has several). A plain
    class (see scheduler.QueueState)."""

    __slots__ = ("cmd", "name", "options")

    def __init__(self, cmd: list[str], name: Optional[str] = None, options: Optional[dict[str, Any]] = None) -> None:
        self.cmd, self.name, self.options = cmd, name, {} if options is None else options


def enqueue(spool: Spool, *, cmd: list[str], **common: Any) -> tuple[JobRef, dict[str, Any]]:
    """Allocate an id and publish the job durably in pending/ (see enqueue_many)."""
    return enqueue_many(spool, [Variant(cmd, common.pop("name", None))], **common)[0]


def enqueue_many(
    spool: Spool,
    variants: list[Variant],
    *,
    cwd: StrPath,
    venv: Optional[str],
    env: dict[str, str],
    shell_env: Optional[dict[str, str]],
    after: list[int],
    after_any: list[int],
    retries: int,
    priority: int = 0,
    source: str = SOURCE_CLI,
    options: Optional[dict[str, Any]] = None,
    umask: Optional[int] = None,
    state: str = PENDING,
) -> list[tuple[JobRef, dict[str, Any]]]:
    """Publish one job per variant, with consecutive ids, durably, in `state` (pending/, or held/
    for `add --hold`). All or nothing: should one fail (a full disk), those published are removed."""
    if not os.path.isdir(cwd):
        raise EnqueueError(f"directory not found: {cwd}")
    missing = missing_jobs(spool, after + after_any)
    if missing:
        raise NoSuchDependency(f"--after: no such job {missing}")
    first = spool.ids.allocate(count=len(variants))
    ids = list(range(first, first + len(variants)))
    if (options or {}).get("snapshot"):
        options = dict(options or {})
        options["snapshot"] = _snapshot(spool, first, ids, options["snapshot"]["repo"], cwd)
        env = dict(env, **_snapshot_env(options["snapshot"], env, shell_env))
        for variant in variants:
            variant.cmd = _snapshot_cmd(variant.cmd, cwd, options["snapshot"])
    published: list[tuple[JobRef, dict[str, Any]]] = []
    try:
        for job_id, variant in enumerate(variants, first):
            job = schema.new_job(
                job_id=job_id,
                name=variant.name or default_name(cwd, variant.cmd),
                cmd=variant.cmd,
                cwd=os.fspath(cwd),
                log=str(spool.layout.log_path(job_id)),
                env=env,
                shell_env=shell_env,
                venv=venv,
                after=after,
                after_any=after_any,
                retries=retries,
                priority=priority,
                source=source,
                options=_own(options, variant.options, first),
                umask=umask,
            )
            published.append((spool.jobs.publish(job, state), job))
    except BaseException:
        for ref, _job in published:
            spool.jobs.remove(ref)
        raise
    spool.files.keep_emergency_room()  # a stat, unless the room was used up: then made again if it fits
    return published


# ---- `gpuq add` ------------------------------------------------------------------------------


class Request:
    """What `gpuq add` asks for: SCRIPT, ARGS and each `add` option, by its name in cli/options.py
    and as its converter gives it (text, lists of ids, KEY=VALUE pairs), with the user's umask and
    environment (taken before the spool sets gpuq's own umask). A plain class (see scheduler.QueueState)."""

    OPTIONS = (
        "script",
        "args",
        "dir",
        "python",
        "conda",
        "name",
        "after",
        "after_any",
        "retries",
        "sweep",
        "yes",
        "hold",
    )
    OPTIONS += ("time", "begin", "snapshot", "gpus", "notify", "max_log_size", "on_finish", "gpu_mem", "priority")
    OPTIONS += ("urgent", "preemptible", "ckpt_glob", "no_resume", "resume_arg", "env", "mem", "cpus", "notify_url")
    __slots__ = (*OPTIONS, "umask", "shell_env")

    def __init__(self, options: dict[str, Any], umask: int, shell_env: dict[str, str]) -> None:
        for name in self.OPTIONS:
            setattr(self, name, options[name])
        self.umask, self.shell_env = umask, shell_env


class Prepared:
    """A request checked and resolved: the jobs to queue (`variants`), what `enqueue_many` is told
    of all of them (`fields`), and what the user should read before they are queued (`notes`; on
    stderr, `warnings`)."""

    __slots__ = ("variants", "fields", "notes", "warnings")

    def __init__(self, variants: list[Variant], fields: dict[str, Any], notes: list[str], warnings: list[str]) -> None:
        self.variants, self.fields, self.notes, self.warnings = variants, fields, notes, warnings


def _notify_urls(urls: list[str]) -> list[str]:
    """`--notify URL`s, each once, in the order given; refused where Apprise, which sends them,
    cannot be imported (the job would end with nobody told)."""
    for url in urls:
        if not is_url(url):
            raise UsageError(f"--notify: not a URL such as ntfy://my-topic: {url!r}")
    if urls:
        from gpuq.system.extras import notify_missing  # only with --notify URL

        missing = notify_missing()
        if missing:
            exc = Refused(f"--notify {urls[0]}: {missing}")
            exc.prefix = "gpuq add"
            raise exc
    return list(dict.fromkeys(urls))


def prepare(request: Request, git_cache: Optional[CacheFiles] = None) -> Prepared:
    """Check `request` and resolve its commands; UsageError (one line) for anything wrong, before
    anything is queued. `git_cache`: where git's answer about the code is kept (default: the
    spool's cache/; a dry run passes one that writes nothing)."""
    cwd = os.path.abspath(os.path.expanduser(request.dir)) if request.dir else os.getcwd()
    if not os.path.isdir(cwd):
        raise UsageError(f"directory not found: {cwd}")
    if request.retries < 0:
        raise UsageError("--retries must be 0 or more")
    if request.name is not None:
        try:
            schema.check_name(request.name)
        except schema.InvalidJob as exc:
            raise UsageError(f"--name: {exc}") from None
    variants, resolved = _variants(request, cwd)
    venv = resolved.venv
    env = dict(request.env)
    options, notes = _preempt_options(request, variants, venv, env)
    options.update(conda=resolved.conda, interpreter_from=resolved.found_by)
    options.update(_gpu_options(request))
    options.update(_host_options(request))
    options.update(notify=request.notify, on_finish=request.on_finish, no_resume=request.no_resume)
    options["notify_urls"] = _notify_urls(request.notify_url)
    if request.max_log_size is not None:
        options["max_log_bytes"] = _size_bytes(request.max_log_size, "--max-log-size")
    options.update(_safeguards(request, cwd, git_cache))
    fields = {
        "cwd": cwd,
        "venv": venv,
        "env": env,
        "shell_env": request.shell_env,
        "after": [i for ids in request.after for i in ids],
        "after_any": [i for ids in request.after_any for i in ids],
        "retries": request.retries,
        "priority": request.priority,
        "options": options,
        "umask": request.umask,
        "state": HELD if request.hold else PENDING,
    }
    hint = interpreter.uv_hint(cwd, resolved)
    return Prepared(variants, fields, notes, [hint] if hint else [])


def publish(spool: Spool, prepared: Prepared) -> list[tuple[JobRef, dict[str, Any]]]:
    """Queue the prepared jobs (see enqueue_many); refused if this machine can never run them."""
    options = prepared.fields["options"]
    if options["gpu_request"] > 1 or options["gpu_mem_mib"] is not None:  # only then are the GPUs looked at
        from gpuq.engine.schedule import gpuview

        problem = gpuview.never_fits(spool, options["gpu_request"], options["gpu_mem_mib"])
        if problem:
            raise UsageError(f"{problem}: this job could never start")
    return enqueue_many(spool, prepared.variants, **prepared.fields)


def running_jobs(spool: Spool) -> list[Job]:
    return [job for _ref, job in spool.jobs.load_many(RUNNING)]


def urgent_outlook(job: Job, running: list[Job]) -> str:
    """What an urgent job will do if no slot is free when a worker looks: which of the `running`
    jobs it would preempt and how that job goes on, or that it waits."""
    from gpuq.engine.schedule import victims  # only for --urgent: it may look at running jobs' checkpoints

    return victims.foreseen(job, running)


def _variants(request: Request, cwd: str) -> tuple[list[Variant], interpreter.Resolved]:
    """The job to queue, or with --sweep one per combination of values: its command resolved (the
    interpreter, its environment), its name, and its sweep values. Nothing is queued if any is wrong."""
    words = [request.script, *request.args]
    conda = interpreter.find_conda(request.conda, request.shell_env) if request.conda else None

    def resolve(words: list[str]) -> interpreter.Resolved:
        return interpreter.resolve_command(words[0], words[1:], cwd, request.python, conda, request.shell_env)

    if not request.sweep:
        resolved = resolve(words)
        return [Variant(resolved.cmd, request.name)], resolved
    from gpuq.core import sweep  # only for --sweep (it imports re and collections)

    try:
        combinations = sweep.expand([sweep.parse_sweep(t) for t in request.sweep], words, allow_more=request.yes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    variants = []
    for combination in combinations:
        resolved = resolve(combination.words)
        name = sweep.sweep_name(request.name or default_name(cwd, resolved.cmd), combination.values)
        variants.append(Variant(resolved.cmd, name, {"sweep": {"id": 0, "values": combination.values}}))
    return variants, resolved


def _preempt_options(
    request: Request, variants: list[Variant], venv: Optional[str], env: dict[str, str]
) -> tuple[dict[str, Any], list[str]]:
    """The job fields for --urgent/--preemptible/--ckpt-glob/--resume-arg, and a note for the user;
    --preemptible may add a flag to the commands and adds GPUQ_PREEMPTIBLE=1 to `env`."""
    options: dict[str, Any] = {
        "urgent": request.urgent,
        "preemptible": request.preemptible,
        "ckpt_glob": request.ckpt_glob,
    }
    if request.resume_arg is not None:
        from gpuq.core.resume_arg import check_resume_arg

        problem = check_resume_arg(request.resume_arg)
        if problem:
            raise UsageError(problem)
        options["resume_arg"] = request.resume_arg
    if not request.preemptible:
        return options, []
    from gpuq.engine.lifecycle import hf

    message = ""
    for variant in variants:
        variant.cmd, message = hf.make_preemptible(variant.cmd, venv)
    env[hf.PREEMPTIBLE_ENV] = "1"
    return options, [f"preemptible: {message}"]


def _gpu_options(request: Request) -> dict[str, Any]:
    """--gpus N and --gpu-mem SIZE (whether this machine can ever meet them: `publish`)."""
    mem = _size_mib(request.gpu_mem, "--gpu-mem")
    if mem is not None and request.gpus == 0:
        raise UsageError("--gpu-mem needs --gpus 1 or more (--gpus 0 is a CPU job)")
    return {"gpu_request": request.gpus, "gpu_mem_mib": mem}


def _host_options(request: Request) -> dict[str, Any]:
    """--mem SIZE and --cpus N: what the job reserves of the machine while it runs."""
    return {"mem_mib": _size_mib(request.mem, "--mem"), "cpus": request.cpus}


def _size_mib(text: Optional[str], flag: str) -> Optional[int]:
    """A size option (20G) in MiB, or None when not given."""
    if text is None:
        return None
    from gpuq.core import timespec  # a plain `add` parses no size

    try:
        return timespec.parse_memory_mib(text, flag)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _safeguards(request: Request, cwd: str, git_cache: Optional[CacheFiles] = None) -> dict[str, Any]:
    """--time, --begin, and the code the job was queued with (--snapshot: a copy of it)."""
    out: dict[str, Any] = {}
    if request.time is not None or request.begin is not None:
        from gpuq.core import timespec
    try:
        if request.time is not None:
            out["time_limit"] = timespec.parse_duration(request.time, "--time")
        if request.begin is not None:
            from gpuq.core.times import iso_of

            out["begin_at"] = iso_of(timespec.parse_begin(request.begin, time.time(), "--begin"))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not _in_git_work_tree(cwd):
        if request.snapshot:
            raise UsageError(f"--snapshot needs a git repository; {cwd} is not in one")
        return out
    from gpuq.system import gitinfo  # only inside a repository

    # git runs only when the work tree changed since it last answered: its answer is kept in the
    # spool's cache/, read (and written) here without creating the spool, which is opened later
    out["code"] = gitinfo.provenance(cwd, cache=Spool().cache if git_cache is None else git_cache)
    if request.snapshot and out["code"] is None:
        raise UsageError(f"--snapshot: git cannot read the repository of {cwd}")
    if request.snapshot:
        out["snapshot"] = {"repo": out["code"]["repo"]}  # copied once the job has its id
    return out


def _in_git_work_tree(cwd: str) -> bool:
    """A `.git` in `cwd` or above it: a stat per level, so that `add` outside a repository does
    not pay for starting git."""
    return any(os.path.exists(os.path.join(directory, ".git")) for directory in upward(cwd))


def _size_bytes(text: str, flag: str) -> int:
    from gpuq.core import timespec

    try:
        return timespec.parse_size_bytes(text, flag)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
