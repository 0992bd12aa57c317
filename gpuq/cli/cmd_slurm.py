"""`gpuq slurm submit` and `gpuq slurm sync`: hand jobs to Slurm, record what Slurm did with them."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping

import gpuq
from gpuq.cli import render
from gpuq.cli.common import job_ids, say_refused, spool
from gpuq.core.errors import Refused, UsageError
from gpuq.core.job import Job
from gpuq.core.states import DONE
from gpuq.engine.lifecycle import slurm_handover
from gpuq.run import slurm_batch


def cmd_submit(args: argparse.Namespace) -> int:
    ids = job_ids(args.ids)
    if bool(ids) == bool(args.all):
        raise UsageError("name the jobs to hand over (`gpuq slurm submit 3 4`) or give --all")
    if not 0 <= args.grace <= 65535:
        raise UsageError(f"--grace must be 0 to 65535 seconds, not {args.grace}")
    sp = spool()
    key = slurm_handover.spool_key(sp)
    # The compute nodes run this interpreter and this gpuq: both on the shared filesystem.
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(gpuq.__file__)))

    def build(job: Job, slurm_ids: Mapping[int, int], opts: list[str]) -> tuple[str, list[str]]:
        script = slurm_batch.batch_script(job, python=sys.executable, package_parent=package_parent, log_path=job.log)
        try:
            options = slurm_batch.sbatch_options(
                job, spool_id=key, slurm_ids=slurm_ids, extra=opts, grace_seconds=args.grace
            )
        except ValueError as exc:
            raise Refused(str(exc)) from None
        return script, options

    def say(item: slurm_handover.Handed) -> None:
        how = "found on Slurm (its hand-over had been cut short)" if item.repaired else "submitted"
        print(f"[>] Job #{item.job.id}: {item.job.name} -> Slurm job {item.slurm_id} ({how})", flush=True)
        if item.job.notify_urls or item.job.notify or item.job.on_finish:
            print("    its --notify and --on-finish are not sent on Slurm (Slurm's own: --slurm-opt --mail-type=END)")

    result = slurm_handover.submit(sp, ids or None, args.slurm_opt, build, say=say)
    if not (result.handed or result.left):
        print("no pending jobs to hand over")
    for job_id in sorted(result.left):  # each on its own line, the reason with it
        say_refused(job_id, result.left[job_id])
    return 1 if result.left else 0


def cmd_sync(args: argparse.Namespace) -> int:
    report = slurm_handover.sync(spool())
    for item in report.repaired:
        print(f"[>] Job #{item.job.id}: {item.job.name} -> Slurm job {item.slurm_id} (hand-over repaired)")
    for job in report.changed:
        print(f"[~] Job #{job.id}: {job.name}  {render.slurm_text(job.slurm or {})}")
    for job, state in report.ended:
        code = f" (exit {job.exit_code})" if job.exit_code is not None else ""
        print(f"[{'+' if state == DONE else '-'}] Job #{job.id}: {job.name} {state}{code}")
    if not (report.repaired or report.changed or report.ended):
        print("nothing changed")
    return 0
