"""What every command shares: the spool it works on, and how a command of several job ids acts on
each one and says which it could not."""

from __future__ import annotations

import sys

from gpuq.core.errors import GpuqError
from gpuq.spool import Spool
from gpuq.spool.layout import find_legacy

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Callable, Iterable


def spool() -> Spool:
    """The user's spool ($GPUQ_HOME or ~/.gpuq), created on first use and checked. The first
    time, a queue of the original gpuq found there is imported (as the original imported its
    queue.json), and what happened is said on stderr, where it never mixes with JSON output."""
    sp = Spool().ensure()
    if find_legacy(sp.home) is not None:  # two stats; engine.original is imported only when there is one
        from gpuq.engine.original.importer import import_on_first_use

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


def each_id(ids: Iterable[int], act: Callable[[int], object]) -> int:
    """`act` on each job id in turn, as every command of several ids does: one refused (a
    GpuqError) is said in one line on stderr and the others are still acted on. The exit code: 0,
    or the refusal's (1) when any id was refused."""
    code = 0
    for job_id in ids:
        try:
            act(job_id)
        except GpuqError as exc:
            say_refused(job_id, exc)
            code = max(code, exc.exit_code)
    return code


def say_refused(job_id: int, why: object) -> None:
    """One line on stderr, like the CLI's other refusals, that names the job (most reasons do)."""
    text = str(why)
    named = any(not after[:1].isdigit() for after in text.split(f"#{job_id}")[1:])  # #3 is not #31
    prefix = (why.prefix if isinstance(why, GpuqError) else None) or "gpuq"
    sys.stdout.flush()  # a terminal shows the lines in the order they happened
    print(f"{prefix}: {text if named else f'job #{job_id}: {text}'}", file=sys.stderr)
