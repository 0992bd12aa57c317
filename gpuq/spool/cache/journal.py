"""What a finished job's row of `gpuq status -a` holds, as data, and cache/finished-journal, where
whoever moves a job into a finished state appends it (spool_layout.md, "cache/").

The first `gpuq status -a` over 100,000 finished jobs cannot afford to open and parse 100,000 files
(about 20 us each just to open and read them here; issue 15). So the row is made when the job's file
is written, from the very bytes written, by the code that makes it from a file (`row_of`, after
core/shown.py's parse), and appended here with the file's signature as written (a rename keeps
inode, mtime and size). The next `status -a` folds the journal into cache/finished-view
(finished.py) and uses a row only while the file still has that signature. The row is data (the
job's name, script, seconds run, exit...): its text is the CLI's (cli/render.py).

A cache: never fsynced; any failure to append is ignored (it only costs that file being read once);
a torn last line is skipped; a row lost in a race only costs speed.
"""

from __future__ import annotations

import os
import zlib
from itertools import compress, repeat
from operator import eq, methodcaller

from gpuq.core import jsontext, schema, shown, times
from gpuq.core.states import FINISHED
from gpuq.spool.cache import runs
from gpuq.spool.files import free_bytes, read_small, unlink_quietly
from gpuq.system import procs

TYPE_CHECKING = False  # typing only for annotations: `status -a` imports this (tests/test_startup_imports.py)
if TYPE_CHECKING:
    from typing import Any, Optional

    from gpuq.spool.layout import Layout

NAME = "finished-journal"
MAX_BYTES = 64 << 20  # about 500,000 rows: past it (no `status -a` for that long) rows are not appended
FORMAT = 3  # 1 held the rows' text (before issue 25), 2 no key, run or past (before issue 27): not used
ROOM_LEFT = 1 << 20  # below this much free space no row is appended (the worker starts no job either)

# The fields of a job file that its row is made from: all that core/shown.py reads and checks.
READS = ("name", "cmd", "started_at", "finished_at", "exit_code", "signal", "slurm", "reason", "code_changed")
READS += ("note", "priority")
# A finished job's row: its name, its script (schema.display_script), whole seconds run (None:
# unknown) and its end, a tuple of END: how it ended, where and why, and why its file is not a
# valid job ("" for one that is). Absent strings are "", absent numbers None. 100,000 rows share a
# few ends: one object each in the cache, and one info cell each to make (cli/render.py).
# Then what the queue's ETA and `gpuq history` read (runs.py): the command key, the run time in
# seconds (None: unknown or adopted) and the past, the job's runs as a JSON text ("" and None for
# a file that is not a valid job).
ROW = ("name", "script", "seconds", "end", "key", "run", "past")
SHOWN = 4  # the first fields of ROW are what `status -a` shows
END = ("exit_code", "signal", "slurm_job", "reason", "code_changed", "note", "priority", "unreadable")
_END_TYPES = (int, str, int, str, str, str, int)  # of the END a line holds (a number may be null)

# A journal line: tag, state, file name, inode, mtime_ns, size, name, script, seconds, the end
# less `unreadable` as a JSON array, key, run (a float's repr) and past.
FIELDS = 13


def row_of(job: dict[str, Any], now: float, state: str) -> tuple:
    """The row of a finished job in `state` (its READS fields checked), its time counted up to
    `now` when it started and has no end."""
    start = times.parse_iso(job.get("started_at"))
    seconds = None
    if start is not None:
        spent = (times.parse_iso(job.get("finished_at")) or now) - start
        seconds = int(spent) if spent >= 0 else None
    end = (
        job.get("exit_code"),
        job.get("signal") or "",
        (job.get("slurm") or {}).get("job_id"),
        job.get("reason") or "",
        job.get("code_changed") or "",
        job.get("note") or "",
        job.get("priority"),
        "",
    )
    key = runs.command_key(job["cmd"], job.get("cwd"))
    return (
        job["name"],
        schema.display_script(job["cmd"]),
        seconds,
        end,
        key,
        runs.run_seconds(job),
        runs.past_text(state, job),
    )


def unreadable_row(file_name: str, reason: str) -> tuple:
    """The row of a finished file that is not a valid job: its name and why."""
    return file_name, "", None, (None, "", None, "", "", "", None, reason), "", None, ""


def depends_on_clock(job: dict[str, Any]) -> bool:
    """Whether the row's time is counted up to now (a start without an end): such a row is not
    journalled, its file is read each time the cache is filled."""
    return times.parse_iso(job.get("started_at")) is not None and not times.parse_iso(job.get("finished_at"))


