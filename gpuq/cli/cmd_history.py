"""`gpuq history`: where the GPU hours went, per directory, script, day or sweep, and a picture."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Optional

from gpuq.cli.common import spool
from gpuq.cli.render import pad, width
from gpuq.core.errors import Refused, UsageError
from gpuq.core.states import DONE, FAILED, PREEMPTED
from gpuq.core.times import duration
from gpuq.core.words import plural
from gpuq.engine.lifecycle.ending import get
from gpuq.engine.tracking import gpuseries, gpuuse
from gpuq.engine.views import attempts, finished_index, history
from gpuq.system.gpus import mib_text


def cmd_history(args: argparse.Namespace) -> int:
    if args.id is not None and not args.plot:
        return _one_job(args.id, args.json)
    try:
        since = history.parse_since(args.since, time.time()) if args.since else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    pairs = finished_index.history_records(spool())  # every job's runs; those before `since` are left out below
    if args.plot:
        from gpuq.cli.plot import plot  # the plot extra (matplotlib): only for --plot

        if args.id is not None and all(record.job_id != args.id for record in pairs):
            get(spool(), args.id)  # "no such job #N"; a cleared job's runs are among the records, kept
        chosen = [r for r in history.runs(pairs) if (since is None or r.end >= since) and args.id in (None, r.job_id)]
        try:
            plot(chosen, args.plot, utilisation=gpuseries.of_runs(spool(), chosen))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print(f"wrote {args.plot}: {plural(len(chosen), 'run')}")
        return 0
    groups = history_groups(pairs, since, args.by)
    if args.json:
        print(json.dumps(history.to_json(groups), indent=2))
        return 0
    header: tuple[str, ...] = (args.by, "runs", DONE, FAILED, "GPU-h", "median", PREEMPTED)
    rows: list[tuple[str, ...]] = [header] + [
        (
            str(g.key if g.key is not None else "-"),
            str(g.runs),
            str(g.done),
            str(g.failed),
            f"{g.gpu_hours:.2f}",
            duration(g.median_seconds) or "-",
            str(g.preempted),
        )
        for g in groups
    ]
    if len(rows) == 1:
        print("no finished runs in this period")
        return 0
    if any(g.gpu_use for g in groups):  # the GPUs' figures, where supervisors recorded them
        rows[0] += ("GPU%", "peak mem", "idle GPU-h")
        rows[1:] = [row + _gpu_use_cells(g.gpu_use) for row, g in zip(rows[1:], groups)]
    widths = [max(width(r[i]) for r in rows) for i in range(len(rows[0]))]  # a CJK directory takes two a character
    lines = ["  ".join(pad(c, w, right=i > 0) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "─" * len(lines[0]))
    total = sum(g.gpu_hours for g in groups)
    print("\n".join(lines + [f"total: {plural(sum(g.runs for g in groups), 'run')}, {total:.2f} GPU-hours"]))
    return 0


def _one_job(job_id: int, as_json: bool) -> int:
    """One job's attempts, a line each: how it ended, what it had, why the next one changed."""
    sp = spool()
    if sp.jobs.find(job_id) is None:  # cleared: kept-runs holds its runs' totals, not its attempts
        for kept_id, state, name, *_rest in sp.kept.read():
            if kept_id == job_id:
                raise Refused(
                    f"job #{job_id} {name} was cleared by `gpuq clear` (it ended {state}): the details of its"
                    " attempts went with it; `gpuq history` still counts its runs"
                )
    _ref, job = get(sp, job_id)
    if as_json:
        print(json.dumps({"id": job.id, "name": job.name, "attempts": attempts.attempts_json(job)}, indent=2))
        return 0
    lines = attempts.attempt_lines(job)
    print(f"#{job.id} {job.name}")
    if not lines:
        print("  no attempt has ended yet")
    width = max((len(label) for label, _text in lines), default=0)
    print("\n".join(f"  {label.ljust(width)}  {text}" for label, text in lines))
    return 0


def history_groups(pairs: list[history.JobRecord], since: Optional[float], by: str) -> list[history.Group]:
    """Also the assistant server's `history` tool."""
    groups = history.summarize(pairs, since, by)
    sp = spool()
    recorded = sp.reports.gpu_use_ids()
    for group in groups:  # what the jobs' GPUs did, from their supervisors' records
        group.gpu_use = gpuuse.of_jobs(sp, history.job_ids(group), recorded)
    return groups


def _gpu_use_cells(figures: Optional[dict[str, Any]]) -> tuple[str, str, str]:
    if not figures:
        return ("-", "-", "-")
    mean = figures["mean_util"]
    return (
        "-" if mean is None else f"{mean:.0f}%",
        mib_text(figures["peak_mem_mib"]),
        f"{figures['gpu_hours_idle']:.2f}",
    )
