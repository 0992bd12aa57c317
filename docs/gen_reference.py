"""Writes docs/reference/commands.md from the command line itself: each command's `--help`, as
argparse prints it from the one options table (gpuq/cli/commands.py). tests/test_docs.py fails when
the page and the code differ: `python docs/gen_reference.py` writes it anew.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parent / "reference" / "commands.md"
WIDTH = 100  # the help text's width: fixed, so that the page does not depend on the terminal

HEADER = """# Commands

Every command and its options, as `gpuq COMMAND --help` prints them. This page is generated from
the command line's own table (`python docs/gen_reference.py`); a test fails when they differ.

"""


def help_text(*words: str) -> str:
    """What `gpuq WORDS --help` prints."""
    from gpuq.cli.parser import build_parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            build_parser(only=words[0]).parse_args([*words, "--help"])
        except SystemExit:
            pass
    return out.getvalue().rstrip() + "\n"


def page() -> str:
    from gpuq.cli.commands import COMMANDS

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH + 2)  # the parser's formatter reads it (cli/parser.py)
    try:
        return _page(COMMANDS)
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _page(commands: Any) -> str:
    parts = [HEADER]
    for command in commands:
        if command.help is None:  # an internal command (shell completion's helper): not listed
            continue
        name = command.names[0]
        also = f"\n\nAlso spelled `gpuq {'`, `gpuq '.join(command.names[1:])}`." if command.names[1:] else ""
        parts.append(f"## gpuq {name}\n\n{command.help[0].upper()}{command.help[1:]}{also}\n\n")
        parts.append(f"```text\n{help_text(name)}```\n\n")
        for action in command.actions:
            parts.append(f"### gpuq {name} {action.names[0]}\n\n```text\n{help_text(name, action.names[0])}```\n\n")
    return "".join(parts).rstrip() + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(PAGE.parent.parent.parent))
    PAGE.write_text(page())
    print(f"wrote {PAGE}")