def _code_tag() -> str:
    """Which code made a row: the format and the content of the modules that make rows, as this
    process loaded them (the same code installed elsewhere gives the same tag). A row made by
    another gpuq (an upgrade while a worker runs) is not used."""
    digest = zlib.crc32(str(FORMAT).encode())
    for path in (__file__, runs.__file__, shown.__file__, schema.__file__, times.__file__):
        try:
            with open(path or "", "rb") as source:
                digest = zlib.crc32(source.read(), digest)
        except OSError:
            digest = zlib.crc32(b"?", digest)
    return f"{digest:08x}"


TAG = _code_tag()  # when the rows' code was loaded: see _code_tag


def append(layout: Layout, state: str, name: str, data: bytes, signature: tuple[int, int, int]) -> None:
    """Append the row of the job file `name` just published in `state` with `data`, whose
    signature as written is `signature`. Never raises: the file is written; this only saves time."""
    try:
        line = row_line(state, name, data, signature)
        if line is None or free_bytes(layout.home) < ROOM_LEFT:
            return  # a nearly full disk: its last room is for job files, not for a cache
        fd = os.open(layout.cache_path(NAME), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            if os.fstat(fd).st_size < MAX_BYTES:
                os.write(fd, line)  # one write: appenders running at once never interleave within a line
        finally:
            os.close(fd)
    except Exception:  # noqa: BLE001 - a full disk, a read-only spool, a surprise: the row is only a cache
        pass


def row_line(state: str, name: str, data: bytes, signature: tuple[int, int, int]) -> Optional[bytes]:
    """The journal line of a job file: its row as a read of `data` makes it; None when the file's
    READS fields are not valid or its row's time depends on the clock (such files are read)."""
    try:
        job = shown.load_shown(data, int(name[: name.index("-")]), READS)
    except (schema.InvalidJob, ValueError):
        return None
    if depends_on_clock(job):
        return None
    job_name, script, seconds, end, key, run, past = row_of(job, 0.0, state)
    fields = (
        TAG,
        state,
        name,
        *map(str, signature),
        job_name,
        script,
        seconds,
        jsontext.dumps(list(end[:-1]), ensure_ascii=False),
        key,
        None if run is None else float.__repr__(run),
        past,
    )
    return ("\t".join(map(_field, fields)) + "\n").encode()


def _field(value: Any) -> str:
    """A field of a line as written: a number, "" for None, or the text itself; when the text
    holds a tab, a newline, a backslash or what UTF-8 cannot encode (a lone surrogate), a backslash
    then its JSON string."""
    if type(value) is not str:
        return "" if value is None else str(value)
    if "\\" in value or "\t" in value or "\n" in value or not _utf8(value):
        return "\\" + jsontext.dumps(value, ensure_ascii=True)
    return value


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _unfield(text: str) -> str:
    """A text field's string (ValueError if it is not one _field wrote)."""
    if not text.startswith("\\"):
        return text
    value = jsontext.loads(text[1:])
    if type(value) is not str:
        raise ValueError("not a string")
    return value


def _number(text: str) -> Optional[int]:
    return int(text) if text else None


def _seconds(text: str) -> Optional[float]:
    return float(text) if text else None


def _run_times(column: list[str]) -> list[Optional[float]]:
    """A column of run times (100,000: converted in C while none is unknown)."""
    try:
        return list(map(float, column))
    except ValueError:
        return list(map(_seconds, column))


def _end(text: str) -> tuple:
    """A row's end from its field (ValueError if it is not one row_line wrote)."""
    value = jsontext.loads(_unfield(text))
    if type(value) is not list or len(value) != len(_END_TYPES) or not all(map(_fits, value, _END_TYPES)):
        raise ValueError("not the end of a row")
    return (*value, "")


def _fits(value: Any, kind: type) -> bool:
    return type(value) is kind or (value is None and kind is int)


class Taken:
    """The journal files taken for one fold. `rows` (parsed on first use): state -> name ->
    (signature, row), the later row of a name winning; `finish()` removes the files once their
    rows are cached."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.paths: list[str] = []
        self._rows: Optional[dict[str, dict[str, tuple]]] = None

    @property
    def rows(self) -> dict[str, dict[str, tuple]]:
        if self._rows is None:
            self._rows = {state: {} for state in FINISHED}
            for data in self.data:
                _add_rows(self._rows, data)
            self.data = []
        return self._rows

    def finish(self) -> None:
        for path in self.paths:
            unlink_quietly(path)


def take(layout: Layout) -> Taken:
    """The journal, renamed aside first (rows appended meanwhile start a new journal), with any
    journal left aside by a fold that died."""
    taken = Taken()
    mine = layout.cache_path(f"{NAME}.{os.getpid()}")
    try:
        os.rename(layout.cache_path(NAME), mine)
    except OSError:
        pass  # none (or a read-only spool): only leftovers, if any
    try:
        names = os.listdir(os.path.dirname(mine))
    except OSError:
        return taken
    for entry in sorted(names):
        owner = entry[len(NAME) + 1 :] if entry.startswith(NAME + ".") else ""
        if not owner.isdigit() or (int(owner) != os.getpid() and procs.pid_alive(int(owner))):
            continue  # not a journal set aside, or one another fold is reading now
        path = layout.cache_path(entry)
        data = read_small(path, cap=MAX_BYTES + (1 << 20), mine=True)
        if data:
            taken.data.append(data)
        taken.paths.append(path)
    return taken


def _add_rows(out: dict[str, dict[str, tuple]], data: bytes) -> None:
    """The rows of a journal's text, into `out`. 100,000 lines: split and checked column by column
    (maps in C); a surprise anywhere, and they are taken line by line instead."""
    text = data.decode("utf-8", "replace")  # damage only in lines left out below
    escaped = "\\" in text  # fields written as JSON strings: rare (a tab or a backslash in a name)
    lines = text.split("\n")
    lines.pop()  # "" after the last newline, or a torn last line: an append cut short
    whole = list(map(eq, map(methodcaller("count", "\t"), lines), repeat(FIELDS - 1)))
    if not all(whole):
        lines = list(compress(lines, whole))
    columns = _columns(lines)
    if set(columns[0]) - {TAG}:  # rows of another gpuq, or a torn line run into the next one
        lines = list(compress(lines, map(eq, columns[0], repeat(TAG))))
        columns = _columns(lines)
    try:
        for at in (1, 2, 6, 7, 10, 12) if escaped else ():
            if any(map(methodcaller("startswith", "\\"), columns[at])):
                columns[at] = list(map(_unfield, columns[at]))
        sigs = zip(*[list(map(int, columns[at])) for at in (3, 4, 5)])
        seconds = {text: _number(text) for text in set(columns[8])}  # few distinct values: each converted once
        ends = {text: _end(text) for text in set(columns[9])}  # one object each, stored once by the cache
        scripts: dict[str, str] = {}  # "train.py": one object
        keys: dict[str, str] = {}  # a few commands, each one object
        rows = zip(
            columns[6],
            map(scripts.setdefault, columns[7], columns[7]),
            map(seconds.__getitem__, columns[8]),
            map(ends.__getitem__, columns[9]),
            map(keys.setdefault, columns[10], columns[10]),
            _run_times(columns[11]),  # here, where a bad one sends the lines one by one
            columns[12],
        )
    except (ValueError, RecursionError):
        _add_lines(out, lines)
        return
    _add(out, columns[1], columns[2], sigs, rows)


def _columns(lines: list[str]) -> list[list[str]]:
    flat = "\t".join(lines).split("\t") if lines else []
    return [flat[i::FIELDS] for i in range(FIELDS)]


def _add_lines(out: dict[str, dict[str, tuple]], lines: list[str]) -> None:
    """The rows of `lines` one by one, each that is not whole left out."""
    for line in lines:
        parts = line.split("\t")
        try:
            row = (_unfield(parts[6]), _unfield(parts[7]), _number(parts[8]), _end(parts[9]))
            row += (_unfield(parts[10]), _seconds(parts[11]), _unfield(parts[12]))
            sig = tuple(map(int, parts[3:6]))
            _add(out, [_unfield(parts[1])], [_unfield(parts[2])], [sig], [row])
        except (ValueError, IndexError, RecursionError):
            continue


def _add(out: dict[str, dict[str, tuple]], states: Any, names: Any, sigs: Any, rows: Any) -> None:
    made = zip(names, zip(sigs, rows))
    if not states:
        return
    if len(set(states)) == 1:  # the usual journal: all of one state (a later row of a name wins)
        found = out.get(states[0])
        if found is not None:
            found.update(made)
        return
    for state, (name, row) in zip(states, made):
        found = out.get(state)
        if found is not None:
            found[name] = row
