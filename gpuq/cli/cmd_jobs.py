"""The commands that change jobs already queued (and `adopt`): each maps its options to the engine's
request, calls it, and says what happened."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

from gpuq.cli import render
from gpuq.cli.common import job_ids, say_refused, say_who_starts_them, spool
from gpuq.core.errors import GpuqError, UsageError
from gpuq.core.states import CANCELLED, INTERRUPTED, PREEMPTED, RUNNING
from gpuq.core.words import ids_text, plural
from gpuq.engine.lifecycle import actions, edit, repairs, requests
from gpuq.engine.lifecycle.requests import Done
from gpuq.engine.views import card


def _on_each(request: requests.OnJobs, said: Callable[[Done], Optional[str]]) -> int:
    """Each job refused is named on stderr with the reason, and then exit 1."""
    code = 0
    for job_id, outcome in requests.each(spool(), request, _say_killing):
        if isinstance(outcome, GpuqError):
            say_refused(job_id, outcome)
            code = max(code, outcome.exit_code)
        elif (line := said(outcome)) is not None:
            print(line)
    return code


def _say_killing(job_id: int, grace: float) -> None:
    print(f"sending SIGTERM to job #{job_id}'s process group (SIGKILL after {grace:g}s)...", flush=True)


def _cancelled(done: Done, _args: argparse.Namespace) -> str:
    if done.killed:
        return render.killed_text(done.job, f"{CANCELLED}: it was running, killed")
    return render.cancelled_text(done.job)


def _on_ids(request: Callable[..., requests.OnJobs], mark: str, what: Callable[..., str], *flags: str) -> Any:
    """A command on job ids: its request made of the ids and `flags`, one line per job."""

    def handler(args: argparse.Namespace) -> int:
        made = request(ids=job_ids(args.ids), **{flag: getattr(args, flag) for flag in flags})
        return _on_each(made, lambda d: f"[{mark}] Job #{d.job.id}: {d.job.name} {what(d, args)}")

    return handler


cmd_cancel = _on_ids(requests.Cancel, "-", _cancelled, "force")
cmd_kill = _on_ids(requests.Kill, "-", lambda d, _a: render.killed_text(d.job))
cmd_hold = _on_ids(requests.Hold, "=", lambda d, _a: f"held (`gpuq release {d.job.id}` puts it back in line)")
cmd_release = _on_ids(requests.Release, "+", lambda d, _a: "back in line")
cmd_retry = _on_ids(requests.Retry, "+", lambda d, _a: f"back in the queue: {d.how}", "from_scratch")
cmd_resume = _on_ids(
    requests.Resume,
    "+",
    lambda d, a: f"back in the queue ({'in normal order' if a.back else 'first in line'}): {d.how}",
    "require_checkpoint",
    "back",
)


def cmd_recover(args: argparse.Namespace) -> int:
    sp = spool()
    # a running job found dead (a zombie too) is interrupted now, as `status` would record it: else
    # one named here was refused as running until something else looked
    repairs.settle_unsupervised(sp, repairs.Report())
    if args.jobs:  # named: re-queued whatever they reached
        return _requeue(job_ids(args.jobs), args.from_scratch, say=True)
    ended = actions.reached_their_end(sp)
    for job, reached in ended:
        print(
            f"  #{job.id} {job.name}: {repairs.reached_end_text(reached)}: not re-queued "
            f"(`gpuq recover --jobs {job.id}` runs it again)"
        )
    if args.all:
        return _requeue([job.id for job in actions.to_recover(sp)], args.from_scratch, say=True)
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
    return _requeue([job.id for job, _how in plans], args.from_scratch, say=False)


def _requeue(ids: list[int], from_scratch: bool, say: bool) -> int:
    back: list[Done] = []

    def said(done: Done) -> Optional[str]:
        back.append(done)
        return f"  #{done.job.id} {done.job.name}: {done.how}" if say else None

    code = _on_each(requests.Recover(ids=ids, from_scratch=from_scratch), said)
    if back or not ids:  # none of those named: each refusal said why, as `retry` says it
        print(f"Re-queued {plural(len(back), 'job')}.")
    if back:
        say_who_starts_them("recover", spool().workers.live(), [done.job.id for done in back])
    return code


def cmd_preempt(args: argparse.Namespace) -> int:
    outcome = requests.Preempt(id=args.id, timeout=args.timeout, force=args.force).run(spool(), say=print)
    job = outcome.job
    if outcome.state == PREEMPTED:
        code = "exit code unknown" if job.exit_code is None else f"exit {job.exit_code}"
        print(f"[~] Job #{job.id}: {job.name} preempted ({code}): {job.note}")
        checkpoint = (job.preemptions or [{}])[-1].get("checkpoint")
        if job.no_resume:
            print(f"    `gpuq resume {job.id}` starts it over from scratch: it was queued with --no-resume")
        elif not checkpoint:
            print(f"    `gpuq resume {job.id}` starts it over from scratch: it left no complete checkpoint")
        else:
            print(f"    `gpuq resume {job.id}` continues it from {checkpoint}")
        return 0
    if outcome.left and outcome.state == RUNNING and job.pid in outcome.left:
        print(
            f"job #{job.id} did not exit within {args.timeout:g}s; asked to stop: it is still saving; "
            "it will be recorded preempted when it exits (--force kills it)"
        )
    elif outcome.left:
        print(
            f"job #{job.id}: its main process exited but {', '.join(map(str, outcome.left))} ignore SIGTERM; "
            "it keeps its slot until they are gone: its supervisor SIGKILLs them once the worker's --kill-grace "
            f"is over (`gpuq preempt {job.id} --force` does it now)"
        )
    else:
        print(f"job #{job.id} ended on its own meanwhile: {outcome.state}")
    return 1


def cmd_edit(args: argparse.Namespace) -> int:
    sp = spool()
    if args.set:
        job, changed = requests.Edit(id=args.id, changes=args.set).run(sp)
    else:
        fields, rev = edit.read(sp, args.id)
        job, changed = edit.apply_edited(sp, args.id, fields, _in_editor(fields, args.id), rev)
    if job is None:
        print(f"job #{args.id}: nothing changed")
    else:
        print(f"[~] Job #{args.id}: {job.name} changed: " + ", ".join(changed))
        if {"cmd", "cwd", "conda"} & set(changed) and card.python_text(job):  # chosen again, or kept
            print(f"    python {card.python_text(job)}")
    return 0


def _in_editor(fields: dict[str, Any], job_id: int) -> dict[str, Any]:
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory(prefix="gpuq-edit-") as tmp:
        path = Path(tmp, f"job-{job_id}.json")
        path.write_text(json.dumps(fields, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        try:
            code = subprocess.call([*shlex.split(editor), str(path)])
        except OSError as exc:
            raise UsageError(f"cannot run the editor {editor!r}: {exc.strerror or exc}") from None
        if code != 0:
            raise UsageError(f"the editor exited with {code}; job #{job_id} not changed")
        try:
            edited = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise UsageError(f"job #{job_id} not changed: the edited file is not JSON: {exc}") from None
    if not isinstance(edited, dict):
        raise UsageError(f"job #{job_id} not changed: the edited file must hold a JSON object")
    return edited


def cmd_clear(args: argparse.Namespace) -> int:
    sp = spool()
    request = requests.Clear(states=args.state, older_than=args.older_than, logs_only=args.logs)
    chosen = request.select(sp)
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
        which = " (of these states and age)" if args.state or args.older_than else ""
        print(f"no finished jobs {'with a log left ' if args.logs else ''}to clear{which}")
        return 0
    # it asks on a terminal, as `recover` does; a script (no terminal) gets what it ran, as `tsp -C`, `pueue clean`
    if not args.yes and sys.stdin.isatty() and input("Go ahead? [y/N] ").strip().lower() not in ("y", "yes"):
        print("nothing removed")
        return 0
    report = request.run(sp, chosen)
    freed = f"{report.freed_bytes / (1 << 20):.1f} MiB"
    if args.logs:
        print(f"dropped the logs of {plural(len(report.logs_dropped), 'finished job')}, freeing {freed}")
        return 0
    print(f"removed {plural(len(report.removed), 'finished job')}, freeing {freed}")
    if report.no_room:
        print(f"gpuq: left {ids_text(report.no_room)}: no room on the disk to keep their history", file=sys.stderr)
        return 1
    return 0


def cmd_adopt(args: argparse.Namespace) -> int:
    from gpuq.engine.lifecycle import adopt  # psutil: of these commands only `adopt` looks at processes

    _ref, job, leased = adopt.adopt(spool(), args.pid, name=args.name, log=args.log)
    print(f"[+] Job #{job.id}: {job.name} adopted (pid {job.pid}, started {job.started_at})")
    if job.gpus is None:
        print("    holds the whole machine (no GPUs here): no other job starts while it runs")
    else:  # adopt's note says which GPUs and why; other users' gpuq keep off those it leases
        beside = "other jobs start beside it" if job.gpus == [] else "no job of this queue starts there while it runs"
        print(f"    holds {(job.note or '').partition('; holds ')[2]}: {beside}")
    if leased:
        print(f"    {leased}")
    print(f"    log: {job.log}" if job.log else "    no log: progress only from checkpoints (use --log FILE)")
    return 0
