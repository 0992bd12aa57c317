"""What every command shares: the spool it works on, the ids a command line names, a refusal
that names its job; `gpuq _ids`, the ids shell completion offers (here, light,
because it runs on every TAB)."""

from __future__ import annotations

import argparse
import sys
from typing import Iterable

from gpuq.core.errors import GpuqError
from gpuq.core.states import STATES
from gpuq.spool import Spool
from gpuq.spool.layout import find_legacy


def spool() -> Spool:
    """The user's spool ($GPUQ_HOME or ~/.gpuq), created on first use and checked. The first
    time, a queue of the original gpuq found there is imported (as the original imported its
    queue.json), and what happened is said on stderr, where it never mixes with JSON output."""
    sp = Spool().ensure()
    if find_legacy(sp.home) is not None:
        from gpuq.engine.original.importer import import_on_first_use  # the original's reader (sqlite3): only then

        try:
            report = import_on_first_use(sp)
        except GpuqError as exc:
            print(f"gpuq: the original gpuq's queue was not imported: {exc}", file=sys.stderr)
        else:
            for line in report.lines() if report else []:
                print(f"gpuq: {line}", file=sys.stderr)
    return sp


def job_ids(groups: Iterable[Iterable[int]]) -> list[int]:
    """The ids of a command line (`3 5-7 9,10`: argparse gives one list per word), each once."""
    return list(dict.fromkeys(i for group in groups for i in group))


def say_refused(job_id: int, why: object) -> None:
    """One line on stderr, like the CLI's other refusals, that names the job (most reasons do)."""
    text = str(why)
    named = any(not after[:1].isdigit() for after in text.split(f"#{job_id}")[1:])  # #3 is not #31
    prefix = (why.prefix if isinstance(why, GpuqError) else None) or "gpuq"
    sys.stdout.flush()  # a terminal shows the lines in the order they happened
    print(f"{prefix}: {text if named else f'job #{job_id}: {text}'}", file=sys.stderr)


def cmd_ids(args: argparse.Namespace) -> int:
    """`gpuq _ids [--state S,S]`: the ids of the jobs in those states (default: every job), one a
    line, for shell completion (cmd_tools.cmd_completion): file names only, no job file read."""
    found = sorted({ref.id for ref in spool().jobs.refs(args.state or STATES)})
    if found:
        print("\n".join(map(str, found)))
    return 0
