"""The `gpuq` command line's argparse parser, built from the table of cli/commands.py.

`parse` builds only the subparser of the command typed (building all of them costs more than most
commands' own work); `build_parser()` builds all (help, shell completion). A plain `status` or
`add` line never comes here: cli/quick.py reads it from the same table.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from gpuq import __version__
from gpuq.cli.commands import COMMANDS, RUN
from gpuq.cli.options import (
    ADD,
    APPEND,
    CONST,
    FLAG,
    HIDDEN,
    NOTIFY_URL,
    REST,
    Command,
    Opt,
    late_options,
    misplaced_option,
    spell_notify_urls,
    split_at_script,
)
from gpuq.core.errors import UsageError

TYPE_CHECKING = False  # typing only for annotations: about 4 ms of every command parsed here
if TYPE_CHECKING:
    from typing import Any, Optional

DESCRIPTION = (
    "A GPU job queue for one machine, kept in a spool directory ($GPUQ_HOME, default ~/.gpuq). "
    "Jobs run one at a time per GPU."
)


class Formatter(argparse.HelpFormatter):
    """argparse's formatter, told the terminal's width so that it does not import shutil (and bz2,
    lzma with it) for each argument it checks while the parser is built."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: Any = None):
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


def _columns() -> int:
    """shutil.get_terminal_size().columns: $COLUMNS, else the terminal's, else 80."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


class Parser(argparse.ArgumentParser):
    """A bad command line is a UsageError (one line, exit 2), not argparse's usage and exit."""

    joined: frozenset[str] = frozenset()  # options whose value may start with "-" (Opt.dash_value)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        exc = UsageError(f"{message} (see `{self.prog} --help`)")
        exc.prefix = self.prog
        raise exc

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """`--slurm-opt --time=4:00:00`: argparse takes a value that starts with `-` for an
        option, so such an option and its value are made one word first."""
        if self.joined:
            words, args = list(args or []), []
            while words:
                word = words.pop(0)
                args.append(f"{word}={words.pop(0)}" if word in self.joined and words else word)
        return super().parse_known_args(args, namespace)


def build_parser(only: Optional[str] = None) -> Parser:
    """The parser of every command, or with `only` of that command alone."""
    parser = Parser(prog="gpuq", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"gpuq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        for name in command.names:
            if only is None or name == only:
                _add_command(sub, name, command)
    return parser


def _add_command(sub: Any, name: str, command: Command) -> Parser:
    """The subparser of `command` under `name`, with its options (and its own commands)."""
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
    """add_argument's keywords for `opt`."""
    out: dict[str, Any] = {"help": argparse.SUPPRESS if opt.help == HIDDEN else opt.help}
    if not opt.positional:
        out["dest"] = opt.dest
    if opt.kind == FLAG:
        return dict(out, action="store_true")
    if opt.kind == CONST:
        return dict(out, action="store_const", const=opt.const, default=opt.default)
    if opt.kind == APPEND:
        out.update(action="append", default=opt.initial())
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
    """`convert` as an argparse type: its ValueError's message is the one argparse shows (a plain
    `int` or `float` keeps argparse's own "invalid int value")."""
    if convert in (int, float):
        return convert

    def typed(text: str) -> Any:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    typed.__name__ = convert.__name__
    return typed


def _commands(parser: Parser) -> dict[str, Parser]:
    return parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]


def _add_parser(parser: Parser) -> Parser:
    """`add`'s subparser (or `enqueue`'s, the same options), whichever was built."""
    built = _commands(parser)
    return built["add"] if "add" in built else built["enqueue"]


