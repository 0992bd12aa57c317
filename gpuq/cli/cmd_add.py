"""`gpuq add`: its options made the engine's request, the jobs queued, and what happened said."""

from __future__ import annotations

import argparse
import sys

from gpuq.cli.common import say_who_starts_them, spool
from gpuq.core.errors import UsageError
from gpuq.core.words import dependencies_text
from gpuq.engine.lifecycle import enqueue


def request(args: argparse.Namespace) -> enqueue.Request:
    """Each option's dest is the request's field of that name."""
    given = {name: getattr(args, name) for name in enqueue.Request._fields if hasattr(args, name)}
    return enqueue.Request(**dict(given, cmd=[args.script, *args.args], env=dict(args.env)))


def cmd_add(args: argparse.Namespace) -> int:
    if args.json and not args.dry_run:
        raise UsageError("--json goes with --dry-run (a real add prints the ids with -q)")
    outlook = args.urgent and not args.quiet and not args.hold
    if args.dry_run or outlook:
        from gpuq.engine.lifecycle import dryrun  # the queue's ETA machinery: for --dry-run and --urgent's outlook
    if args.dry_run:
        return dryrun.show(request(args), args.json)
    prepared = enqueue.prepare(request(args))  # checked before the spool is opened
    for note in [] if args.quiet else prepared.notes:
        print(note)
    for warning in prepared.warnings:  # also with -q: the job would likely fail, and stdout keeps only the id
        print(warning, file=sys.stderr)
    sp = spool()
    # the running jobs as they are before it is queued: a watching worker may preempt one at once
    running = enqueue.running_jobs(sp) if outlook else []
    free_now = outlook and dryrun.starts_now(sp, prepared)  # before: once queued it would be counted twice
    published = enqueue.publish(sp, prepared)
    for _ref, job in published:
        if args.quiet:
            print(job.id)
            continue
        deps = dependencies_text(job.after, job.after_any)
        print(f"[+] Job #{job.id}: {job.name}{f'  {deps}' if deps else ''}{'  (held)' if args.hold else ''}")
    if outlook:
        print(f"    {enqueue.urgent_outlook(published[0][1], running, free_now)}")
    if not args.quiet and not args.hold:
        say_who_starts_them("add", sp.workers.live(), [job.id for _ref, job in published])
    return 0
