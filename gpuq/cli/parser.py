"""The argparse parser, built from the table of cli/commands.py. `parse` builds only the subparser
of the command typed (building all of them costs more than most commands' own work).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from typing import Any, NoReturn, Optional, TypeVar

from gpuq import __version__
from gpuq.cli.commands import COMMANDS
from gpuq.cli.options import ADD, APPEND, CONST, EXTEND, FLAG, HIDDEN, NOTIFY, REST, Command, Opt
from gpuq.core.errors import GpuqError, UsageError

E = TypeVar("E", bound=GpuqError)

DESCRIPTION = (
    "A GPU job queue for one machine, kept in a spool directory ($GPUQ_HOME, default ~/.gpuq). "
    "Jobs run one at a time per GPU."
)


class Formatter(argparse.HelpFormatter):
    """Told the terminal's width, so that argparse does not import shutil (and bz2, lzma with it);
    `SCRIPT [ARGS...]` shown as such rather than as argparse's `...`."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: Any = None):
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if action.nargs == argparse.REMAINDER and action.metavar:
            return str(action.metavar)
        return super()._format_args(action, default_metavar)


def said_by(prefix: str, exc: E) -> E:
    exc.prefix = prefix
    return exc


def _columns() -> int:
    with contextlib.suppress(KeyError, ValueError):
        return int(os.environ["COLUMNS"])
    with contextlib.suppress(AttributeError, ValueError, OSError):
        return os.get_terminal_size().columns or 80  # stdout's file descriptor, as shutil asks
    return 80


class Parser(argparse.ArgumentParser):
    """A bad command line is a UsageError (one line, exit 2), not argparse's usage and exit."""

    joined: frozenset[str] = frozenset()  # options whose value may start with "-" (Opt.dash_value)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # `--mem -1G`: argparse reads a negative value with a unit as an option, and misses the value
        flag, _, problem = message.removeprefix("argument ").partition(": ")
        if problem == "expected one argument":
            words = self.words
            given = [b for a, b in zip(words, words[1:]) if a in flag.split("/") and b[:1] == "-" and b[1:2].isdigit()]
            message = f"argument {flag}: {given[0]!r} is negative" if given else message
        raise said_by(self.prog, UsageError(f"{message} (see `{self.prog} --help`)"))

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.words: list[str] = list(args or [])  # what error() may quote
        # argparse takes a value that starts with `-` for an option: made one word with it first
        if self.joined:
            words, args = list(args or []), []
            while words:
                word = words.pop(0)
                args.append(f"{word}={words.pop(0)}" if word in self.joined and words else word)
        self.ambiguous: dict[str, Exception] = {}
        namespace, extras = super().parse_known_args(args, namespace)
        refused = [self.ambiguous[word] for word in extras if word in self.ambiguous]
        if refused:
            raise refused[0]
        return namespace, extras

    def _parse_optional(self, arg_string: str) -> Any:
        """An ambiguous abbreviation (`--gpu`: --gpus or --gpu-mem?) is refused where it is read as an
        option (before SCRIPT), not where SCRIPT's words take it. Older Pythons (3.11) refuse it while
        sorting the words, before they know which: here it is sorted as an unknown option instead."""
        try:
            return super()._parse_optional(arg_string)
        except (UsageError, argparse.ArgumentError) as exc:
            self.ambiguous[arg_string] = exc
            self.allow_abbrev = False
            try:
                return super()._parse_optional(arg_string)
            finally:
                self.allow_abbrev = True


