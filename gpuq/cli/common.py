"""What every command shares; `gpuq _ids` is here, light, because it runs on every TAB."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Iterable

from gpuq.core.errors import GpuqError
from gpuq.core.states import STATES
from gpuq.core.words import ids_text
from gpuq.spool import Spool
from gpuq.spool.layout import find_legacy


def spool(first_use_import: bool = True) -> Spool:
    """The user's spool, created on first use; a queue of the original gpuq found there is imported,
    said on stderr, where it never mixes with JSON output. Not by `_ids`: completion hides stderr,
    and the import's report would be lost; nor by `gpuq mcp`'s tools, which say it in their result."""
    sp = Spool().ensure()
    for line in first_use_import_report(sp) if first_use_import else []:
        print(line, file=sys.stderr)
    return sp


def first_use_import_report(sp: Spool) -> list[str]:
    """Import the original gpuq's queue found in the spool, if any: what the import says, each line
    beginning `gpuq: `."""
    if find_legacy(sp.home) is None:
        return []
    from gpuq.engine.original.importer import import_found  # the original's reader (sqlite3): only then

    try:
        with sp.import_lock():  # a command started beside this one may be importing it: it then finds none
            reports = import_found(sp)
    except GpuqError as exc:
        return [f"gpuq: the original gpuq's queue was not imported: {exc}"]
    return [f"gpuq: {line}" for report in reports for line in report.lines()]


def job_ids(groups: Iterable[Iterable[int]]) -> list[int]:
    """`3 5-7 9,10`: argparse gives one list per word."""
    return list(dict.fromkeys(i for group in groups for i in group))


def say_refused(job_id: int, why: object) -> None:
    text = str(why)
    named = any(not after[:1].isdigit() for after in text.split(f"#{job_id}")[1:])  # #3 is not #31
    prefix = (why.prefix if isinstance(why, GpuqError) else None) or "gpuq"
    sys.stdout.flush()  # a terminal shows the lines in the order they happened
    print(f"{prefix}: {text if named else f'job #{job_id}: {text}'}", file=sys.stderr)


def cmd_ids(args: argparse.Namespace) -> int:
    """File names only, no job file read."""
    found = sorted({ref.id for ref in spool(first_use_import=False).jobs.refs(args.state or STATES)})
    if found:
        print("\n".join(map(str, found)))
    return 0


def say_who_starts_them(command: str, workers: list[dict[str, Any]], ids: list[int]) -> None:
    """Say when no worker will start the jobs `gpuq COMMAND` queued (add, recover): none runs, or
    every one drains (and holds its locks until its jobs end, so a new worker can start only then)."""
    if not workers:
        waits = "waits" if len(ids) == 1 else "wait"
        said = f"no worker is running; {ids_text(ids)} {waits} for `gpuq run --daemon` (or `gpuq service install`)"
    elif all(worker.get("draining") for worker in workers):
        who = "the worker is" if len(workers) == 1 else "every worker is"
        said = (
            f"{who} draining (`gpuq stop --drain`); {ids_text(ids)} will not start until a worker runs again "
            f"(`gpuq run --daemon` once the draining one has exited)"
        )
    else:
        return
    print(f"gpuq {command}: {said}", file=sys.stderr)
