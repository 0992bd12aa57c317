"""`gpuq add`, `cancel`, `kill`, `retry`, `recover`, `clear`: call the library, print the result."""

from __future__ import annotations

import os
import sys

from gpuq.cli.common import each_id, job_ids, spool
from gpuq.core.errors import Refused, UsageError
from gpuq.core.states import FINISHED, HELD, INTERRUPTED, RUNNING
from gpuq.core.words import ids_text, plural
from gpuq.engine.lifecycle import enqueue
from gpuq.system import procs

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional

    from gpuq.spool import Spool


def cmd_add(args: argparse.Namespace) -> int:
    if args.json and not args.dry_run:
        raise UsageError("--json goes with --dry-run (a real add prints the ids with -q)")
    # the user's umask, before the spool sets gpuq's own; the request checked before the spool is opened
    request = _request(args)
    if args.dry_run:
        return _dry_run(request, args.json)
    prepared = enqueue.prepare(request)
    for note in [] if args.quiet else prepared.notes:
        print(note)
    for warning in prepared.warnings:  # also with -q: the job would likely fail, and stdout keeps only the id
        print(warning, file=sys.stderr)
    sp = spool()
    outlook = args.urgent and not args.quiet and not args.hold
    # the running jobs as they are before it is queued: a watching worker may preempt one at once
    running = enqueue.running_jobs(sp) if outlook else []
    published = enqueue.publish(sp, prepared)
    for _ref, job in published:
        if args.quiet:
            print(job.id)
            continue
        deps = job.after + job.after_any
        after = f"  after {', '.join(f'#{d}' for d in deps)}" if deps else ""
        print(f"[+] Job #{job.id}: {job.name}{after}{'  (held)' if args.hold else ''}")
    if outlook:
        print(f"    {enqueue.urgent_outlook(published[0][1], running)}")
    if not args.quiet and not args.hold:
        _say_who_starts_it(sp.workers.live(), [job.id for _ref, job in published])
    return 0


def _request(args: Any, shell_env: Optional[dict[str, str]] = None) -> enqueue.Request:
    """`add`'s request: its options, this process's umask (before the spool sets gpuq's own),
    the environment it is queued from (default: this process's)."""
    env = dict(os.environ if shell_env is None else shell_env)
    return enqueue.Request(vars(args), umask=procs.current_umask(), shell_env=env)


def request_from_options(
    cmd: list[str], options: dict[str, Any], cwd: Optional[str] = None, env: Optional[dict[str, str]] = None
) -> enqueue.Request:
    """The request `gpuq add` makes, from plain values instead of a command line (the MCP server):
    `cmd` is SCRIPT and its ARGS; `options` are add's options by their dest in cli/options.py
    (`gpus=2`, `gpu_mem="20G"`, `after=[3]`, `time="4h"`, `sweep=["lr=1e-4,3e-4"]`, `env={"A":
    "1"}`, `hold=True`, `dry_run=True`...), written as the command line's words and read by its
    parser: the same defaults, converters and one-line errors (UsageError) as `gpuq add`. `cwd`:
    the directory it runs in unless `options` has `dir` (default: this process's); `env`: the
    environment it is queued from (default: this process's)."""
    from gpuq.cli.options import ADD
    from gpuq.cli.parser import parse  # argparse: never on a plain `gpuq add`'s path
    from gpuq.cli.table.words import option_words

    given = dict(options, dir=options.get("dir") or cwd)
    try:
        words = option_words(ADD, given)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return _request(parse([ADD.names[0], *words, "--", *cmd]), env)


def _dry_run(request: enqueue.Request, as_json: bool) -> int:
    """`add --dry-run`: what would be queued, and whether and when it would start; nothing written
    (engine/lifecycle/dryrun.py), not even a spool that does not exist yet."""
    from gpuq.core import jsontext
    from gpuq.engine.lifecycle.dryrun import plan_add
    from gpuq.spool import Spool

    plan = plan_add(Spool(), request)
    if as_json:
        print(jsontext.dumps(plan, indent=2, ensure_ascii=False))
        return 0
    for warning in plan["warnings"]:
        print(warning, file=sys.stderr)
    print(f"would queue {plural(len(plan['jobs']), 'job')} (--dry-run: nothing queued):")
    for job in plan["jobs"]:
        print("\n".join(_planned_lines(job)))
    for note in plan["notes"]:
        print(note)
    return 0


