"""`gpuq eta`: the running and pending jobs' estimates, from the queue as engine/views/status.py reads
it. Apart from cmd_status.py so that it imports no table rendering (cli/render.py)."""

from __future__ import annotations

import argparse

from gpuq.cli.common import spool
from gpuq.core.errors import Refused
from gpuq.core.states import PENDING
from gpuq.core.times import duration
from gpuq.engine.views.status import status


def cmd_eta(args: argparse.Namespace) -> int:
    sp = spool()
    found = sp.jobs.find(args.id) if args.id is not None else None
    if args.id is not None and found is None:
        raise Refused(f"no such job #{args.id}")
    # only running and pending rows have an estimate: no finished job's file is read
    rows = [r for r in status(sp, recent=0).rows if r.estimate is not None and args.id in (None, r.job.id)]
    if found is not None and not rows:
        print(f"#{args.id}: {found.state}; an ETA is given for running and pending jobs only")
    elif not rows:
        print("no running or pending jobs")
    for row in rows:
        est, job = row.estimate, row.job
        head = f"#{job.id} {job.name} ({row.state}{', adopted' if job.adopted else ''})"
        if row.state == PENDING:
            end = f"; ends in ~{duration(est.eta_seconds) or '0s'}" if est.eta_seconds is not None else ""
            print(f"{head}: {est.method}{end}")
            continue
        done = est.reading.text() if est.reading else "progress unknown"
        when = f"ETA {duration(est.eta_seconds) or '0s'}" if est.eta_seconds is not None else "ETA unknown"
        print(f"{head}: {done}, {when}")
        print(f"    method: {est.method}")
    return 0
