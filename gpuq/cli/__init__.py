"""The `gpuq` command line. `main` parses (cli/parser.py), runs the command's handler (a module here,
imported only when its command runs) and turns every error into one line on stderr and an exit
code, here and nowhere else: 2 for a bad command line, 1 for a request that cannot be carried out.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any, Optional

from gpuq.cli.parser import build_parser, parse
from gpuq.core.errors import GpuqError, UsageError

__all__ = ["build_parser", "main", "parse", "run"]


def run() -> int:
    """The `gpuq` program (its entry point): `main`, after which the process ends."""
    code = main()
    # What the command built is freed with the process; frozen, it is not walked again by the
    # interpreter's collections at exit, which otherwise cost every command a few ms (bench/PROFILE.md).
    gc.freeze()
    return code


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
        devnull = os.open(os.devnull, os.O_WRONLY)  # so that flushing stdout at exit does not fail again
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
    except OSError as exc:
        print(f"gpuq: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _handler(spec: str) -> Any:
    """ "module:function" of gpuq.cli, imported here, at dispatch: each command pays only for its own."""
    module, _, name = spec.partition(":")
    __import__(f"gpuq.cli.{module}")  # not importlib: the commands typed all day never import it
    return getattr(sys.modules[f"gpuq.cli.{module}"], name)
