"""`gpuq log`, `show`, `triage`, `gpus` and `rejected`: read and printed."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Optional

from gpuq.cli import render
from gpuq.cli.common import spool
from gpuq.core.job import Job
from gpuq.core.states import ACTIVE, CANCELLED, HELD, PENDING, RAY, RUNNING
from gpuq.core.times import duration, iso_of
from gpuq.core.words import url_text
from gpuq.engine.lifecycle import actions
from gpuq.engine.schedule import gpuview
from gpuq.engine.schedule.queue_read import PendingCache
from gpuq.engine.tracking import gpuuse
from gpuq.engine.views.card import card, log_gone, not_started, worker_time_limit
from gpuq.engine.views.status import rejected_files, sync_ray
from gpuq.engine.views.triage import triage
from gpuq.spool import JobRef, Spool
from gpuq.system import security
from gpuq.system.gpu_presence import FAKE_ENV


def cmd_rejected(args: argparse.Namespace) -> int:
    listed = rejected_files(spool())
    if args.json:
        shown = [{"file": name, "rejected_at": iso_of(at) if at else None, "reason": why} for name, at, why in listed]
        print(json.dumps(shown, indent=2, ensure_ascii=False))
        return 0
    if not listed:
        print("no rejected files")
    for name, at, why in listed:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at else "?"
        print(f"rejected/{security.display(name)}  {when}  {security.display(why) or '(no reason recorded)'}")
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    sp = spool()
    ref, job = actions.get(sp, args.id)
    if ref.state == RAY:  # its log is what Ray kept, fetched into the spool by a sync
        for warning in sync_ray(sp):
            print(f"gpuq log: {warning}", file=sys.stderr)
        ref, job = actions.get(sp, args.id)
    why = not_started(sp, ref, job)
    if why is not None and args.follow and ref.state != CANCELLED:
        cache, said = PendingCache(), False
        while sp.jobs.find(job.id, (PENDING, HELD)) is not None and not sp.logs.size(job):
            if actions.will_not_start(sp, job.id, cache):  # as `gpuq wait` stops for it
                break
            if not said:
                print(f"waiting for #{job.id} to start ({why})...", file=sys.stderr, flush=True)
                said = True
            time.sleep(FOLLOW_POLL_SECONDS)
        ref, job = actions.get(sp, job.id)
        why = not_started(sp, ref, job)  # not None: cancelled, or it will not start
        if why is None:
            _follow(sp, job, offset=0)
            return 0
    if why is not None:  # said on stderr: the log itself (stdout) is empty
        will_not = args.follow and ref.state != CANCELLED  # exit 1 as `gpuq wait`'s for it
        started = "will not start" if will_not else "never started" if ref.state == CANCELLED else "has not started yet"
        print(f"#{job.id} {started} ({why})", file=sys.stderr)
        return 1 if will_not else 0
    gone = log_gone(sp, ref, job)
    if gone is not None:  # said on stderr, as above: there is no log to print
        print(f"#{job.id}: its log {sp.logs.path_of(job)} {gone}", file=sys.stderr)
        return 0
    for line in sp.logs.tail_lines(job, args.lines):
        print(line)
    if args.follow:
        _follow(sp, job, on_ray=ref.state == RAY)
    return 0


FOLLOW_POLL_SECONDS = 0.2  # a log has no event to wait on that works everywhere
RAY_POLL_SECONDS = 1.0  # a job on Ray: its log is fetched from Ray (a request per job in ray/) this often


def _follow(sp: Spool, job: Job, offset: Optional[int] = None, on_ray: bool = False) -> None:
    """Print what the log gains until the job ends; on Ray, fetching it from Ray (a sync) as it goes,
    through its retries, until it leaves ray/."""
    offset = sp.logs.size(job) if offset is None else offset
    said: set[str] = set()
    synced = 0.0
    while True:
        if on_ray and time.monotonic() - synced >= RAY_POLL_SECONDS:
            for warning in set(sync_ray(sp)) - said:
                print(f"gpuq log: {warning}", file=sys.stderr, flush=True)
                said.add(warning)
            synced = time.monotonic()
        running = sp.jobs.find(job.id, (RAY,) if on_ray else ACTIVE) is not None
        chunk = sp.logs.read_from(job, offset)
        if chunk:
            offset += len(chunk)
            print(chunk.decode("utf-8", "replace"), end="", flush=True)
        elif not running:
            return
        else:
            time.sleep(FOLLOW_POLL_SECONDS)


def cmd_show(args: argparse.Namespace) -> int:
    sp = spool()
    ref, job = actions.get(sp, args.id)
    if args.env:
        print(json.dumps({"env": job.env, "shell_env": job.shell_env}, indent=2, ensure_ascii=False))
    elif args.json:
        print(json.dumps(show_json(sp, ref, job), indent=2, ensure_ascii=False))
    else:
        lines = card(sp, ref, job)
        width = max(len(label) for label, _text in lines)
        print(f"#{job.id} {job.name}")
        print("\n".join(f"  {label.ljust(width)}  {text}" for label, text in lines))
    return 0


def show_json(sp: Spool, ref: JobRef, job: Job, secrets: bool = True) -> dict[str, Any]:
    """Also the assistant server's `job` tool and the web page's job, which get no secrets: the
    notify URLs cut as `show` prints them (their user, password, path and query may be tokens)."""
    shown = dict(job, state=ref.state, file=ref.name, gpu_use=gpuuse.of_job(sp, job.id))
    shown["time_limit"] = job.time_limit or worker_time_limit(job)  # the limit it ran under
    if not secrets and job.notify_urls:
        shown["notify_urls"] = [url_text(url) for url in job.notify_urls]
    if isinstance(job.sweep, dict):
        shown["sweep_jobs"] = actions.sweep_jobs(sp, job.sweep["id"])
    return shown


def gpus_view(sp: Spool) -> Optional[dict[str, Any]]:
    """Also the assistant server's `gpus` tool; None without GPUs."""
    shown = gpuview.current(sp, actions.jobs_in(sp, (RUNNING,)))  # a look of its own if the workers' is old
    if shown is not None and shown.get("worker"):
        gpuview.add_leases(shown, sp.home)  # the leases as they are now, not as the worker last saw them
    return shown


