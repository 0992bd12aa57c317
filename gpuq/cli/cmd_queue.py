"""`gpuq add`, `cancel`, `kill`, `retry`, `recover`, `clear`: call the library, print the result."""

from __future__ import annotations

import os
import sys
import time

from gpuq.cli.common import each_id, job_ids, spool
from gpuq.core import schema
from gpuq.core.errors import Refused, UsageError
from gpuq.core.states import HELD, INTERRUPTED, PENDING, RUNNING
from gpuq.core.timespec import parse_size_bytes, parse_size_mib
from gpuq.engine.lifecycle import enqueue
from gpuq.system import procs

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional

    from gpuq.spool import Spool


def cmd_add(args: argparse.Namespace) -> int:
    user_umask = procs.current_umask()  # before the spool sets gpuq's own 077
    cwd = os.path.abspath(os.path.expanduser(args.dir)) if args.dir else os.getcwd()
    if not os.path.isdir(cwd):
        raise UsageError(f"directory not found: {cwd}")
    if args.retries < 0:
        raise UsageError("--retries must be 0 or more")
    if args.name is not None:
        try:
            schema.check_name(args.name)
        except schema.InvalidJob as exc:
            raise UsageError(f"--name: {exc}") from None
    variants, venv = _variants(args, cwd)
    options = _preempt_options(args, variants, venv)  # before env is read: it may add to it
    options.update(_gpu_options(args), notify=args.notify, on_finish=args.on_finish, no_resume=args.no_resume)
    if args.max_log_size is not None:
        options["max_log_bytes"] = _bytes(args.max_log_size, "--max-log-size")
    options.update(_safeguards(args, cwd))
    published = enqueue.enqueue_many(
        spool(),
        variants,
        cwd=cwd,
        venv=venv,
        env=dict(args.env),
        shell_env=dict(os.environ),
        after=[i for ids in args.after for i in ids],
        after_any=[i for ids in args.after_any for i in ids],
        retries=args.retries,
        priority=args.priority,
        options=options,
        umask=user_umask,
        state=HELD if args.hold else PENDING,
    )
    for _ref, job in published:
        if args.quiet:
            print(job["id"])
            continue
        deps = job["after"] + job["after_any"]
        after = f"  after {', '.join(f'#{d}' for d in deps)}" if deps else ""
        print(f"[+] Job #{job['id']}: {job['name']}{after}{'  (held)' if args.hold else ''}")
    if args.urgent and not args.quiet and not args.hold:
        from gpuq.engine.schedule import victims  # only for --urgent: it may look at running jobs' checkpoints

        running = [job for _ref, job in spool().jobs.load_many(RUNNING)]
        print(f"    {victims.foreseen(published[0][1], running)}")
    return 0


