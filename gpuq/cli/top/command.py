"""`gpuq top`: curses, from the standard library, works after a plain install and draws its first
frame at once, where Textual's import alone costs more (bench/top_start.py measures both)."""

from __future__ import annotations

import argparse
import locale
import os
import shutil
import sys

from gpuq.cli.common import spool
from gpuq.cli.top import draw, model
from gpuq.core.errors import Refused, UsageError
from gpuq.core.words import shown


def cmd_top(args: argparse.Namespace) -> int:
    if args.once:  # one frame, as the screen would show it (the first job selected), less its blank rows
        size = shutil.get_terminal_size((100, 30))
        snap = model.take(spool(), model.Ring())
        screen = draw.Screen(size.columns, size.lines, next(iter(snap.ids()), None), _unicode())
        screen.bottom = ("", "")  # no key-help line: a one-shot frame takes no keys
        frame = draw.frame(snap, screen)
        text = "\n".join(shown(line).rstrip() for line, attr in frame if line or attr)
        print(text if _unicode() else draw.ascii_text(text))
        return 0
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("needs a terminal (stdin and stdout); `gpuq top --once` prints one frame")
    try:
        from gpuq.cli.top import app  # here: a Python without curses still runs `top --once`
    except ImportError as exc:  # a Python built without curses (its _curses module)
        raise Refused(f"gpuq top needs Python's curses module, which this Python lacks ({exc})") from None
    app.run(spool(), args.interval, _unicode())
    return 0


def _unicode() -> bool:
    """Whether the terminal takes the block characters of the bars and sparklines: by the character
    set of the locale, which curses draws in (stdout's encoding alone is UTF-8 in the C locale too,
    under Python's UTF-8 mode, where curses draws them blank), and by stdout's, which --once prints in."""
    encodings = (locale.nl_langinfo(locale.CODESET), sys.stdout.encoding or "")
    utf = all(encoding.lower().replace("-", "") in ("utf8", "utf16", "utf32") for encoding in encodings)
    return utf and os.environ.get("TERM") != "linux"
