"""The two command lines typed all day, `gpuq status` and `gpuq add`, read without argparse.

Importing argparse (with gettext and locale) and building even one subparser costs more than
`gpuq status` spends on its own work (bench/PROFILE.md, section 1). `parse` here reads the plain
forms of `status` and `add`/`enqueue` into the same namespace parser.py would give, and returns
None for anything else: help, an unknown or abbreviated option, a value that looks like an option,
a bad value, a misplaced gpuq option among the job's words. parser.py then parses the command line
as it always did and says what is wrong. tests/test_cli_quick.py checks, option by option, that
both give the same namespace, and that every `add` and `status` option is known here.
"""

from __future__ import annotations

from types import SimpleNamespace

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

STATUS_DEFAULTS = {"all": False, "json": False, "watch": False, "interval": 2.0}
STATUS_FLAGS = {"-a": "all", "--all": "all", "--json": "json", "--watch": "watch"}

ADD_DEFAULTS: dict[str, Any] = {
    "dir": None,
    "python": None,
    "name": None,
    "after": [],
    "after_any": [],
    "retries": 0,
    "sweep": [],
    "yes": False,
    "hold": False,
    "time": None,
    "begin": None,
    "snapshot": False,
    "gpus": 1,
    "notify": False,
    "max_log_size": None,
    "on_finish": None,
    "gpu_mem": None,
    "priority": 0,
    "urgent": False,
    "preemptible": False,
    "ckpt_glob": None,
    "no_resume": False,
    "resume_arg": None,
    "env": [],
    "quiet": False,
}
ADD_FLAGS = {
    "--yes": "yes",
    "--hold": "hold",
    "--snapshot": "snapshot",
    "--notify": "notify",
    "--urgent": "urgent",
    "--urgent=force": "urgent",
    "--preemptible": "preemptible",
    "--no-resume": "no_resume",
    "-q": "quiet",
    "--quiet": "quiet",
}


class Bad(ValueError):
    """A value the quick reading does not take: parser.py reads the command line instead."""


def _text(value: str) -> str:
    return value


def _int(value: str) -> int:
    return int(value)


def _count(value: str) -> int:  # parser._count
    if not value.isdigit():
        raise Bad(value)
    return int(value)


def _ids(value: str) -> list[int]:  # parser._ids
    from gpuq.core.sweep import parse_id_ranges

    return parse_id_ranges(value)


def _env_pair(value: str) -> tuple[str, str]:  # parser._env_pair
    key, sep, rest = value.partition("=")
    if not sep or not key:
        raise Bad(value)
    return key, rest


def _seconds(value: str) -> float:  # parser._seconds
    number = float(value)
    if not 0.1 <= number <= 3600:
        raise Bad(value)
    return number


# option -> (dest, how its value is read, whether it appends)
ADD_VALUES: dict[str, tuple[str, Callable[[str], Any], bool]] = {
    "-d": ("dir", _text, False),
    "--dir": ("dir", _text, False),
    "-p": ("python", _text, False),
    "--python": ("python", _text, False),
    "--name": ("name", _text, False),
    "--after": ("after", _ids, True),
    "--after-any": ("after_any", _ids, True),
    "--retries": ("retries", _int, False),
    "--sweep": ("sweep", _text, True),
    "--time": ("time", _text, False),
    "--begin": ("begin", _text, False),
    "--gpus": ("gpus", _count, False),
    "--max-log-size": ("max_log_size", _text, False),
    "--on-finish": ("on_finish", _text, False),
    "--gpu-mem": ("gpu_mem", _text, False),
    "--priority": ("priority", _int, False),
    "--ckpt-glob": ("ckpt_glob", _text, False),
    "--resume-arg": ("resume_arg", _text, False),
    "-e": ("env", _env_pair, True),
    "--env": ("env", _env_pair, True),
}
STATUS_VALUES: dict[str, tuple[str, Callable[[str], Any], bool]] = {"--interval": ("interval", _seconds, False)}
FLAG_VALUES = {"--urgent=force": "force"}  # a flag that sets more than True


def parse(argv: list[str]) -> Optional[SimpleNamespace]:
    """The namespace of a plain `status` or `add` command line, or None: parse it with parser.py."""
    try:
        if argv and argv[0] == "status":
            return _status(argv[1:])
        if argv and argv[0] in ("add", "enqueue"):
            return _add(argv[0], argv[1:])
    except (Bad, ValueError, IndexError):
        return None
    return None


def _status(words: list[str]) -> Optional[SimpleNamespace]:
    values = dict(STATUS_DEFAULTS)
    if _options(words, STATUS_FLAGS, STATUS_VALUES, values) != len(words):
        return None  # a positional word: an error argparse words best
    if values["json"] and values["watch"]:
        return None  # mutually exclusive
    return SimpleNamespace(command="status", **values, func="cmd_view:cmd_status")


def _add(command: str, words: list[str]) -> Optional[SimpleNamespace]:
    values = {k: list(v) if isinstance(v, list) else v for k, v in ADD_DEFAULTS.items()}
    at = _options(words, ADD_FLAGS, ADD_VALUES, values)
    separated = at < len(words) and words[at] == "--"
    job = words[at + 1 :] if separated else words[at:]
    if not job:
        return None  # no SCRIPT
    if not separated and any(_is_own_option(word) for word in job[1:]):
        return None  # parser.py notes the misplaced option
    return SimpleNamespace(command=command, **values, script=job[0], args=job[1:], func="cmd_queue:cmd_add")


def _options(
    words: list[str],
    flags: dict[str, str],
    takes_value: dict[str, tuple[str, Callable[[str], Any], bool]],
    values: dict[str, Any],
) -> int:
    """Read the options at the start of `words` into `values`; the index of the first word that is
    not one (or of `--`). Bad for a form this reading leaves to argparse."""
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--" or not word.startswith("-") or word == "-":
            if word == "-":
                raise Bad(word)
            return i
        name, eq, inline = word.partition("=")
        if word in flags:
            values[flags[word]] = FLAG_VALUES.get(word, True)
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
        if appends:
            values[dest].append(read(value))
        else:
            values[dest] = read(value)
    return i


def _is_own_option(word: str) -> bool:
    """parser.misplaced_option's test: one of gpuq's long `add` options among the job's words."""
    name = word.split("=", 1)[0]
    return word.startswith("--") and word != "--help" and (name in ADD_FLAGS or name in ADD_VALUES or name == "--help")
