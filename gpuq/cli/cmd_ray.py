"""`gpuq ray submit | sync | status`: jobs handed to a Ray cluster, the spool their record."""

from __future__ import annotations

import argparse
import sys

from gpuq.cli.common import job_ids, say_refused, spool
from gpuq.cli.render import ray_text
from gpuq.core.errors import UsageError
from gpuq.core.job import Job
from gpuq.core.states import DONE, RAY
from gpuq.engine.lifecycle import ray_handover
from gpuq.system import rayjobs


def cmd_ray_submit(args: argparse.Namespace) -> int:
    ids = job_ids(args.ids)
    if bool(ids) == bool(args.all):
        raise UsageError("name the jobs to hand over (`gpuq ray submit 3 4`) or give --all")
    address = rayjobs.address(args.address)

    def say(job: Job) -> None:
        mark = job.ray or {}
        how = f"Ray job {mark['submission_id']}" if mark.get("submission_id") else "ray/, waiting for its dependencies"
        print(f"[>] Job #{job.id}: {job.name} -> {how}", flush=True)
        if job.notify_urls or job.notify or job.on_finish:
            print("    its --notify and --on-finish are not sent for jobs on Ray")

    result = ray_handover.submit(spool(), ids or None, address, say=say)
    if not (result.handed or result.left):
        print("no pending jobs to hand over")
    if result.handed:  # what gpuq cannot check from here, said once
        print(
            f"    Ray's nodes run them with {sys.executable} in each job's directory, "
            "which they must see (a shared filesystem: not checked there)"
        )
    for job_id in sorted(result.left):
        say_refused(job_id, result.left[job_id])
    return 1 if result.left else 0


def cmd_ray_sync(_args: argparse.Namespace) -> int:
    report = ray_handover.sync(spool())
    for job in report.changed:
        print(f"[~] Job #{job.id}: {job.name}  {ray_text(job.ray or {})}")
    for job in report.retried:
        change = job.history[-1].get("change") if job.history else None  # an out-of-memory retry's larger share
        print(f"[~] Job #{job.id}: {job.name} failed on Ray (exit {job.previous_exit_code}); {change or 'retrying'}")
    for job, why in report.back:
        print(f"[<] Job #{job.id}: {job.name} back in the queue: {why}")
    for job, state in report.ended:
        code = f" (exit {job.exit_code})" if job.exit_code is not None else ""
        print(f"[{'+' if state == DONE else '-'}] Job #{job.id}: {job.name} {state}{code}")
    if not (report.changed or report.retried or report.back or report.ended):
        print("nothing changed")
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
