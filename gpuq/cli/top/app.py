"""The curses loop of `gpuq top`, its keys and its log view. An action runs in a thread of its own
(a kill waits up to its grace, a preemption for the job's checkpoint) while the screen goes on."""

from __future__ import annotations

import codecs
import contextlib
import curses
import os
import queue
import threading
import time
from collections import deque
from typing import Any, Callable, NamedTuple, Optional

from gpuq.cli import render
from gpuq.cli.top import draw, model
from gpuq.core.errors import GpuqError, Refused
from gpuq.core.job import Job
from gpuq.core.states import ACTIVE, CANCELLED, HELD, PENDING, PREEMPTED
from gpuq.core.words import shown
from gpuq.engine.lifecycle import requests
from gpuq.spool import Spool

TICK_MS = 200
UP, DOWN = ("KEY_UP", "k"), ("KEY_DOWN", "j")
ENTER = ("\n", "\r", "KEY_ENTER", "l")
KEPT_LINES = 2000  # of a log followed: enough for any screen; the log itself stays in the spool


# A key that acts on the selected job makes the request its CLI command makes: refused for the
# same reasons, in the same words, and for a job in a state other than the command's id_states.
class Action(NamedTuple):
    key: str
    verb: str
    asks: bool
    call: Callable[[Spool, int], str]

    @property
    def states(self) -> tuple[str, ...]:
        return model.states_of(self.verb)


def _on(request: Callable[..., requests.OnJobs], said: Callable[[requests.Done], str]) -> Callable[[Spool, int], str]:

    def call(sp: Spool, job_id: int) -> str:
        done = request(ids=[job_id]).one(sp, job_id, lambda _job_id, _grace: None)
        return f"#{job_id} {done.job.name} {said(done)}"

    return call


def _preempt(sp: Spool, job_id: int) -> str:
    outcome = requests.Preempt(id=job_id).run(sp)  # `gpuq preempt`'s default wait, in the app's worker thread
    job = outcome.job
    if outcome.state == PREEMPTED:
        return f"#{job_id} {job.name} preempted: {job.note} (P resumes it)"
    if outcome.left:
        return f"#{job_id} still saving: preempted when it exits (`gpuq preempt {job_id} --force` kills what is left)"
    return f"#{job_id} ended on its own meanwhile: {outcome.state}"


ACTIONS = (
    Action("x", "kill", True, _on(requests.Kill, lambda d: render.killed_text(d.job))),
    Action("c", "cancel", True, _on(requests.Cancel, lambda d: CANCELLED)),
    Action("h", "hold", False, _on(requests.Hold, lambda d: "held (u puts it back in line)")),
    Action("u", "release", False, _on(requests.Release, lambda d: "back in line")),
    Action("p", "preempt", True, _preempt),
    Action("P", "resume", False, _on(requests.Resume, lambda d: f"back in the queue (first in line): {d.how}")),
    Action("r", "retry", False, _on(requests.Retry, lambda d: f"back in the queue: {d.how}")),
)
BY_KEY = {action.key: action for action in ACTIONS}

HELP = [
    ("up/down, j/k", "select a job"),
    ("enter, l", "its log, following while it runs (esc or q: back)"),
    ("x", "kill the running job (asks)"),
    ("c", "cancel the job; a running one is killed first (asks)"),
    ("h / u", "hold a pending job / release a held one"),
    ("p / P", "preempt a running job, keeping its checkpoint (asks) / resume a preempted one"),
    ("r", "retry a failed or cancelled job"),
    ("?", "this help"),
    ("q", "leave (the jobs and the worker go on)"),
]


