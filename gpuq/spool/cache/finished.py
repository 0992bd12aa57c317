"""cache/finished-view: the rows of finished jobs, as data (journal.py's ROW), so that `gpuq status
-a` need not read them all.

What `gpuq status -a` shows of a finished job never changes: its file is never edited in place (a
change writes a new file, with a new inode and mtime, or moves it to another state). So a row stays
valid while its file keeps its name, inode, mtime and size, and all of a directory's rows stay
valid while the directory keeps its inode and mtime, which move with every file added, removed or
replaced in it (trusted once settled: see engine/views/finished_index.py).

The cache holds, per finished state, the directory's signature and, packed apart, its names, file
signatures and rows; and, packed apart too, the view: every finished row in id order as columns,
which is all a later `status -a` unpacks while no directory changed, with a token that changes
with it (the CLI keeps its text of the view under that token: cli/cmd_view.py).

When a directory changed, the rows of its new files come first from cache/finished-journal, where
whoever moved each job there appended its row with the file's signature as written (journal.py):
such a file is stat()ed, not read. Only files with neither a cached nor a journalled row that still
holds are read and parsed.
"""

from __future__ import annotations

import gc
import marshal
import os
import sys
import time
from array import array
from itertools import compress, repeat
from operator import eq, is_not, itemgetter

from gpuq.core import schema
from gpuq.core.states import FINISHED
from gpuq.spool.files import free_bytes

TYPE_CHECKING = False  # typing only for annotations: `status -a` imports this (tests/test_startup_imports.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from gpuq.spool import Spool

CACHE_NAME = "finished-view"
OLD_CACHE_NAME = "finished-rows"  # the cells alone, as gpuq wrote them before this cache
CACHE_FORMAT = 5  # 3 held the rows' text (before issue 25), 4 no key, run or past (before issue 27)
ROW_FIELDS, SHOWN = 7, 4  # len(journal.ROW) and journal.SHOWN: a settled `status -a` imports no journal.py


class FinishedRows:
    """Every finished job's row in id order, as columns: ids, states, one column per field of
    journal.ROW that `status -a` shows, and the rows' command keys and run times (the queue's ETA);
    unpacked on first use. `token` changes whenever the rows do. The rows' `past` is not in it:
    only `gpuq history` reads that (finished_runs)."""

    __slots__ = ("_packed", "_unpacked", "count", "token")

    def __init__(self, packed: bytes, count: int, token: str) -> None:
        self._packed, self._unpacked, self.count, self.token = packed, None, count, token

    def __len__(self) -> int:
        return self.count

    def _parts(self) -> list:
        """[ids, states, the shown columns packed, the ETA's columns packed]; each packed part is
        unpacked by the property that reads it (the ETA's reads no name, `status -a` no key)."""
        if self._unpacked is None:
            id_bytes, states, shown, eta = marshal.loads(self._packed)
            ids = array("q")
            ids.frombytes(id_bytes)
            self._unpacked = [ids, states, shown, eta]
        return self._unpacked

    def _unpack(self, at: int) -> tuple:
        parts = self._parts()
        if type(parts[at]) is bytes:
            parts[at] = marshal.loads(parts[at])
        return parts[at]

    @property
    def ids(self) -> array:
        return self._parts()[0]

    @property
    def states(self) -> tuple:
        return self._parts()[1]

    @property
    def columns(self) -> tuple:
        """The columns `status -a` shows (journal.ROW[:journal.SHOWN])."""
        return self._unpack(2)

    @property
    def keys(self) -> tuple:
        """Each row's command key (runs.command_key; "" for a file that is not a valid job)."""
        return self._unpack(3)[0]

    @property
    def runs(self) -> tuple:
        """Each row's run time in seconds, None where unknown (runs.run_seconds)."""
        return self._unpack(3)[1]


