"""A command line from plain values: the words of a command's options that give them, so that a
caller holding values (the MCP server's tools) is read by the same parser, defaults and one-line
errors as a typed command line (cli/cmd_queue.py's request_from_options)."""

from __future__ import annotations

from typing import Any

from gpuq.cli.options import APPEND, CONST, FLAG, Command


def option_words(command: Command, values: dict[str, Any]) -> list[str]:
    """The words of `command`'s options that give `values` (dest -> value as a caller has it: True
    for a flag, a number or text, a list for an option given several times, a dict of KEY=VALUE
    pairs for `env`); None, False and empty lists are left out. Each as `--long=value`, so that
    no value is taken for an option. ValueError for a dest the command has not."""
    words: list[str] = []
    for dest, value in values.items():
        opts = [opt for opt in command.options if opt.dest == dest and not opt.positional]
        if not opts:
            raise ValueError(f"`{command.names[0]}` has no option {dest!r}")
        if value is None or value is False or value == [] or value == {}:
            continue
        opt = opts[0]
        if opt.kind == CONST:  # `--urgent` or `--urgent=force`: the one whose value it is
            opt = next((o for o in opts if o.const == value), opt)
            words.append(opt.flags[-1])
        elif opt.kind == FLAG:
            words.append(opt.flags[-1])
        else:
            items = value.items() if isinstance(value, dict) else value if opt.kind == APPEND else [value]
            if isinstance(items, (str, int)):
                items = [items]
            words += [f"{opt.flags[-1]}={_word(item)}" for item in items]
    return words


def _word(item: Any) -> str:
    """A value as it is typed: `KEY=VALUE` for a pair, `3,5` for ids."""
    if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str):
        return f"{item[0]}={item[1]}"
    if isinstance(item, (tuple, list)):
        return ",".join(map(str, item))
    return str(item)