class LogFollow:
    def __init__(self, spool: Spool, job: Job, state: str) -> None:
        self.spool, self.job, self.state = spool, job, state
        self.lines: deque[str] = deque(maxlen=KEPT_LINES)
        self.partial = ""  # a line not ended yet (a tqdm bar ends it with \r)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # keeps a character split by a write
        self.offset = spool.logs.size(job)
        last = spool.logs.read_from(job, self.offset - 1, 1) if self.offset else b""
        self.after_cr = last == b"\r"  # a \n read next is the rest of its \r\n, no second line end
        if self.offset == 0 and state in (PENDING, HELD, CANCELLED):
            self.lines.append(f"(#{job.id} has not started: no log yet)")
        else:
            self.lines.extend(spool.logs.tail_lines(job, 200))  # its tail, then what it gains
            if last not in b"\r\n" and self.lines:  # its last line is not ended: what is read next goes on with it
                self.partial = self.lines.pop()

    def title(self) -> str:
        following = ", following" if self.spool.jobs.find(self.job.id, ACTIVE) is not None else ""
        return f"log of #{self.job.id} {self.job.name} ({self.state}{following})"

    def poll(self) -> None:
        chunk = self.spool.logs.read_from(self.job, self.offset)
        if not chunk:
            return
        self.offset += len(chunk)
        text = self.decoder.decode(chunk)
        if self.after_cr and text.startswith("\n"):
            text = text[1:]
        self.after_cr = text.endswith("\r")
        text = self.partial + text.replace("\r\n", "\n").replace("\r", "\n")
        *complete, self.partial = text.split("\n")
        self.lines.extend(complete)

    def shown(self) -> list[str]:
        return list(self.lines) + ([self.partial] if self.partial else [])