def finished_rows(spool: Spool, listing: Any, settle: Callable[[str], Optional[tuple]]) -> FinishedRows:
    """The rows of the finished jobs of `listing` (engine/views/finished_index.py's Finished), from the
    cache where their files did not change; `settle(state)` is the key a state listed before its
    directory settled can be cached under, if it can now. The garbage collector is paused
    meanwhile: it would walk the 100,000 rows made so far, again and again, and they hold no cycles."""
    return _gc_paused(_finished_rows, spool, listing, settle)[0]


def cached_rows(spool: Spool) -> Optional[FinishedRows]:
    """The view as last cached, unchecked (rows of files removed since may be in it, files added
    since are not), or None: for a caller that can do with that while jobs keep finishing."""
    _entries, view = _read_cache(spool, _cache_header())
    return None if view is None else FinishedRows(*view)


def finished_runs(spool: Spool, listing: Any, settle: Callable[[str], Optional[tuple]]) -> list[tuple[str, Any, Any]]:
    """(state, ids, rows) of each finished state: every row whole (journal.ROW, `past`
    included), for `gpuq history`; the cache brought up to date as `finished_rows` does."""
    _view, entries, fresh = _gc_paused(_finished_rows, spool, listing, settle)
    out = []
    for state, (_key, packed) in entries.items():
        ids, rows = _entry_rows(state, packed, fresh)
        out.append((state, ids, rows))
    return out


def _entry_rows(state: str, packed: bytes, fresh: dict[str, tuple]) -> tuple[Any, list]:
    """(ids, rows) of one state's cache entry: as just built (`fresh`), else unpacked."""
    if state in fresh:
        return fresh[state]
    id_bytes, _names, _sigs, rows = marshal.loads(packed)
    ids = array("q")
    ids.frombytes(id_bytes)
    return ids, rows


def _gc_paused(function: Callable[..., Any], *args: Any) -> Any:
    enabled = gc.isenabled()
    gc.disable()
    try:
        return function(*args)
    finally:
        if enabled:
            gc.enable()


def _finished_rows(spool: Spool, listing: Any, settle: Callable[[str], Optional[tuple]]) -> tuple:
    """(the view, state -> cache entry, state -> (ids, rows) of the entries made now)."""
    header = _cache_header()
    cached, cached_view = _read_cache(spool, header)
    entries: dict[str, tuple] = {}
    fresh: dict[str, tuple] = {}  # state -> (ids, rows) of the entries made now: not unpacked again
    keys = {state: listing.signatures.get(state) for state in FINISHED}
    changed = [s for s in FINISHED if not (keys[s] is not None and s in cached and cached[s][0] == keys[s])]
    if not changed and cached_view is not None:
        return FinishedRows(*cached_view), cached, fresh  # the usual later call: nothing more to read or import
    from gpuq.spool.cache import journal  # only where rows are made or taken: it reads its code to tag them

    taken = journal.take(spool.layout) if changed else None
    for state in FINISHED:
        key, hit = keys[state], cached.get(state)
        if state not in changed:
            entries[state] = hit  # the directory has not changed since it was cached
        else:
            assert taken is not None
            packed, fresh[state] = _refresh(spool, state, listing, hit, taken.rows[state])
            if key is None:  # listed too soon after a change to be trusted: perhaps it can be now
                key = settle(state)
            entries[state] = (key, packed)
    if not fresh and cached_view is not None:
        return FinishedRows(*cached_view), entries, fresh
    parts = _build_view(entries, fresh)
    view = FinishedRows(marshal.dumps(parts), len(parts[1]), f"{time.time_ns()}-{os.getpid()}")
    if free_bytes(spool.layout.home) < journal.ROOM_LEFT:  # a disk's last room is for job files
        return view, entries, fresh  # (plain `status` comes here too when jobs wait: their ETA)
    try:
        spool.cache.write(CACHE_NAME, marshal.dumps((header, entries, (view._packed, view.count, view.token))))
        spool.cache.remove(OLD_CACHE_NAME)
    except OSError:
        return view, entries, fresh  # a read-only or full spool still shows its status, only slower
    if taken is not None:
        taken.finish()  # its rows are in the cache now
    return view, entries, fresh


_NO_ROW = ((), None)  # (signature, row) of a file without one: matches no file's signature


