"""`gpuq slurm submit | sync` and `gpuq ray submit | sync | status`: jobs handed to a cluster, the
spool their record."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Mapping, Optional

import gpuq
from gpuq.cli.common import job_ids, say_refused, spool
from gpuq.cli.render import ray_text, slurm_text
from gpuq.core.errors import Refused, UsageError
from gpuq.core.job import Job
from gpuq.core.states import DONE, RAY
from gpuq.engine.lifecycle import ray_handover, slurm_handover
from gpuq.run import slurm_batch
from gpuq.system import rayjobs


def _chosen(args: argparse.Namespace, command: str) -> Optional[list[int]]:
    ids = job_ids(args.ids)
    if bool(ids) == bool(args.all):
        raise UsageError(f"name the jobs to hand over (`gpuq {command} 3 4`) or give --all")
    return ids or None


def _handed_over(result: Any, note: str = "") -> int:
    """What a submit did: `note` once if any job went; each job left named with why (then exit 1)."""
    if not (result.handed or result.left):
        print("no pending jobs to hand over")
    if result.handed and note:
        print(note)
    for job_id in sorted(result.left):
        say_refused(job_id, result.left[job_id])
    return 1 if result.left else 0


def _say_ended(ended: list[tuple[Job, str]], changed: bool) -> None:
    for job, state in ended:
        code = f" (exit {job.exit_code})" if job.exit_code is not None else ""
        print(f"[{'+' if state == DONE else '-'}] Job #{job.id}: {job.name} {state}{code}")
    if not (changed or ended):
        print("nothing changed")


def cmd_slurm_submit(args: argparse.Namespace) -> int:
    ids = _chosen(args, "slurm submit")
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
        limit = slurm_batch.time_limit_words(item.job, args.slurm_opt)
        if limit:
            print(f"    {limit}")

    return _handed_over(slurm_handover.submit(sp, ids, args.slurm_opt, build, say=say))


def cmd_slurm_sync(_args: argparse.Namespace) -> int:
    report = slurm_handover.sync(spool())
    for item in report.repaired:
        print(f"[>] Job #{item.job.id}: {item.job.name} -> Slurm job {item.slurm_id} (hand-over repaired)")
    for job in report.changed:
        print(f"[~] Job #{job.id}: {job.name}  {slurm_text(job.slurm or {})}")
    _say_ended(report.ended, bool(report.repaired or report.changed))
    return 0


def cmd_ray_submit(args: argparse.Namespace) -> int:
    ids = _chosen(args, "ray submit")
    address = rayjobs.address(args.address)

    def say(job: Job) -> None:
        mark = job.ray or {}
        how = f"Ray job {mark['submission_id']}" if mark.get("submission_id") else "ray/, waiting for its dependencies"
        print(f"[>] Job #{job.id}: {job.name} -> {how}", flush=True)
        if job.notify_urls or job.notify or job.on_finish:
            print("    its --notify and --on-finish are not sent for jobs on Ray")

    result = ray_handover.submit(spool(), ids, address, say=say)
    unchecked = "which they must see (a shared filesystem: not checked there)"  # said once
    return _handed_over(result, f"    Ray's nodes run them with {sys.executable} in each job's directory, {unchecked}")


def cmd_ray_sync(_args: argparse.Namespace) -> int:
    report = ray_handover.sync(spool())
    for job in report.changed:
        print(f"[~] Job #{job.id}: {job.name}  {ray_text(job.ray or {})}")
    for job in report.retried:
        change = job.history[-1].get("change") if job.history else None  # an out-of-memory retry's larger share
        print(f"[~] Job #{job.id}: {job.name} failed on Ray (exit {job.previous_exit_code}); {change or 'retrying'}")
    for job, why in report.back:
        print(f"[<] Job #{job.id}: {job.name} back in the queue: {why}")
    _say_ended(report.ended, bool(report.changed or report.retried or report.back))
    return 0


def cmd_ray_status(args: argparse.Namespace) -> int:
    sp = spool()
    if sp.jobs.names(RAY):
        ray_handover.sync(sp)  # what runs where, as of now
    ours = [job for _ref, job in sp.jobs.load_many(RAY)]
    known = [(job.ray or {}).get("address") for job in ours]
    address = rayjobs.address(args.address or next((a for a in known if a), None))
    nodes = rayjobs.nodes(address)
    where: dict[str, list[str]] = {}
    for job in ours:
        mark = job.ray or {}
        if mark.get("address") != address or not mark.get("submission_id"):
            continue
        seen = rayjobs.get(address, mark["submission_id"])
        if seen is not None and seen.state == "RUNNING" and seen.node_id:
            where.setdefault(seen.node_id, []).append(f"#{job.id} {job.name}")
    print(f"Ray cluster at {address}: {len(nodes)} node(s)")
    for node in sorted(nodes, key=lambda n: (not n.head, n.ip)):
        gpus, cpus = int(node.total.get("GPU", 0)), int(node.total.get("CPU", 0))
        mem = node.total.get("memory", 0) / (1 << 30)
        role = " (head)" if node.head else ""
        state = "" if node.alive else "  DEAD"
        print(f"  {node.ip}{role}  {gpus} GPU  {cpus} CPU  {mem:.1f} GiB{state}  {node.node_id[:12]}")
        for line in where.get(node.node_id, []):
            print(f"      runs {line}")
    waiting = [job for job in ours if (job.ray or {}).get("state") in ("WAITING", "PENDING", "SUBMITTING")]
    for job in waiting:
        print(f"  waiting: #{job.id} {job.name}  {ray_text(job.ray or {})}")
    return 0
