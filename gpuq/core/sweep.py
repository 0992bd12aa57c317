"""Sweeps: one `gpuq add` that queues a job per combination of values (job id ranges: timespec.py). Only braces
around an identifier are placeholders, so JSON, `{}` of find or `{0}` pass through; other doubled
braces are left as they are, unlike str.format, because `}}` ends nested JSON.
"""

# Real annotations, no future import: see test_the_everyday_commands_compile_no_source.
import itertools
import math
import re
import shlex
from typing import NamedTuple

DEFAULT_LIMIT = 1000
HARD_LIMIT = 100_000  # even with --yes: past this a typo is far likelier than a plan

# Patterns are kept as text: `re` compiles (and caches) each at its first use, so a command that
# never parses a sweep does not pay for compiling them at start-up.
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# The escape first: at a `{{lr}}` the first alternative wins, so it never reads as `{` + `{lr}` + `}`.
_PLACEHOLDER = rf"\{{\{{({_IDENT})\}}\}}|\{{({_IDENT})\}}"
_CONTROL = r"[\x00-\x1f\x7f]"


class Combination(NamedTuple):
    """One job of a sweep: its values (in --sweep order) and its command with them filled in."""

    values: dict[str, str]
    words: list[str]


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """`lr=1e-4,3e-4,1e-3` -> ("lr", ["1e-4", "3e-4", "1e-3"])."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep:
        raise ValueError(f"--sweep: expected NAME=V1,V2,... (e.g. lr=1e-4,3e-4), got {text!r}")
    if not re.fullmatch(_IDENT, name):
        raise ValueError(f"--sweep: {name!r} is not a name (letters, digits and _, not starting with a digit)")
    values = [value.strip() for value in _split_values(rest)]
    if not rest.strip():
        raise ValueError(f"--sweep {name}: no values (expected {name}=V1,V2,...)")
    if any(not value for value in values):
        raise ValueError(f"--sweep {name}: empty value in {rest!r} (a stray comma?)")
    for value in values:
        if re.search(_CONTROL, value):
            raise ValueError(f"--sweep {name}: value {value!r} holds a control character")
    repeated = sorted({value for value in values if values.count(value) > 1})
    if repeated:
        raise ValueError(f"--sweep {name}: value {repeated[0]!r} given twice (it would queue the same job twice)")
    return name, values


def _split_values(text: str) -> list[str]:
    values, current, chars = [], [], iter(text)
    for char in chars:
        if char == "\\":
            following = next(chars, "")
            if following in (",", "\\"):
                current.append(following)
            else:
                current.append(char + following)  # not an escape: keep the backslash as typed
        elif char == ",":
            values.append("".join(current))
            current = []
        else:
            current.append(char)
    values.append("".join(current))
    return values


def expand(
    sweeps: list[tuple[str, list[str]]],
    words: list[str],
    limit: int = DEFAULT_LIMIT,
    allow_more: bool = False,
) -> list[Combination]:
    """Every combination of the sweeps' values, the first sweep varying slowest, each with `words`
    filled in."""
    if not sweeps:
        return [Combination({}, list(words))]
    _check_sweeps(sweeps)
    _check_placeholders(sweeps, words)
    count = math.prod(len(values) for _, values in sweeps)
    if count > HARD_LIMIT:
        raise ValueError(f"{count:,} jobs; one add queues at most {HARD_LIMIT:,}, even with --yes")
    if count > limit and not allow_more:
        raise ValueError(f"{count:,} jobs; pass --yes to queue more than {limit:,}")
    names = [name for name, _ in sweeps]
    combinations = []
    for chosen in itertools.product(*(values for _, values in sweeps)):
        values = dict(zip(names, chosen))
        combinations.append(Combination(values, [fill(word, values) for word in words]))
    return combinations


def fill(word: str, values: dict[str, str]) -> str:
    """`word` with each `{name}` replaced by values[name] and each `{{name}}` by a literal `{name}`."""

    def replace(match: re.Match) -> str:
        escaped, name = match.groups()
        return "{" + escaped + "}" if escaped else values[name]

    return re.sub(_PLACEHOLDER, replace, word)


def placeholders(word: str) -> list[str]:
    """The sweep names `word` refers to, in order (escaped `{{name}}` excluded)."""
    return [name for escaped, name in re.findall(_PLACEHOLDER, word) if not escaped]


def _check_sweeps(sweeps: list[tuple[str, list[str]]]) -> None:
    seen = set()
    for name, values in sweeps:
        if name in seen:
            raise ValueError(f"--sweep {name} given twice; list all its values in one --sweep {name}=V1,V2,...")
        seen.add(name)
        if not values:
            raise ValueError(f"--sweep {name}: no values")


def _check_placeholders(sweeps: list[tuple[str, list[str]]], words: list[str]) -> None:
    names = [name for name, _ in sweeps]
    used = [name for word in words for name in placeholders(word)]
    unknown = list(dict.fromkeys(name for name in used if name not in names))
    if unknown:
        shown = ", ".join("{" + name + "}" for name in unknown)
        raise ValueError(
            f"unknown placeholder{'s' if len(unknown) > 1 else ''} {shown} in {_command_text(words, unknown[0])!r}; "
            f"sweeps: {', '.join(names)} (write {{{{{unknown[0]}}}}} for a literal {{{unknown[0]}}})"
        )
    unused = [name for name in names if name not in used]
    if unused:
        raise ValueError(
            f"--sweep {unused[0]} is not used in the command (no {{{unused[0]}}}): its jobs would all run the same"
        )


def _command_text(words: list[str], name: str) -> str:
    """The command for an error message; just the offending word when the command is long."""
    text = " ".join(words)
    if len(text) > 120:
        text = next(word for word in words if name in placeholders(word))
    return re.sub(_CONTROL, "?", text)


def sweep_name(base: str, values: dict[str, str]) -> str:
    """`exp02/train lr=1e-4 seed=0`, a value with spaces or quotes shell-quoted."""
    pairs = " ".join(f"{name}={_quoted(value)}" for name, value in values.items())
    return f"{base} {pairs}" if base and pairs else base or pairs


def _quoted(value: str) -> str:
    return shlex.quote(value) if re.search(r"[\s'\"]", value) else value
