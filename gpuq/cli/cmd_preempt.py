"""`gpuq preempt`, `resume` and `adopt`: call the library, print the result."""

from __future__ import annotations

import argparse
from typing import Any

from gpuq.cli.common import each_id, job_ids, spool
from gpuq.core.errors import UsageError
from gpuq.core.states import PREEMPTED, RUNNING
from gpuq.engine.lifecycle import adopt, preempt


def cmd_preempt(args: argparse.Namespace) -> int:
    if args.timeout < 0:
        raise UsageError("--timeout must be 0 or more")
    outcome = preempt.preempt(spool(), args.id, args.timeout, args.force, say=print)
    job = outcome.job
    if outcome.state == PREEMPTED:
        code = job.exit_code
        exit_text = f"exit {code}" if code is not None else "exit code unknown"
        print(f"[~] Job #{job.id}: {job.name} preempted ({exit_text}): {job.note}")
        print(f"    {_what_resume_does(job)}")
        return 0
    if outcome.left and outcome.state == RUNNING and job.pid in outcome.left:
        print(f"job #{job.id} did not exit within {args.timeout:g}s; left running, unchanged (--force kills it)")
    elif outcome.left:
        print(
            f"job #{job.id}: its main process exited but {', '.join(map(str, outcome.left))} ignore SIGTERM; "
            "it keeps its slot until they are gone: its supervisor SIGKILLs them once the worker's --kill-grace "
            f"is over (`gpuq preempt {job.id} --force` does it now)"
        )
    else:
        print(f"job #{job.id} ended on its own meanwhile: {outcome.state}")
    return 1


def _what_resume_does(job: dict[str, Any]) -> str:
    """What `gpuq resume` will do with the job just preempted, from what its preemption recorded."""
    resume = f"`gpuq resume {job.id}`"
    if job.no_resume:
        return f"{resume} starts it over from scratch: it was queued with --no-resume"
    record = (job.preemptions or [{}])[-1]
    if not record.get("checkpoint"):
        return f"{resume} starts it over from scratch: it left no complete checkpoint"
    return f"{resume} continues it from {record['checkpoint']}"


def cmd_resume(args: argparse.Namespace) -> int:
    sp = spool()
    where = "in normal order" if args.back else "first in line"

    def resume(job_id: int) -> None:
        job = preempt.resume(sp, job_id, args.require_checkpoint, front=not args.back).job
        print(f"[+] Job #{job.id}: {job.name} back in the queue ({where}): {job.note}")

    return each_id(job_ids(args.ids), resume)


def cmd_adopt(args: argparse.Namespace) -> int:
    _ref, job = adopt.adopt(spool(), args.pid, name=args.name, log=args.log)
    print(f"[+] Job #{job.id}: {job.name} adopted (pid {job.pid}, started {job.started_at})")
    print(f"    log: {job.log}" if job.log else "    no log: progress only from checkpoints (use --log FILE)")
    return 0
