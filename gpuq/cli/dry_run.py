"""`gpuq add --dry-run`, printed (engine/lifecycle/dryrun.py)."""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any, Optional

from gpuq.core.states import HELD
from gpuq.core.timespec import format_duration
from gpuq.core.words import plural
from gpuq.engine.lifecycle import enqueue
from gpuq.engine.lifecycle.dryrun import plan_add
from gpuq.engine.schedule.hostroom import size_text
from gpuq.engine.views.card import FOUND_BY
from gpuq.spool import Spool


def show(request: enqueue.Request, as_json: bool) -> int:
    plan = plan_add(Spool(), request)
    if as_json:
        print(json.dumps(plan, indent=2, ensure_ascii=False))
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
    how = job["interpreter_from"]
    found = f" (from {FOUND_BY.get(how, how)})" if how else ""
    gpus = "a CPU job" if job["gpus"] == 0 else plural(job["gpus"], "GPU")
    if job["gpu_mem_mib"]:
        gpus += f", {job['gpu_mem_mib']} MiB each"
    limits = [gpus]
    if job["mem_mib"]:
        limits.append(f"{size_text(job['mem_mib'])} host memory")
    if job["cpus"]:
        limits.append(plural(job["cpus"], "CPU"))
    if job["time_limit_seconds"]:
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
    return estimate.startswith("unknown") or bool(why_not and why_not in estimate)
