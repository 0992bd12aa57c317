"""The frames of `gpuq top`, pure, so that they are tested without a terminal: (text, attribute)
lines, each at most `width - 1` columns (curses refuses the last cell of the screen), counted as the
terminal draws them (render.width: a CJK character takes two)."""

from __future__ import annotations

import time
from typing import Optional

from gpuq.cli.render import cut, pad, progress_bar
from gpuq.cli.render import width as columns_of
from gpuq.cli.top.model import GpuLine, JobLine, Snapshot
from gpuq.core.states import CANCELLED, FAILED, INTERRUPTED, PREEMPTED, RUNNING, UNFINISHED

TITLE, HEAD, SELECTED, BAD, WARN, DIM = "title", "head", "selected", "bad", "warn", "dim"
Line = tuple[str, str]

SPARKS = " ▁▂▃▄▅▆▇█"
ASCII_SPARKS = " .:-=+*#%"
HINT = "? help  q quit  enter log  x kill  c cancel  h/u hold/release  p/P preempt/resume  r retry"
WENT_WRONG = (FAILED, CANCELLED, PREEMPTED, INTERRUPTED)


class Screen:
    def __init__(self, width: int, height: int, selected: Optional[int] = None, unicode: bool = True) -> None:
        self.width, self.height, self.selected, self.unicode = width, height, selected, unicode
        self.bottom: Optional[Line] = None  # a question (WARN) or the outcome of an action


def frame(snap: Snapshot, screen: Screen) -> list[Line]:
    width = max(20, screen.width)
    clock = time.strftime("%H:%M:%S", time.localtime(snap.at))
    head: list[Line] = [(_fit(f"gpuq top  {snap.worker}", width, clock), TITLE)]
    head += gpu_panel(snap, width, screen.unicode)
    body = queue_lines(snap, width, screen)
    bottom = [screen.bottom or (_cut(HINT, width), DIM)]
    room = max(1, screen.height - len(head) - len(bottom))
    return head + _scrolled(body, room, screen.selected) + bottom


def gpu_panel(snap: Snapshot, width: int, unicode: bool = True) -> list[Line]:
    if snap.gpu_title is None:
        return [
            (_cut("no GPUs (no NVIDIA driver, and GPUQ_FAKE_GPUS is not set): jobs run one slot at a time", width), DIM)
        ]
    spark = max(8, min(30, (width - 60) // 2 + 8))
    lines: list[Line] = [(_cut(snap.gpu_title, width), HEAD)]
    lines.append((_cut(f"{'GPU':>3} {'util':>4} {'recent':<{spark}} {'memory':>12}  held by", width), HEAD))
    lines += [(_cut(_gpu_text(gpu, spark, unicode), width), "") for gpu in snap.gpus]
    return lines


def _gpu_text(gpu: GpuLine, spark: int, unicode: bool) -> str:
    util = f"{gpu.util}%" if gpu.util is not None else "?"
    mem = f"{gpu.used_mib / 1024:.1f}/{gpu.total_mib / 1024:.0f}G"
    held = ", ".join(gpu.holders) or "free"
    return f"{gpu.index:>3} {util:>4} {sparkline(gpu.utils, spark, unicode)} {mem:>12}  {held}"


def sparkline(values: list[Optional[int]], cells: int, unicode: bool = True) -> str:
    """A space where not known; the lowest mark for anything known (an idle GPU is seen, not blank)."""
    marks = SPARKS if unicode else ASCII_SPARKS
    shown = values[-cells:]
    text = "".join(" " if v is None else marks[min(8, max(1, round(v * 8 / 100)))] for v in shown)
    return text.rjust(cells)


def queue_lines(snap: Snapshot, width: int, screen: Screen) -> list[tuple[str, str, Optional[int]]]:
    name_w = max(12, min(30, width // 5))
    out: list[tuple[str, str, Optional[int]]] = []
    sections = (("Running", snap.running), ("Waiting", snap.waiting), ("Finished, newest", snap.finished))
    for title, lines in sections:
        if not lines and lines is not snap.running:  # "Running: none" is said; the others are left out
            continue
        out.append((_cut(f"{title} ({len(lines)})" if lines else f"{title}: none", width), HEAD, None))
        for line in lines:
            chosen = line.job_id is not None and line.job_id == screen.selected
            text = (">" if chosen else " ") + _row_text(line, name_w, screen.unicode)  # seen without colours too
            out.append((_cut(text, width), SELECTED if chosen else _attr(line), line.job_id))
    for warning in snap.warnings:
        out.append((_cut(f"warning: {warning}", width), WARN, None))
    return out


def _row_text(line: JobLine, name_w: int, unicode: bool) -> str:
    mark = f"#{line.job_id}" if line.job_id is not None else ""
    name = pad(cut(line.name, name_w), name_w)
    if line.job_id is None:  # a folded sweep: its summary says its progress and its jobs' states
        return f"{mark:>5} {name} {line.info}"
    if line.state == RUNNING:
        bar = progress_bar(line.fraction, unicode=unicode) if line.fraction is not None else ""
        progress = f"{bar} {line.progress}" if bar else line.progress
        util = f"{line.util}%" if line.util is not None else ""
        info = "  ".join(part for part in (line.idle, line.info) if part)
        return f"{mark:>5} {name} {progress:<24} {util:>4}  {info}"
    wide = 13 if line.state in UNFINISHED else 10  # `starts ~4m10s`, `ran 2h10m`
    return f"{mark:>5} {line.state:<9} {name} {line.progress:<{wide}} {line.info}"


def _attr(line: JobLine) -> str:
    if line.idle:
        return WARN
    return BAD if line.state in WENT_WRONG else ""


def _scrolled(body: list[tuple[str, str, Optional[int]]], room: int, selected: Optional[int]) -> list[Line]:
    start = 0
    if len(body) > room:
        at = next((n for n, (_t, _a, job_id) in enumerate(body) if job_id is not None and job_id == selected), 0)
        start = min(max(0, at - room // 2), len(body) - room)
    shown = [(text, attr) for text, attr, _job_id in body[start : start + room]]
    return shown + [("", "")] * (room - len(shown))


def log_frame(title: str, lines: list[str], screen: Screen) -> list[Line]:
    width = max(20, screen.width)
    room = max(1, screen.height - 2)
    shown = [(_cut(text.expandtabs(), width), "") for text in lines[-room:]]
    bottom = screen.bottom or (_cut("esc or q back to the queue  (following the log while the job runs)", width), DIM)
    return [(_cut(title, width), TITLE)] + shown + [("", "")] * (room - len(shown)) + [bottom]


def help_frame(keys: list[tuple[str, str]], screen: Screen) -> list[Line]:
    width = max(20, screen.width)
    lines: list[Line] = [("gpuq top: keys", TITLE), ("", "")]
    lines += [(_cut(f"  {key:<12} {what}", width), "") for key, what in keys]
    lines += [("", ""), (_cut("It only looks: the worker runs the jobs. Any key goes back.", width), DIM)]
    return lines[: max(1, screen.height)]


def ascii_text(text: str) -> str:
    """A `?` per column a character took (none for a combining mark): the columns stay aligned."""
    return text if text.isascii() else "".join(c if c.isascii() else "?" * columns_of(c) for c in text)


def _cut(text: str, width: int) -> str:
    return cut(text, width - 1)


def _fit(left: str, width: int, right: str) -> str:
    room = width - 1 - len(right) - 2
    return pad(cut(left, room), room) + "  " + right