def cmd_gpus(args: argparse.Namespace) -> int:
    sp = spool()
    shown = gpus_view(sp)
    if args.json:
        print(json.dumps(gpuview.listed(shown, time.time()), indent=2))
    elif shown is None:
        fake = os.environ.get(FAKE_ENV)
        why = f"{FAKE_ENV}={fake} lists none" if fake else f"no NVIDIA driver, and {FAKE_ENV} is not set"
        print(f"no GPUs found ({why}): jobs run one slot at a time")
    else:
        print("\n".join(render.gpu_lines(shown, home=sp.home)))
        return 1 if gpuview.failed(shown) else 0  # as --json refuses it: no GPU was read
    return 0


def cmd_triage(args: argparse.Namespace) -> int:
    found = triage(spool(), args.id, args.lines)
    if args.json:
        print(json.dumps(found, indent=2, ensure_ascii=False))
        return 0
    code = found.get("exit_code")
    ckpt = found["checkpoint"]
    step = f" (step {ckpt['step']})" if ckpt["step"] is not None else ""
    waiting = found.get("waiting_for")
    labelled = [
        ("exit code", None if code is None else f"{code}" + (f" ({found['signal']})" if found.get("signal") else "")),
        ("reason", found.get("reason")),
        ("note", found.get("note") if found.get("note") != found.get("waiting_for") else None),
        ("ran for", None if found.get("run_seconds") is None else duration(found["run_seconds"])),
        ("checkpoint", f"{ckpt['latest']}{step}" if ckpt["latest"] else f"none found ({ckpt['where_looked']})"),
        ("log", found["log"] + (f" {found['log_gone']}" if found["log_gone"] else "")),
    ]
    # the reason as status says it, after the state as show says it ("pending: after #3"); whatever
    # its kind ("waiting for GPU 0", "no worker is running", "blocked: ..."), no label reads before all
    state = found["state"]
    if waiting:  # "held by user (...)" says its state itself
        state = waiting if waiting.startswith(state) else f"{state}: {waiting}"
    out = [f"#{found['id']} {found['name']}: {state}"]
    out += [f"  {label.ljust(11)}  {text}" for label, text in labelled if text]
    if found["log_tail"]:
        out.append(f"  the end of its log ({len(found['log_tail'])} lines):")
        out += [f"    {security.display(line)}" for line in found["log_tail"]]
    out.append("  to fix it:" if found["fixes"] else "  nothing to fix")
    for fix in found["fixes"]:
        out += [f"    {fix['command']}", f"      {fix['why']}"]
    print("\n".join(out))
    return 0