def _variants(args: argparse.Namespace, cwd: str) -> tuple[list[enqueue.Variant], Optional[str]]:
    """The job to queue, or with --sweep one per combination of values: its command resolved (the
    interpreter, the venv), its name, and its sweep values. Nothing is queued if any is wrong."""
    words = [args.script, *args.args]
    if not args.sweep:
        cmd, venv = enqueue.resolve_command(words[0], words[1:], cwd, args.python)
        return [enqueue.Variant(cmd, args.name)], venv
    from gpuq.core import sweep  # only for --sweep (it is a dataclass module)

    try:
        combinations = sweep.expand([sweep.parse_sweep(text) for text in args.sweep], words, allow_more=args.yes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    variants, venv = [], None
    for combination in combinations:
        cmd, venv = enqueue.resolve_command(combination.words[0], combination.words[1:], cwd, args.python)
        name = sweep.sweep_name(args.name or enqueue.default_name(cwd, cmd), combination.values)
        variants.append(enqueue.Variant(cmd, name, {"sweep": {"id": 0, "values": combination.values}}))
    return variants, venv


def _preempt_options(args: argparse.Namespace, variants: list[enqueue.Variant], venv: Optional[str]) -> dict[str, Any]:
    """The job fields for --urgent/--preemptible/--ckpt-glob/--resume-arg (--preemptible may add a
    flag to the commands and GPUQ_PREEMPTIBLE=1 to args.env)."""
    options: dict[str, Any] = {"urgent": args.urgent, "preemptible": args.preemptible, "ckpt_glob": args.ckpt_glob}
    if args.resume_arg is not None:
        from gpuq.core.resume_arg import check_resume_arg

        problem = check_resume_arg(args.resume_arg)
        if problem:
            raise UsageError(problem)
        options["resume_arg"] = args.resume_arg
    if args.preemptible:
        from gpuq.engine.lifecycle import hf

        message = ""
        for variant in variants:
            variant.cmd, message = hf.make_preemptible(variant.cmd, venv)
        args.env.append((hf.PREEMPTIBLE_ENV, "1"))
        if not args.quiet:
            print(f"preemptible: {message}")
    return options


def _gpu_options(args: argparse.Namespace) -> dict[str, Any]:
    """--gpus N and --gpu-mem SIZE; a request this machine can never meet is refused here."""
    mem = None
    if args.gpu_mem is not None:
        try:
            mem = parse_size_mib(args.gpu_mem, "--gpu-mem")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.gpus == 0:
            raise UsageError("--gpu-mem needs --gpus 1 or more (--gpus 0 is a CPU job)")
    problem = None
    if args.gpus > 1 or mem is not None:  # only such a request needs the GPUs looked at
        from gpuq.engine.schedule import gpuview

        problem = gpuview.never_fits(spool(), args.gpus, mem)
    if problem:
        raise UsageError(f"{problem}: this job could never start")
    return {"gpu_request": args.gpus, "gpu_mem_mib": mem}


def _safeguards(args: argparse.Namespace, cwd: str) -> dict[str, Any]:
    """--time, --begin, and the code the job was queued with (--snapshot: a copy of it)."""
    from gpuq.core import timespec

    out: dict[str, Any] = {}
    try:
        if args.time is not None:
            out["time_limit"] = timespec.parse_duration(args.time, "--time")
        if args.begin is not None:
            from gpuq.core.times import iso_of

            out["begin_at"] = iso_of(timespec.parse_begin(args.begin, time.time(), "--begin"))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not _in_git_work_tree(cwd):
        if args.snapshot:
            raise UsageError(f"--snapshot needs a git repository; {cwd} is not in one")
        return out
    from gpuq.system import gitinfo  # subprocess and git: only inside a repository

    out["code"] = gitinfo.provenance(cwd)
    if args.snapshot and out["code"] is None:
        raise UsageError(f"--snapshot: git cannot read the repository of {cwd}")
    if args.snapshot:
        out["snapshot"] = {"repo": out["code"]["repo"]}  # copied once the job has its id
    return out


def _in_git_work_tree(cwd: str) -> bool:
    """A `.git` in `cwd` or above it: a stat per level, so that `add` outside a repository does
    not pay for starting git."""
    return any(os.path.exists(os.path.join(directory, ".git")) for directory in enqueue.upward(cwd))


def _bytes(text: str, flag: str) -> int:
    try:
        return parse_size_bytes(text, flag)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_cancel(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import actions  # here: `gpuq add` must not import it

    sp = spool()

    def cancel(job_id: int) -> None:
        killed = []  # a running job is killed first, as Slurm's scancel does

        def killing() -> None:
            killed.append(job_id)
            _say_killing(job_id, actions.KILL_GRACE_SECONDS)

        job = actions.cancel(sp, job_id, killing)
        if killed:
            print(f"[-] Job #{job_id}: {job['name']} cancelled: it was running, killed (exit {job.get('exit_code')})")
            return
        where = f" (scancel of Slurm job {job['slurm']['job_id']})" if job.get("slurm") else ""
        print(f"[-] Job #{job_id}: {job['name']} cancelled{where}")

    return each_id(job_ids(args.ids), cancel)


def cmd_hold(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import actions  # here: `gpuq add` must not import it

    sp = spool()

    def hold(job_id: int) -> None:
        job = actions.hold(sp, job_id)
        print(f"[=] Job #{job_id}: {job['name']} held (`gpuq release {job_id}` puts it back in line)")

    return each_id(job_ids(args.ids), hold)


def cmd_release(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import actions  # here: `gpuq add` must not import it

    sp = spool()

    def release(job_id: int) -> None:
        job = actions.release(sp, job_id)
        print(f"[+] Job #{job_id}: {job['name']} back in line")

    return each_id(job_ids(args.ids), release)


def cmd_edit(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import edit

    sp = spool()
    fields, rev = edit.read(sp, args.id)
    changed = edit.with_pairs(fields, args.set) if args.set else _in_editor(fields, args.id)
    if changed == fields:
        print(f"job #{args.id}: nothing changed")
        return 0
    job = edit.apply(sp, args.id, changed, rev)
    print(f"[~] Job #{args.id}: {job['name']} changed: " + ", ".join(k for k in changed if changed[k] != fields.get(k)))
    return 0


def _in_editor(fields: dict[str, Any], job_id: int) -> dict[str, Any]:
    """`fields` as edited by the person in $VISUAL or $EDITOR (a copy in a temporary file)."""
    import json
    import shlex
    import subprocess
    import tempfile
    from pathlib import Path

    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory(prefix="gpuq-edit-") as tmp:
        path = Path(tmp) / f"job-{job_id}.json"
        path.write_text(json.dumps(fields, indent=2, ensure_ascii=False) + "\n")
        try:
            code = subprocess.call([*shlex.split(editor), str(path)])
        except OSError as exc:
            raise UsageError(f"cannot run the editor {editor!r}: {exc.strerror or exc}") from None
        if code != 0:
            raise UsageError(f"the editor exited with {code}; job #{job_id} not changed")
        try:
            edited = json.loads(path.read_text())
        except ValueError as exc:
            raise Refused(f"job #{job_id} not changed: the edited file is not JSON: {exc}") from None
    if not isinstance(edited, dict):
        raise Refused(f"job #{job_id} not changed: the edited file must hold a JSON object")
    return edited


def cmd_kill(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import actions  # here: `gpuq add` must not import it

    sp = spool()

    def kill(job_id: int) -> None:
        actions.get(sp, job_id, (RUNNING,))  # refused before anything is said or sent
        _say_killing(job_id, actions.KILL_GRACE_SECONDS)
        job = actions.kill(sp, job_id)
        print(f"[-] Job #{job_id}: {job['name']} killed (exit {job.get('exit_code')})")

    return each_id(job_ids(args.ids), kill)


def _say_killing(job_id: int, grace: float) -> None:
    print(f"sending SIGTERM to job #{job_id}'s process group (SIGKILL after {grace:.0f}s)...", flush=True)


def cmd_retry(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import actions  # here: `gpuq add` must not import it

    sp = spool()

    def retry(job_id: int) -> None:
        job, how = actions.retry(sp, job_id, args.from_scratch)
        print(f"[+] Job #{job_id}: {job['name']} back in the queue: {how.text()}")

    return each_id(job_ids(args.ids), retry)


def cmd_clear(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import actions  # here: `gpuq add` must not import it

    report = actions.clear(spool(), logs_only=args.logs)
    freed = f"{report.freed_bytes / (1 << 20):.1f} MiB"
    if args.logs:
        print(f"dropped the logs of {len(report.logs_dropped)} finished job(s), freeing {freed}")
        return 0
    print(f"removed {len(report.removed)} finished job(s), freeing {freed}")
    if report.kept_for_dependents:
        print("kept (waiting jobs depend on them): " + ", ".join(f"#{i}" for i in sorted(report.kept_for_dependents)))
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import actions  # here: `gpuq add` must not import it

    sp = spool()
    if args.all or args.jobs:
        ids = job_ids(args.jobs) if args.jobs else [job["id"] for job in actions.interrupted(sp)]
        back, code = _recover(sp, ids, args.from_scratch, say=True)
        print(f"Re-queued {back} job(s)." + (" Run `gpuq run` to execute." if back else ""))
        return code
    plans = actions.recovery_plans(sp, args.from_scratch)
    if not plans:
        print("no interrupted jobs")
        return 0
    for job, how in plans:  # what will happen, before it happens
        print(f"  #{job['id']} {job['name']}: {how.text()}  ({job.get('note') or INTERRUPTED})")
    if not sys.stdin.isatty():
        flag = " --from-scratch" if args.from_scratch else ""
        print(f"would re-queue {len(plans)} job(s); run `gpuq recover --all{flag}` (or --jobs ID...) to do it")
        return 0
    if input(f"Re-queue these {len(plans)} job(s)? [y/N] ").strip().lower() not in ("y", "yes"):
        return 0
    back, code = _recover(sp, [job["id"] for job, _how in plans], args.from_scratch, say=False)
    print(f"Re-queued {back} job(s).")
    return code


def _recover(sp: Spool, ids: list[int], from_scratch: bool, say: bool) -> tuple[int, int]:
    """Each interrupted job of `ids` back in the queue: (how many went back, the exit code)."""
    from gpuq.engine.lifecycle import actions

    back = []

    def recover(job_id: int) -> None:
        for job, how in actions.recover(sp, [job_id], from_scratch):
            back.append(job_id)
            if say:
                print(f"  #{job['id']} {job['name']}: {how.text()}")

    code = each_id(ids, recover)
    return len(back), code