def parse(argv: list[str]) -> argparse.Namespace:
    wanted = argv[0] if argv and not argv[0].startswith("-") else None
    parser = build_parser(only=wanted)
    if wanted is not None and wanted not in _commands(parser):
        raise _unknown_command(wanted)
    if argv and argv[0] in ADD.names:
        return _parse_add(parser, [argv[0], *spell_notify_urls(ADD, argv[1:])])
    if argv and argv[0] == RUN.names[0]:
        argv = [argv[0], *spell_notify_urls(RUN, argv[1:])]
    args = _parse_args(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        raise SystemExit(UsageError.exit_code)
    return args


def _parse_args(parser: Parser, argv: list[str]) -> argparse.Namespace:
    """argparse's reading of `argv`; what the main parser says of a command's words (`gpuq add
    -n x`: "unrecognized arguments") is said by the command, as its own errors are."""
    try:
        return parser.parse_args(argv)
    except UsageError as exc:
        if exc.prefix != parser.prog or not argv or argv[0] not in _commands(parser):
            raise
        command = _command_words(argv)
        told = UsageError(str(exc).replace(f"`{parser.prog} --help`", f"`gpuq {command} --help`"))
        told.prefix = f"gpuq {command}"
        raise told from None


def _command_words(argv: list[str]) -> str:
    """`add`, or with its action `slurm submit`: the command a command line names."""
    command = next((c for c in COMMANDS if argv[0] in c.names), None)
    if command is not None and len(argv) > 1 and any(argv[1] in action.names for action in command.actions):
        return f"{argv[0]} {argv[1]}"
    return argv[0]


def _unknown_command(word: str) -> UsageError:
    """`gpuq stauts`: one line with the command most likely meant, among those `--help` lists
    (never the hidden ones, as `_ids`)."""
    import difflib  # only for a mistyped command

    listed = [name for command in COMMANDS if command.help is not None for name in command.names]
    close = difflib.get_close_matches(word, listed, n=1)
    meant = f"; did you mean {close[0]}?" if close else ""
    exc = UsageError(f"unknown command {word!r}{meant} (`gpuq --help` lists the commands)")
    exc.prefix = "gpuq"
    return exc


def _parse_add(parser: Parser, argv: list[str]) -> argparse.Namespace:
    """`add`: gpuq's options up to SCRIPT, the job's words verbatim from SCRIPT on. One of gpuq's
    dependency or scheduling options after SCRIPT is refused (the job would run without it); any
    other of gpuq's own options there gets a note on stderr."""
    own, job_words = split_at_script(ADD, argv[1:])
    separated = argv[1 + len(own) : 2 + len(own)] == ["--"]
    if job_words and not separated:
        _refuse_late_options(argv[0], own, job_words)
    stray = misplaced_option(ADD, job_words[1:]) if job_words and not separated else []
    if stray:
        typed = ["--notify" if word == NOTIFY_URL else word for word in own]  # as spell_notify_urls found it
        fix = shlex.join(["gpuq", argv[0], *typed, *stray, job_words[0]])
        print(
            f"gpuq {argv[0]}: note: {stray[0]} comes after the script, so {job_words[0]} gets it; gpuq's "
            f"options go before the script ({fix} ...); `--` before the script silences this note",
            file=sys.stderr,
        )
    args = _parse_args(parser, [argv[0], *own, "--", "_"])  # gpuq's options, read (or `--help` shown)
    if not job_words:
        exc = UsageError(
            f"say what to queue: a script or a command, after gpuq's options (gpuq {argv[0]} train.py --lr 3e-4, "
            f"gpuq {argv[0]} --gpus 2 torchrun train.py; see `gpuq {argv[0]} --help`)"
        )
        exc.prefix = f"gpuq {argv[0]}"
        raise exc
    args.script, args.args = job_words[0], job_words[1:]
    return args


def _refuse_late_options(command: str, own: list[str], job_words: list[str]) -> None:
    """A UsageError when gpuq's dependency or scheduling options follow SCRIPT (the original
    gpuq's `add eval.py --after 1`): eval.py would get them and the job would start at once. The
    fix given moves them before SCRIPT, the rest of the line as typed."""
    late = late_options(ADD, job_words[1:])
    if not late:
        return
    moved = [word for _at, found, _opt in late for word in found]
    taken = {at + 1 + k for at, found, _opt in late for k in range(len(found))}
    kept = [word for i, word in enumerate(job_words) if i not in taken]
    script, one = job_words[0], len(late) == 1
    named = ", ".join(" ".join(found) for _at, found, _opt in late)
    would = next(opt.before_script for _at, _found, opt in late if opt.before_script)
    exc = UsageError(
        f"{named} {'comes' if one else 'come'} after the script, so {script} would get {'it' if one else 'them'} "
        f"and the job would {would}; put {'it' if one else 'them'} before the script: "
        f"{shlex.join(['gpuq', command, *own, *moved, *kept])} (or `--` before the script to pass "
        f"{'it' if one else 'them'} to {script})"
    )
    exc.prefix = f"gpuq {command}"
    raise exc
