"""The `gpuq` command line. `main` parses (cli/quick.py for a plain `status` or `add`, else
cli/parser.py), runs the command's handler (a `cmd_*.py` module here, imported only when its
command runs) and turns every error into one line on stderr and an exit code, here and nowhere
else: 2 for a bad command line, 1 for a request that cannot be carried out.
"""

from __future__ import annotations

import os
import sys

from gpuq.cli import quick
from gpuq.core.errors import GpuqError, UsageError

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional

__all__ = ["build_parser", "exit_fast", "main"]


def __getattr__(name: str) -> Any:
    """`gpuq.cli.build_parser`: parser.py (argparse) is imported by whoever asks, not by `gpuq status`."""
    if name != "build_parser":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from gpuq.cli.parser import build_parser

    return build_parser


def parse(argv: list[str]) -> Any:
    """The command line's namespace: the quick reading of a plain `status` or `add`, else argparse's."""
    args = quick.parse(argv)
    if args is None:
        from gpuq.cli.parser import parse as parse_fully

        args = parse_fully(argv)
    return args


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = ""
    try:
        args = parse(argv)
        command = args.command
        return _handler(args.func)(args)
    except GpuqError as exc:
        prefix = exc.prefix or (f"gpuq {command}" if isinstance(exc, UsageError) and command else "gpuq")
        print(f"{prefix}: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `gpuq status | head -1`: the reader has what it wanted
        _silence_stdout()
        return 0
    except OSError as exc:
        print(f"gpuq: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def exit_fast(code: int) -> None:
    """`sys.exit(code)` without the interpreter's teardown, which frees every module and object one
    by one: about 3 ms of `gpuq add`, spent while the job it queued starts on the other CPU
    (bench/PROFILE.md, "add -> first instruction"). Only when the teardown has nothing to do for
    us: stdout and stderr flushed (a failed flush goes the usual way, which reports it), no other
    thread, no atexit callback, no tracer or profiler (coverage, cProfile)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    if isinstance(code, int) and sys.gettrace() is None and sys.getprofile() is None and _alone():
        os._exit(code)
    sys.exit(code)


def _alone() -> bool:
    """Whether nothing but this thread runs and no atexit callback waits (logging registers one)."""
    import atexit  # built into the interpreter: nothing to load

    threading = sys.modules.get("threading")  # not imported: no thread was started through it
    callbacks = getattr(atexit, "_ncallbacks", lambda: 1)()  # CPython's count; unknown elsewhere: assume some
    return callbacks == 0 and (threading is None or threading.active_count() == 1)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit does not fail once more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _handler(spec: str) -> Any:
    """ "module:function" of gpuq.cli; "cli:..." names a function of this module."""
    module, _, name = spec.partition(":")
    if module == "cli":
        return getattr(sys.modules[__name__], name)
    __import__(f"gpuq.cli.{module}")  # not importlib.import_module: importlib (and warnings) cost start-up
    return getattr(sys.modules[f"gpuq.cli.{module}"], name)


def cmd_demo(_args: Any) -> int:
    """Here rather than in a command module: the demo drives `main` itself, which it is handed."""
    from gpuq.cli.demo import run_demo

    return run_demo(main)


def cmd_ids(args: Any) -> int:
    """`gpuq _ids [--state S,S]`: the ids of the jobs in those states (default: every job), one a
    line, for shell completion (cmd_tools.cmd_completion). It runs on every TAB: file names only,
    no job file read, and here rather than in cmd_tools, whose imports `service` and `import` need."""
    from gpuq.cli.common import spool
    from gpuq.core.states import STATES

    found = sorted({ref.id for ref in spool().jobs.refs(args.state or STATES)})
    if found:
        print("\n".join(map(str, found)))
    return 0