class App:
    def __init__(self, spool: Spool, interval: float, unicode: bool) -> None:
        self.spool, self.interval, self.unicode = spool, interval, unicode
        self.ring = model.Ring()
        self.snap = model.take(spool, self.ring)
        self.next_look = time.monotonic() + interval
        self.selected: Optional[int] = next(iter(self.snap.ids()), None)
        self.mode = "list"  # or "log", "help"
        self.log: Optional[LogFollow] = None
        self.asking: Optional[tuple[Action, int, str]] = None  # the question on the bottom line
        self.bottom: Optional[draw.Line] = None
        self.done: queue.Queue[draw.Line] = queue.Queue()  # outcomes of actions, from their threads
        self.busy: Optional[threading.Thread] = None

    def run(self, screen: Any) -> None:
        with contextlib.suppress(curses.error):  # a terminal that cannot hide it
            curses.curs_set(0)
        if hasattr(curses, "set_escdelay"):
            curses.set_escdelay(25)  # esc answers at once, not after ncurses' second of waiting for a sequence
        screen.timeout(TICK_MS)
        screen.keypad(True)
        ATTRS.update({draw.TITLE: curses.A_BOLD, draw.HEAD: curses.A_BOLD, draw.SELECTED: curses.A_REVERSE})
        ATTRS.update({draw.BAD: curses.A_BOLD, draw.WARN: curses.A_BOLD, draw.DIM: curses.A_DIM})
        if curses.has_colors():
            curses.start_color()
            curses.use_default_colors()
            colours = ((draw.BAD, curses.COLOR_RED), (draw.WARN, curses.COLOR_YELLOW))
            for number, (attr, colour) in enumerate(colours, 1):
                curses.init_pair(number, colour, -1)
                ATTRS[attr] = curses.color_pair(number) | curses.A_BOLD
        while True:
            self.tick()
            self._paint(screen)
            try:
                key = screen.get_wch()
            except curses.error:
                continue  # no key within the tick
            if not self.press(key if isinstance(key, str) else curses.keyname(key).decode()):
                break
        if self.busy is not None:  # an action under way is finished, not cut off
            self._paint(screen, ("waiting for the action under way to finish...", draw.WARN))
            self.busy.join()

    def tick(self) -> None:
        while not self.done.empty():
            self.bottom = self.done.get()
            self.busy, self.next_look = None, 0.0  # look again at once: the action changed the queue
        if time.monotonic() >= self.next_look:
            try:
                self.snap = model.take(self.spool, self.ring)
            except (GpuqError, OSError) as exc:  # a spool gone or full: the last look stays, said below
                self.bottom = (f"could not look at the queue: {exc}", draw.BAD)
            self.next_look = time.monotonic() + self.interval
            ids = self.snap.ids()
            if self.selected not in ids:
                self.selected = ids[0] if ids else None
        if self.mode == "log" and self.log is not None:
            self.log.poll()

    def _paint(self, screen: Any, bottom: Optional[draw.Line] = None) -> None:
        height, width = screen.getmaxyx()
        view = draw.Screen(width, height, self.selected, self.unicode)
        view.bottom = bottom or self._bottom_line()
        if self.mode == "help":
            lines = draw.help_frame(HELP, view)
        elif self.mode == "log" and self.log is not None:
            lines = draw.log_frame(self.log.title(), self.log.shown(), view)
        else:
            lines = draw.frame(self.snap, view)
        screen.erase()
        for row, (text, attr) in enumerate(lines[:height]):
            text = shown(text)  # a job's name, reason or log line may hold a NUL, which addstr refuses
            with contextlib.suppress(curses.error):  # a terminal shrunk under us: the next frame fits
                screen.addstr(row, 0, text if self.unicode else draw.ascii_text(text), ATTRS.get(attr, 0))
        screen.refresh()

    def _bottom_line(self) -> Optional[draw.Line]:
        if self.asking is not None:
            action, job_id, name = self.asking  # asked of the job as it was shown, even if a look since lost it
            return f"{action.verb} #{job_id} {name}? [y/N]", draw.WARN
        return self.bottom

    def press(self, key: str) -> bool:
        """Act on one key; False: leave."""
        if key == "KEY_RESIZE":
            return True  # the next frame is drawn to the new size
        if self.asking is not None:
            action, job_id, _name = self.asking
            self.asking = None
            if key in ("y", "Y"):
                self._start(action, job_id)
            else:
                self.bottom = (f"not done: #{job_id} left as it was", draw.DIM)
            return True
        if self.mode != "list":
            self.mode, self.log = "list", None  # esc, q or any key leaves the log or the help
            return True
        return self._list_key(key)

    def _list_key(self, key: str) -> bool:
        self.bottom = None
        if key == "q":
            return False
        if key == "?":
            self.mode = "help"
        elif key in UP or key in DOWN:
            self._move(-1 if key in UP else 1)
        elif key in ENTER and self.selected is not None:
            line = self._line(self.selected)
            if line.job is not None:
                self.log, self.mode = LogFollow(self.spool, line.job, line.state), "log"
        elif key in BY_KEY and self.selected is not None:
            self._ask(BY_KEY[key], self._line(self.selected))
        return True

    def _ask(self, action: Action, line: model.JobLine) -> None:
        if self.busy is not None:
            self.bottom = ("one action at a time: the one under way has not finished", draw.WARN)
        elif line.state not in action.states:
            applies = f"{action.verb} applies to {', '.join(action.states)} jobs"
            self.bottom = (f"#{line.job_id} is {line.state}: {applies}", draw.BAD)
        elif action.asks:
            self.asking = (action, line.job_id, line.name)  # type: ignore[assignment]  # a job's line: an id
        else:
            self._start(action, line.job_id)  # type: ignore[arg-type]  # a job's line: an id

    def _start(self, action: Action, job_id: int) -> None:
        self.bottom = (f"{action.verb} #{job_id}...", draw.DIM)
        self.busy = threading.Thread(target=self._act, args=(action, job_id), name=f"top-{action.verb}")
        self.busy.start()

    def _act(self, action: Action, job_id: int) -> None:
        try:
            self.done.put((action.call(self.spool, job_id), ""))
        except GpuqError as exc:  # a refusal, in the CLI's words
            self.done.put((f"{action.verb} #{job_id}: {exc}", draw.BAD))
        except Exception as exc:  # shown in one line: the screen and the other keys go on
            self.done.put((f"{action.verb} #{job_id} failed: {type(exc).__name__}: {exc}", draw.BAD))

    def _move(self, step: int) -> None:
        ids = self.snap.ids()
        if not ids:
            return
        at = ids.index(self.selected) if self.selected in ids else 0
        self.selected = ids[max(0, min(len(ids) - 1, at + step))]

    def _line(self, job_id: int) -> model.JobLine:
        return next(line for line in self.snap.lines() if line.job_id == job_id)


ATTRS: dict[str, int] = {}


def run(spool: Spool, interval: float, unicode: bool) -> None:
    app = App(spool, interval, unicode)
    try:
        curses.wrapper(app.run)
    except curses.error as exc:  # a terminal curses cannot drive (no terminfo entry for $TERM)
        term = os.environ.get("TERM") or "not set"
        raise Refused(f"cannot draw on this terminal (TERM={term}): {exc}; `gpuq top --once` prints a frame") from None
