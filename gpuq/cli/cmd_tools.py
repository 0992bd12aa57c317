"""`gpuq import`, `skill`, `service` and `completion`: what connects gpuq to the rest of the day."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

import gpuq
from gpuq.cli.commands import COMMANDS
from gpuq.cli.common import spool
from gpuq.cli.options import Command
from gpuq.cli.parser import build_parser, subparsers
from gpuq.core.errors import Refused
from gpuq.engine.original import importer, reader
from gpuq.run import service
from gpuq.system import installs


def cmd_import(args: argparse.Namespace) -> int:
    sp = spool()  # a queue lying in the spool itself has just been imported by this
    path = Path(args.path).expanduser().absolute() if args.path is not None else reader.find_legacy(sp.home)
    if path is None:
        print(f"no queue of the original gpuq in {sp.home} (gpuq.db or queue.json); give its path")
        return 0
    report = importer.import_queue(sp, Path(path))
    print("\n".join(report.lines()))
    return 0


def _skill_text() -> str:
    """The skill as shipped in the package (gpuq/skill/gpuq.md), or from a checkout's skill/."""
    package = Path(gpuq.__file__).resolve().parent
    for candidate in (package / "skill" / "gpuq.md", package.parent / "skill" / "gpuq.md"):
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    raise Refused("the skill file is missing from this installation (gpuq/skill/gpuq.md)")


def cmd_skill(args: argparse.Namespace) -> int:
    text = _skill_text()
    if args.action == "show":
        sys.stdout.write(text)
        return 0
    dest = Path(args.dest).expanduser() if args.dest else Path.home() / ".claude" / "commands"
    result = installs.install(dest / "gpuq.md", text, force=args.force)
    print(result.summary())
    if result.action != "kept":
        print("in Claude Code, `/gpuq show the queue` (or /gpuq 看看队列) now runs it")
    return 0


def cmd_service(args: argparse.Namespace) -> int:
    dest = Path(args.dest).expanduser() if args.dest else None
    if dest is None:  # writing elsewhere (--dest) is allowed anywhere, e.g. to look at the unit
        problem = service.supported()
        if problem:
            raise Refused(f"a systemd user service is not supported here: {problem}")
    if args.action == "install":
        result = service.install(dest, spool_home=str(spool().home), recover=not args.no_recover, force=args.force)
    else:
        result = service.uninstall(dest, force=args.force)
    print(result.summary)
    for command in result.commands:
        print(f"  {command}")
    if args.action == "install":
        print(f"  ({service.LINGER_WHY})")
    return 0


ID_ARGUMENTS = ("id", "ids", "jobs")  # positional and option arguments that take job ids


def cmd_completion(args: argparse.Namespace) -> int:
    """shtab's script from gpuq's own parser; job ids complete from the spool (`gpuq _ids`)."""
    import shtab  # an optional dependency, needed by this command only

    parser = build_parser()
    _complete_ids(parser, COMMANDS, shtab.cmd)
    sys.stdout.write(shtab.complete(parser, shell=args.shell))
    return 0


def _complete_ids(parser: argparse.ArgumentParser, commands: tuple[Command, ...], cmd: Any) -> None:
    for command in commands:
        for name in command.names:
            sub = subparsers(parser)[name]
            for action in sub._actions:
                if action.dest in ID_ARGUMENTS:
                    action.complete = cmd(ids_command(command.id_states))  # type: ignore[attr-defined]  # shtab reads it
            _complete_ids(sub, command.actions, cmd)


def ids_command(id_states: Optional[tuple[str, ...]]) -> str:
    only = f" --state {','.join(id_states)}" if id_states else ""
    return f"gpuq _ids{only} 2>/dev/null"