def _refresh(
    spool: Spool, state: str, listing: Any, hit: Any, journalled: dict[str, tuple]
) -> tuple[bytes, tuple[array, Any]]:
    """A state's packed cache entry (ids, names, file signatures, rows) for its files now, and its
    (ids, rows): rows of unchanged files are kept, rows journalled as their files were written are
    taken, the others made. Column by column where it can: 100,000 files."""
    names, ids = listing.names(state), listing.ids[state]
    old: dict[str, tuple] = {}
    if hit is not None:
        try:
            _ids, old_names, sigs, rows = marshal.loads(hit[1])
            old = dict(zip(old_names, zip(sigs, rows)))
        except (EOFError, ValueError, TypeError):
            old = {}
    if old:
        old.update(journalled)  # newer than the cache's: written when the file was
    else:
        old = journalled
    # Files with a row are stat()ed to see if it still holds (a stat is a fifth of a read, and no
    # parse); the others are read, and their signature taken from the descriptor they were read from.
    have = list(map(old.get, names, repeat(_NO_ROW)))
    with_row = list(map(is_not, have, repeat(_NO_ROW)))
    if all(with_row):  # the usual case (a journal or a cache covers every file): no dict between
        current = spool.jobs.signatures_in_order(state, names)
    else:
        stats = spool.jobs.file_signatures(state, list(compress(names, with_row)))
        current = list(map(stats.get, names))
    same = list(map(eq, map(itemgetter(0), have), current))
    if all(same):  # the usual case: every file has its row
        kept_ids, kept_names, sigs, rows = array("q", ids), names, current, list(map(itemgetter(1), have))
    else:
        todo = [(n, i) for n, i, ok in zip(names, ids, same) if not ok]
        made = _make_all(spool, state, todo)
        kept_ids, kept_names, sigs, rows = array("q"), [], [], []
        for name, job_id, ok, row in zip(names, ids, same, have):
            found = row if ok else made.get(name)
            if found is None:
                continue  # gone since the listing
            kept_ids.append(job_id)
            kept_names.append(name)
            sigs.append(found[0])
            rows.append(found[1])
    packed = marshal.dumps((kept_ids.tobytes(), tuple(kept_names), tuple(sigs), tuple(rows)))
    return packed, (kept_ids, rows)


def _build_view(entries: dict[str, tuple], fresh: dict[str, tuple]) -> tuple:
    """(ids as bytes, states, the shown columns packed, the keys and run times packed) of every
    entry's rows, in id order. Column by column, no object per row: 100,000 rows."""
    ids, states, rows = array("q"), [], []
    filled = 0  # states with rows: each state's are in id order already
    for state, (_key, packed) in entries.items():
        state_ids, state_rows = _entry_rows(state, packed, fresh)
        ids.extend(state_ids)
        states += repeat(state, len(state_ids))
        rows += state_rows
        filled += bool(state_ids)
    if filled > 1:  # a stable sort: of two copies of a job, the later state's stays after
        order = sorted(range(len(ids)), key=ids.__getitem__)
        ids, states, rows = (
            array("q", map(ids.__getitem__, order)),
            map(states.__getitem__, order),
            map(rows.__getitem__, order),
        )
    columns = tuple(zip(*rows)) if len(ids) else ((),) * ROW_FIELDS  # journal.ROW
    eta = (columns[SHOWN], columns[SHOWN + 1])  # keys and run times
    return ids.tobytes(), tuple(states), marshal.dumps(columns[:SHOWN]), marshal.dumps(eta)


PARALLEL_FROM = 2000  # files to read before the work is shared between CPUs (a fork costs ~1 ms)