def _planned_lines(job: dict[str, Any]) -> list[str]:
    """One planned job of `add --dry-run`, a few lines."""
    import shlex

    from gpuq.engine.views.card import FOUND_BY  # as `gpuq show` says it

    how = job["interpreter_from"]
    found = f" (from {FOUND_BY.get(how, how)})" if how else ""
    gpus = "a CPU job" if job["gpus"] == 0 else plural(job["gpus"], "GPU")
    if job["gpu_mem_mib"]:
        gpus += f", {job['gpu_mem_mib']} MiB each"
    limits = [gpus]
    if job["mem_mib"]:
        from gpuq.engine.schedule.hostroom import size_text  # as `gpuq show` says it

        limits.append(f"{size_text(job['mem_mib'])} host memory")
    if job["cpus"]:
        limits.append(plural(job["cpus"], "CPU"))
    if job["time_limit_seconds"]:
        from gpuq.core.timespec import format_duration

        limits.append(f"time limit {format_duration(job['time_limit_seconds'])}")
    deps = job["after"] + job["after_any"]
    limits += [f"after {', '.join(f'#{d}' for d in deps)}"] if deps else []
    limits += [f"begins {job['begin_at']}"] if job["begin_at"] else []
    start = job["would_start"]
    when = "would start now" if start["now"] else f"would not start now: {start['why_not']}"
    return [
        f"  #{job['id']} {job['name']}{'  (held)' if job['state'] == HELD else ''}",
        f"    command    {job['command_line']}",
        f"    directory  {job['cwd']}",
        *([f"    python     {job['interpreter']}{found}"] if job["interpreter"] else []),
        f"    env        {' '.join(f'{k}={shlex.quote(v)}' for k, v in job['env'].items())}",
        f"    needs      {'; '.join(limits)}",
        f"    {when}" + ("" if _said(start["estimate"], start["why_not"]) else f" ({start['estimate']})"),
    ]


def _said(estimate: str, why_not: Optional[str]) -> bool:
    """Whether the queue's estimate adds nothing to the line: unknown, or the reason again."""
    return estimate.startswith("unknown") or bool(why_not and why_not in estimate)


def _say_who_starts_it(workers: list[dict[str, Any]], ids: list[int]) -> None:
    """The line `gpuq add` says on stderr when no worker will start what it queued: none runs, or
    every one drains (`gpuq stop --drain`: it starts nothing new, and holds its locks until its
    jobs end, so a new worker can start only then)."""
    if not workers:
        waits = "waits" if len(ids) == 1 else "wait"
        said = f"no worker is running; {ids_text(ids)} {waits} for `gpuq run --daemon` (or `gpuq service install`)"
    elif all(worker.get("draining") for worker in workers):
        who = "the worker is" if len(workers) == 1 else "every worker is"
        said = (
            f"{who} draining (`gpuq stop --drain`); {ids_text(ids)} will not start until a worker runs again "
            f"(`gpuq run --daemon` once the draining one has exited)"
        )
    else:
        return
    print(f"gpuq add: {said}", file=sys.stderr)


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
            print(f"[-] Job #{job_id}: {job.name} cancelled: it was running, killed (exit {job.exit_code})")
            return
        where = f" (scancel of Slurm job {job.slurm['job_id']})" if job.slurm else ""
        print(f"[-] Job #{job_id}: {job.name} cancelled{where}")

    return each_id(job_ids(args.ids), cancel)