class Notify(argparse.Action):
    """`--notify` alone: True; with a URL, the URL added to `notify_url`. argparse gives it the
    next word whatever it is: `_parse_args` puts back a word that is no URL."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option_string: Any = None) -> None:
        if value is None:
            namespace.notify = True
        else:
            namespace.notify_url = [*namespace.notify_url, value]


def build_parser(only: Optional[str] = None) -> Parser:
    parser = Parser(prog="gpuq", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"gpuq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        for name in command.names:
            if only is None or name == only:
                _add_command(sub, name, command)
    return parser


def _add_command(sub: Any, name: str, command: Command) -> Parser:
    extra = {"help": command.help} if command.help is not None else {}  # one without help is not listed
    p = sub.add_parser(name, description=command.description, **extra)
    groups: dict[str, Any] = {}
    for opt in command.options:
        if opt.group is not None and opt.group not in groups:
            groups[opt.group] = p.add_mutually_exclusive_group()
        (p if opt.group is None else groups[opt.group]).add_argument(*opt.flags, **_argument(opt))
    p.joined = frozenset(flag for opt in command.options if opt.dash_value for flag in opt.flags)
    if command.actions:
        actions = p.add_subparsers(dest=f"{name}_command", metavar="ACTION", parser_class=Parser, required=True)
        for action in command.actions:
            _add_command(actions, action.names[0], action)
    if command.handler is not None:
        p.set_defaults(func=command.handler)
    return p


def _argument(opt: Opt) -> dict[str, Any]:
    out: dict[str, Any] = {"help": argparse.SUPPRESS if opt.help == HIDDEN else opt.help}
    if not opt.positional:
        out["dest"] = opt.dest
    if opt.kind == FLAG:
        return dict(out, action="store_true")
    if opt.kind == CONST:
        return dict(out, action="store_const", const=opt.const, default=opt.default)
    if opt.kind == NOTIFY:
        return dict(out, action=Notify, nargs="?", default=False, metavar="URL")
    if opt.kind in (EXTEND, APPEND):
        out.update(action=opt.kind, default=opt.initial())
    elif opt.default is not None:
        out["default"] = opt.default
    if opt.convert is not None:
        out["type"] = _typed(opt.convert)
    if opt.nargs is not None:
        out["nargs"] = argparse.REMAINDER if opt.nargs == REST else opt.nargs
    if opt.choices is not None:
        out["choices"] = opt.choices
    if opt.metavar is not None:
        out["metavar"] = opt.metavar
    return out


def _typed(convert: Any) -> Any:
    """`convert` whose ValueError's message is the one argparse shows (`int`, `float`: argparse's own)."""
    if convert in (int, float):
        return convert

    def typed(text: str) -> Any:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    typed.__name__ = convert.__name__
    return typed


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def parse(argv: list[str]) -> argparse.Namespace:
    wanted = argv[0] if argv and not argv[0].startswith("-") else None
    parser = build_parser(only=wanted)
    if wanted is not None and wanted not in subparsers(parser):  # `gpuq stauts`: the command most likely meant
        import difflib  # only for a command that is not one

        listed = [name for command in COMMANDS if command.help is not None for name in command.names]
        close = difflib.get_close_matches(wanted, listed, n=1)
        meant = f"; did you mean {close[0]}?" if close else ""
        raise said_by("gpuq", UsageError(f"unknown command {wanted!r}{meant} (`gpuq --help` lists the commands)"))
    args = _parse_args(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        raise SystemExit(UsageError.exit_code)
    if args.command in ADD.names:
        script_and_args(args, argv)
    return args


def _parse_args(parser: Parser, argv: list[str]) -> argparse.Namespace:
    """What the main parser says of a command's words ("unrecognized arguments") is said by the
    command. `--notify WORD` where WORD is no URL: `--notify` alone, WORD the next word."""
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        if exc.prefix != parser.prog or not argv or argv[0] not in subparsers(parser):
            raise
        command = _command_words(argv)
        told = UsageError(str(exc).replace(f"`{parser.prog} --help`", f"`gpuq {command} --help`"))
        raise said_by(f"gpuq {command}", told) from None
    taken = [url for url in getattr(args, "notify_url", ()) if "://" not in url]
    at = next((i for i in range(len(argv) - 1) if argv[i] == "--notify" and argv[i + 1] in taken), None)
    if at is None:
        return args
    return _parse_args(parser, [*argv[: at + 1], "--", *argv[at + 1 :]])


def _command_words(argv: list[str]) -> str:
    """`add`, or with its action `slurm submit`."""
    command = next((c for c in COMMANDS if argv[0] in c.names), None)
    if command is not None and len(argv) > 1 and any(argv[1] in action.names for action in command.actions):
        return f"{argv[0]} {argv[1]}"
    return argv[0]


def script_and_args(args: argparse.Namespace, argv: list[str]) -> None:
    """`args.script`, `args.args` from the words argparse left to the job (a `--` before SCRIPT dropped)."""
    words: list[str] = args.cmd
    del args.cmd
    separated = words[:1] == ["--"]
    job = words[1:] if separated else words
    if not job:
        raise said_by(
            f"gpuq {argv[0]}",
            UsageError(
                f"say what to queue: a script or a command, after gpuq's options (gpuq {argv[0]} train.py --lr "
                f"3e-4, gpuq {argv[0]} --gpus 2 torchrun train.py; see `gpuq {argv[0]} --help`)"
            ),
        )
    if not separated:
        check_job_words(argv[0], argv[1 : len(argv) - len(words)], job)
    args.script, args.args = job[0], job[1:]


def check_job_words(command: str, typed: list[str], job: list[str]) -> None:
    """gpuq's own long options among the job's words (the original gpuq took them from anywhere on
    the line): one of Opt.before_script is refused with the line that works (a late --json goes
    with a late --dry-run); any other gets a note on stderr."""
    found, i = [], 1
    while i < len(job):
        name = job[i].split("=", 1)[0]
        opt = next((o for o in ADD.options if name in o.flags), None) if job[i].startswith("--") else None
        if opt is not None or (name == "--help" and job[i] != "--help"):
            n = 2 if opt is not None and opt.takes_value and "=" not in job[i] else 1
            found.append((i, job[i : i + n], opt))
            i += n - 1
        i += 1
    own = [(at, words, opt) for at, words, opt in found if opt is not None]
    late = [(at, words, opt) for at, words, opt in own if opt.before_script]
    if any(opt.dest == "dry_run" for _at, _words, opt in late):
        late = [(at, words, opt) for at, words, opt in own if opt.before_script or opt.dest == "json"]
    if late:
        moved = [word for _at, words, _opt in late for word in words]
        taken = {at + k for at, words, _opt in late for k in range(len(words))}
        kept = [word for i, word in enumerate(job) if i not in taken]
        script, them = job[0], "it" if len(late) == 1 else "them"
        named = ", ".join(" ".join(words) for _at, words, _opt in late)
        would = next(opt.before_script for _at, _words, opt in late if opt.before_script)
        raise said_by(
            f"gpuq {command}",
            UsageError(
                f"{named} {'comes' if len(late) == 1 else 'come'} after the script, so {script} would get {them} "
                f"and the job would {would}; put {them} before the script: "
                f"{shlex.join(['gpuq', command, *typed, *moved, *kept])} (or `--` before the script to pass {them} "
                f"to {script})"
            ),
        )
    if found:
        stray = found[0][1]
        fix = shlex.join(["gpuq", command, *typed, *stray, job[0]])
        print(
            f"gpuq {command}: note: {stray[0]} comes after the script, so {job[0]} gets it; gpuq's "
            f"options go before the script ({fix} ...); `--` before the script silences this note",
            file=sys.stderr,
        )