def _make_all(spool: Spool, state: str, todo: list[tuple[str, int]]) -> dict[str, tuple]:
    """name -> (file signature, row) of each (name, id) of `todo`. Tens of thousands of files (the
    first `status -a` after they appeared) are shared with one forked child per extra CPU: the work
    is read-only, and a child that fails only costs its share being redone."""
    cpus = min(os.cpu_count() or 1, 8)
    if len(todo) < PARALLEL_FROM or cpus < 2 or not hasattr(os, "fork"):
        return _make_some(spool, state, todo)
    shares = [todo[i::cpus] for i in range(cpus)]
    children = [_fork_share(spool, state, share) for share in shares[1:]]
    out = _make_some(spool, state, shares[0])
    for share, child in zip(shares[1:], children):
        out.update(_collect_share(child) if child is not None else _make_some(spool, state, share))
    return out


def _make_some(spool: Spool, state: str, todo: list[tuple[str, int]]) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    from gpuq.spool.cache import journal

    load, fields, row_of, now = spool.jobs.load_shown, journal.READS, journal.row_of, time.time()
    one = _ONE.setdefault  # repeated values ("train.py", "") become one object, stored once by marshal
    for name, job_id in todo:
        try:
            job, sig = load(state, name, job_id, fields)
            row = row_of(job, now, state)
            out[name] = (sig, tuple(map(one, row, row)))
        except FileNotFoundError:
            continue
        except schema.InvalidJob as exc:  # shown as what it is: never left out, never a traceback
            sig = spool.jobs.file_signatures(state, [name]).get(name)
            if sig is not None:
                out[name] = (sig, journal.unreadable_row(name, str(exc)))
    return out


def _fork_share(spool: Spool, state: str, todo: list[tuple[str, int]]) -> Optional[tuple[int, int]]:
    """(pid, read end of its pipe) of a child that makes the rows of `todo` and sends them marshalled."""
    try:
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:  # the child: never returns into the caller's code
        code = 1
        try:
            os.close(read_fd)
            data = marshal.dumps(_make_some(spool, state, todo))
            with os.fdopen(write_fd, "wb") as out:
                out.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _collect_share(child: tuple[int, int]) -> dict[str, tuple]:
    pid, read_fd = child
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    _pid, status = os.waitpid(pid, 0)
    if status != 0:
        raise OSError(f"a child making rows of finished jobs failed (status {status})")
    loaded = marshal.loads(data)
    one = _ONE.setdefault
    return {name: (sig, tuple(map(one, row, row))) for name, (sig, row) in loaded.items()}


_ONE: dict[Any, Any] = {}  # each value made, once


def _cache_header() -> tuple:
    """What the cached rows depend on: the cache format, the interpreter (marshal's format) and the
    files of the code that made them (those of journal.TAG: a new gpuq rebuilds them), by their
    stat: a later `status -a` neither reads nor imports that code."""
    core = os.path.dirname(schema.__file__)
    code = []
    here = os.path.dirname(__file__)
    for path in (f"{here}/journal.py", f"{here}/runs.py", *(f"{core}/{m}.py" for m in CODE)):
        try:
            st = os.stat(path)
        except OSError:
            code.append((0, 0))
        else:
            code.append((st.st_mtime_ns, st.st_size))
    return (CACHE_FORMAT, marshal.version, tuple(sys.version_info[:2]), *code)


CODE = ("shown", "schema", "times")  # the modules of core that make rows, beside journal.py and runs.py


def _read_cache(spool: Spool, header: tuple) -> tuple[dict[str, tuple], Optional[tuple]]:
    """(state -> entry, (packed view, its row count, its token)) of the cache if it is whole and
    made by this code."""
    data = spool.cache.read(CACHE_NAME)
    try:
        stored_header, entries, view = marshal.loads(data) if data else (None, None, None)
    except (EOFError, ValueError, TypeError):
        return {}, None  # damaged or from another Python: rebuilt
    if stored_header != header or not isinstance(entries, dict):
        return {}, None
    good = {s: e for s, e in entries.items() if isinstance(e, tuple) and len(e) == 2 and isinstance(e[1], bytes)}
    whole = len(good) == len(entries) and _is_view(view)
    return good, view if whole else None


def _is_view(view: Any) -> bool:
    return (
        isinstance(view, tuple)
        and len(view) == 3
        and isinstance(view[0], bytes)
        and isinstance(view[1], int)
        and isinstance(view[2], str)
    )
