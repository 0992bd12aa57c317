"""The command lines typed all day, `gpuq status`, `gpuq add` and `gpuq eta`, read without argparse.

Importing argparse (with gettext and locale) and building even one subparser costs more than
`gpuq status` spends on its own work (bench/PROFILE.md, section 1). `parse` here reads the plain
forms of `status`, `add`/`enqueue` and `eta [ID]` into the same namespace parser.py would give, from
the same table (cli/options.py), and returns None for anything else: help, an unknown or abbreviated option,
a value that looks like an option, a bad value, a misplaced gpuq option among the job's words.
parser.py then parses the command line and says what is wrong. tests/test_cli_quick.py checks,
option by option, that both give the same namespace.
"""

from __future__ import annotations

from gpuq.cli.options import ADD, APPEND, ETA, STATUS, Command, misplaced_option, spell_notify_urls

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    Reading = dict[str, tuple[str, Callable[[str], Any], bool]]  # option -> (dest, converter, appends)


class Namespace:
    """The command line's values as attributes, as argparse.Namespace holds them for parser.py
    (not types.SimpleNamespace: `types` is a module to import, for nothing else on this path)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def _text(value: str) -> str:
    return value


def _reading(command: Command) -> tuple[dict[str, Any], dict[str, tuple[str, Any]], Reading]:
    """A command's options as this reading uses them: the defaults by dest, the flags (option ->
    (dest, value when given)), and the options that take a value."""
    defaults, flags, values = {}, {}, {}
    for opt in command.options:
        if opt.positional:
            continue
        defaults[opt.dest] = opt.initial()
        for flag in opt.flags:
            if opt.takes_value:
                values[flag] = (opt.dest, opt.convert or _text, opt.kind == APPEND)
            else:
                flags[flag] = (opt.dest, True if opt.const is None else opt.const)
    return defaults, flags, values


def _exclusive(command: Command) -> list[list[str]]:
    """The dests of each group of options that exclude each other."""
    groups: dict[str, list[str]] = {}
    for opt in command.options:
        if opt.group is not None:
            groups.setdefault(opt.group, []).append(opt.dest)
    return list(groups.values())


STATUS_DEFAULTS, STATUS_FLAGS, STATUS_VALUES = _reading(STATUS)
ADD_DEFAULTS, ADD_FLAGS, ADD_VALUES = _reading(ADD)
STATUS_EXCLUSIVE, ADD_EXCLUSIVE = _exclusive(STATUS), _exclusive(ADD)


class Bad(ValueError):
    """A form the quick reading does not take: parser.py reads the command line instead."""


def parse(argv: list[str]) -> Optional[Namespace]:
    """The namespace of a plain `status`, `add` or `eta` command line, or None: parse it with
    parser.py."""
    try:
        if argv and argv[0] in STATUS.names:
            return _status(argv[0], argv[1:])
        if argv and argv[0] in ADD.names:
            return _add(argv[0], spell_notify_urls(ADD, argv[1:]))
        if argv and argv[0] in ETA.names:
            return _eta(argv[0], argv[1:])
    except (ValueError, IndexError):  # Bad, or a converter's ValueError
        return None
    return None


def _status(command: str, words: list[str]) -> Optional[Namespace]:
    values, given = dict(STATUS_DEFAULTS), set()
    if _options(words, STATUS_FLAGS, STATUS_VALUES, values, given) != len(words):
        return None  # a positional word: an error argparse words best
    if _clash(STATUS_EXCLUSIVE, given):
        return None  # argparse names the options that exclude each other
    return Namespace(command=command, **values, func=STATUS.handler)


def _add(command: str, words: list[str]) -> Optional[Namespace]:
    values, given = {k: list(v) if isinstance(v, list) else v for k, v in ADD_DEFAULTS.items()}, set()
    at = _options(words, ADD_FLAGS, ADD_VALUES, values, given)
    separated = at < len(words) and words[at] == "--"
    job = words[at + 1 :] if separated else words[at:]
    if not job or _clash(ADD_EXCLUSIVE, given):
        return None  # no SCRIPT, or options that exclude each other
    if not separated and misplaced_option(ADD, job[1:]):
        return None  # parser.py notes the misplaced option (or refuses it: options.late_options)
    return Namespace(command=command, **values, script=job[0], args=job[1:], func=ADD.handler)


ETA_ID = ETA.options[0]  # its one option: the job id, which may be left out


def _eta(command: str, words: list[str]) -> Optional[Namespace]:
    """`eta`, or `eta ID` (ETA_ID's converter's ValueError for a word that is not one)."""
    if len(words) > 1 or (words and words[0].startswith("-")):
        return None  # an option (`-h`), `--`, or more words: argparse's to read or refuse
    job_id = ETA_ID.convert(words[0]) if words else ETA_ID.default
    return Namespace(command=command, **{ETA_ID.dest: job_id}, func=ETA.handler)


def _clash(groups: list[list[str]], given: set[str]) -> bool:
    """Whether options of one exclusive group were given with two different names."""
    return any(len(given.intersection(group)) > 1 for group in groups)


def _options(
    words: list[str],
    flags: dict[str, tuple[str, Any]],
    takes_value: Reading,
    values: dict[str, Any],
    given: set[str],
) -> int:
    """Read the options at the start of `words` into `values` (and the dest of each into `given`);
    the index of the first word that is not one (or of `--`). Bad for a form this reading leaves to
    argparse."""
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--" or not word.startswith("-") or word == "-":
            if word == "-":
                raise Bad(word)
            return i
        name, eq, inline = word.partition("=")
        if word in flags:
            dest, value = flags[word]
            values[dest] = value
            given.add(dest)
            i += 1
            continue
        if name not in takes_value or (eq and not name.startswith("--")):
            raise Bad(word)  # help, an abbreviation, combined short flags, -dDIR, an unknown option
        if eq:
            value, i = inline, i + 1
        else:
            value, i = words[i + 1], i + 2
            if value.startswith("-"):
                raise Bad(value)  # argparse's rules for such values are its own
        dest, read, appends = takes_value[name]
        given.add(dest)
        if appends:
            values[dest].append(read(value))
        else:
            values[dest] = read(value)
    return i