def cmd_hold(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import actions  # here: `gpuq add` must not import it

    sp = spool()

    def hold(job_id: int) -> None:
        job = actions.hold(sp, job_id)
        print(f"[=] Job #{job_id}: {job.name} held (`gpuq release {job_id}` puts it back in line)")

    return each_id(job_ids(args.ids), hold)


def cmd_release(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import actions  # here: `gpuq add` must not import it

    sp = spool()

    def release(job_id: int) -> None:
        job = actions.release(sp, job_id)
        print(f"[+] Job #{job_id}: {job.name} back in line")

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
    print(f"[~] Job #{args.id}: {job.name} changed: " + ", ".join(k for k in changed if changed[k] != fields.get(k)))
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
        print(f"[-] Job #{job_id}: {job.name} killed (exit {job.exit_code})")

    return each_id(job_ids(args.ids), kill)


def _say_killing(job_id: int, grace: float) -> None:
    print(f"sending SIGTERM to job #{job_id}'s process group (SIGKILL after {grace:.0f}s)...", flush=True)


def cmd_retry(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import actions  # here: `gpuq add` must not import it

    sp = spool()

    def retry(job_id: int) -> None:
        job, how = actions.retry(sp, job_id, args.from_scratch)
        print(f"[+] Job #{job_id}: {job.name} back in the queue: {how.text()}")

    return each_id(job_ids(args.ids), retry)


def cmd_clear(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import clearing  # here: `gpuq add` must not import it

    sp = spool()
    chosen = clearing.select(
        sp, tuple(dict.fromkeys(s for group in args.state for s in group)) or FINISHED, args.older_than
    )
    what = "the logs of " if args.logs else ""
    counts = ", ".join(f"{n} {state}" for state, n in chosen.counts().items())
    if chosen.refs:  # what it will do, before it does it
        print(
            f"will remove {what}{plural(len(chosen.refs), 'finished job')} ({counts})"
            + ("" if args.logs else " and their logs")
            + "; their history and learned run times are kept"
        )
    if chosen.kept_for_dependents:
        print("kept (waiting jobs depend on them): " + ", ".join(f"#{i}" for i in sorted(chosen.kept_for_dependents)))
    if not chosen.refs:
        print("no finished jobs to clear" + (" (of these states and age)" if args.state or args.older_than else ""))
        return 0
    # it asks on a terminal, as `recover` does; a script (no terminal) gets what it ran, as `tsp -C`, `pueue clean`
    if not args.yes and sys.stdin.isatty() and input("Go ahead? [y/N] ").strip().lower() not in ("y", "yes"):
        print("nothing removed")
        return 0
    report = clearing.clear(sp, chosen, logs_only=args.logs)
    freed = f"{report.freed_bytes / (1 << 20):.1f} MiB"
    if args.logs:
        print(f"dropped the logs of {plural(len(report.logs_dropped), 'finished job')}, freeing {freed}")
        return 0
    print(f"removed {plural(len(report.removed), 'finished job')}, freeing {freed}")
    if report.no_room:
        print(f"gpuq: left {ids_text(report.no_room)}: no room on the disk to keep their history", file=sys.stderr)
        return 1
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import actions  # here: `gpuq add` must not import it

    sp = spool()
    if args.jobs:  # named: re-queued whatever they reached
        back, code = _recover(sp, job_ids(args.jobs), args.from_scratch, say=True)
        print(f"Re-queued {plural(back, 'job')}." + (" Run `gpuq run` to execute." if back else ""))
        return code
    ended = actions.reached_their_end(sp)
    _say_ended(ended)
    if args.all:
        back, code = _recover(sp, [job.id for job in actions.to_recover(sp)], args.from_scratch, say=True)
        print(f"Re-queued {plural(back, 'job')}." + (" Run `gpuq run` to execute." if back else ""))
        return code
    plans = actions.recovery_plans(sp, args.from_scratch)
    if not plans:
        print("nothing else to re-queue" if ended else "no interrupted jobs")
        return 0
    for job, how in plans:  # what will happen, before it happens
        print(f"  #{job.id} {job.name}: {how.text()}  ({job.note or INTERRUPTED})")
    if not sys.stdin.isatty():
        flag = " --from-scratch" if args.from_scratch else ""
        print(f"would re-queue {plural(len(plans), 'job')}; run `gpuq recover --all{flag}` (or --jobs ID...) to do it")
        return 0
    these = "this job" if len(plans) == 1 else f"these {len(plans)} jobs"
    if input(f"Re-queue {these}? [y/N] ").strip().lower() not in ("y", "yes"):
        return 0
    back, code = _recover(sp, [job.id for job, _how in plans], args.from_scratch, say=False)
    print(f"Re-queued {plural(back, 'job')}.")
    return code


def _say_ended(ended: list[tuple[Any, str]]) -> None:
    """The interrupted jobs a plain `recover` leaves: they had reached their end."""
    from gpuq.engine.lifecycle import repairs

    for job, reached in ended:
        print(
            f"  #{job.id} {job.name}: {repairs.reached_end_text(reached)}: not re-queued "
            f"(`gpuq recover --jobs {job.id}` runs it again)"
        )


def _recover(sp: Spool, ids: list[int], from_scratch: bool, say: bool) -> tuple[int, int]:
    """Each interrupted job of `ids` back in the queue: (how many went back, the exit code)."""
    from gpuq.engine.lifecycle import actions

    back = []

    def recover(job_id: int) -> None:
        for job, how in actions.recover(sp, [job_id], from_scratch):
            back.append(job_id)
            if say:
                print(f"  #{job.id} {job.name}: {how.text()}")

    code = each_id(ids, recover)
    return len(back), code
