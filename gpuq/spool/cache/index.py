"""cache/finished-jobs: the one index of finished jobs, derived from done/, failed/, cancelled/ and
`kept-runs`, rebuildable at any time (spool_layout.md, "Derived data", gives its format). Each
state's rows are stamped with its directory's inode and mtime: while the stamp holds, nothing is
listed. The rows, most of the file, are read only when something asks for them (`status -a`,
`history`, a refresh): a plain `status` reads the head alone.
"""

# Real annotations, no future import: see test_the_everyday_commands_compile_no_source.
import marshal
import os
import time
from functools import cache, cached_property
from operator import itemgetter
from typing import Any, Callable, Iterator, NamedTuple, Optional

from gpuq.core import schema
from gpuq.core.job import Job
from gpuq.core.states import DONE, FINISHED
from gpuq.core.times import parse_iso
from gpuq.spool.cache import runs
from gpuq.spool.cache.journal import Journal, Rows
from gpuq.spool.files import MIN_FREE_TO_START, Files, free_bytes, read_job_file, read_span, unlink_quietly
from gpuq.spool.ids import IdCounter
from gpuq.spool.kept import KeptRuns
from gpuq.spool.layout import Layout, is_job_name
from gpuq.spool.store import MAX_JOB_BYTES, JobRef, JobStore

NAME = "finished-jobs"
FORMAT = 7  # 6: runs without their reasons; 5: pasts as lists; 4: one marshal object, read whole by every look
HEAD_SIZE_BYTES = 8  # the file starts with the head's length, so that the head alone is read
HEAD_PROBE_BYTES = 1 << 16  # the first read of the index (a longer head: a second one)
RECENT_RUNS = 5  # per command key, the newest run times of done jobs kept in the head (the queue's ETA)
SETTLE_SECONDS = 2.0  # a directory changed this recently is not stamped: a change in its tick keeps its mtime
# What gpuq before this index kept in cache/: removed when the index is written.
OLD_NAMES: tuple[str, ...] = ("finished-journal", "finished-view", "finished-index", "finished-table", "queue-runs")
OLD_NAMES += ("status-jobs", "kept-runs", "finished-rows")

# A row: the job's name, its script (schema.display_script), whole seconds run (None: unknown) and
# its end, a tuple of END ("" for an absent string, None for an absent number; `unreadable`: why
# the file is not a valid job). Then what the ETA and history read (runs.py): the command key,
# the run time in seconds (None: unknown or adopted) and the past, its runs (runs.facts, as marshal
# bytes: one object per row, so that `status -a` unmarshals no lists it does not show; "" for a
# file that is no valid job).
ROW = ("name", "script", "seconds", "end", "key", "run", "past")
PAST = ROW.index("past")
END = ("exit_code", "signal", "slurm_job", "reason", "code_changed", "note", "priority", "unreadable")
# The fields of a job file that its row reads (row_of, runs.py): only they are checked for a row.
READS: tuple[str, ...] = ("name", "cmd", "cwd", "started_at", "finished_at", "exit_code", "signal", "slurm")
READS += ("reason", "code_changed", "note", "priority", "adopted", "sweep", "preemptions", "history", "attempts")
READS += ("gpu_request", "gpus", "slot")


def file_row(data: bytes, state: str, job_id: int, now: float) -> tuple[tuple, bool]:
    """The row of a job file's bytes and whether it depends on `now` (a start without an end);
    schema.InvalidJob when the fields it reads are not valid."""
    job = schema.validate_fields(schema.parse_bytes(data), READS, job_id)
    return row_of(job, state, now), parse_iso(job.finished_at) is None and parse_iso(job.started_at) is not None


def row_of(job: Job, state: str, now: float) -> tuple:
    """The row of a valid job file in finished `state`; a start without an end counts up to `now`."""
    start = parse_iso(job.started_at)
    seconds = None
    if start is not None:
        spent = (parse_iso(job.finished_at) or now) - start
        seconds = int(spent) if spent >= 0 else None
    slurm = job.slurm
    end = (
        job.exit_code,
        job.signal or "",
        slurm.get("job_id") if isinstance(slurm, dict) else None,
        job.reason or "",
        job.code_changed or "",
        job.note or "",
        job.priority,
        "",
    )
    return (
        job.name,
        schema.display_script(job.cmd),
        seconds,
        end,
        runs.command_key(job.cmd, job.cwd),
        runs.run_seconds(job),
        marshal.dumps(runs.facts(state, job)),
    )


class Entry(NamedTuple):
    """One finished state: its directory's stamp (None: list it again), its files' ids, names and
    inodes, and their rows (None in a head: not read yet)."""

    stamp: Optional[tuple[int, int]]
    ids: tuple[int, ...]
    names: tuple[str, ...]
    inodes: tuple[int, ...]
    rows: Optional[tuple[tuple, ...]]


EMPTY = Entry(None, (), (), (), ())
Runs = dict[str, tuple[tuple[int, float], ...]]  # command key -> (id, run seconds), oldest first


def recent_runs(done: Entry) -> Runs:
    """The newest RECENT_RUNS known run times of each command key among done/'s rows."""
    found: dict[str, list[tuple[int, float]]] = {}
    for job_id, row in zip(done.ids, done.rows or ()):
        if row[5] is not None:  # ROW's run, then its key
            found.setdefault(row[4], []).append((job_id, row[5]))
    return {key: tuple(runs[-RECENT_RUNS:]) for key, runs in found.items()}


class FinishedRows:
    """Every finished row in id order, as columns: what `status -a` prints (cli/render.py)."""

    def __init__(self, entries: dict[str, Entry]) -> None:
        merged = [(i, s, r) for s in FINISHED if entries[s].ids for i, r in zip(entries[s].ids, entries[s].rows or ())]
        merged.sort(key=itemgetter(0))  # stable: of two copies of a job, the later state's stays after
        self.ids = [i for i, _s, _r in merged]
        self.states = [s for _i, s, _r in merged]
        rows = [r for _i, _s, r in merged]
        self.columns = tuple(zip(*[r[:4] for r in rows])) if rows else ((), (), (), ())

    def __len__(self) -> int:
        return len(self.ids)


class Finished:
    """The index as read: `heads` (every state's ids and names; rows perhaps not read yet),
    `entries` (the same with their rows, read at first use), the kept records and `runs`."""

    def __init__(self, heads: dict[str, Entry], kept: list[tuple], runs: Runs, rows: Callable[[], dict]) -> None:
        self.heads, self.kept, self.runs, self._rows = heads, kept, runs, rows

    @cached_property
    def entries(self) -> dict[str, Entry]:
        if all(entry.rows is not None for entry in self.heads.values()):
            return self.heads
        rows = self._rows()
        return {s: e if e.rows is not None else e._replace(rows=rows[s]) for s, e in self.heads.items()}

    def count(self) -> int:
        return sum(len(entry.ids) for entry in self.heads.values())

    def ids(self, state: str) -> tuple[int, ...]:
        return self.heads[state].ids

    def states(self) -> dict[int, str]:
        """id -> state of every finished job (the later state if a crash left two copies)."""
        return {job_id: state for state in FINISHED for job_id in self.heads[state].ids}  # in STATES' order

    def sweep_states(self, sweeps: set[int], leave: set[int]) -> dict[int, list[str]]:
        """Sweep id -> the states of its finished jobs, of `sweeps`, less the ids in `leave`. A
        sweep's jobs have consecutive ids from its id: the rows are read only where a finished job
        not left has an id at or past the lowest of `sweeps`."""
        low = min(sweeps, default=None)
        if low is None or not any(i not in leave for i in self._ids_from(low)):
            return {}
        listed = [
            (job_id, state, row[PAST])
            for state, entry in self.entries.items()
            for job_id, row in zip(entry.ids, entry.rows or ())
            if job_id >= low and job_id not in leave and row[PAST]  # "": no valid job
        ]
        found: dict[int, tuple[int, str]] = {}  # id -> (sweep, state): of two copies, the later state's
        for (job_id, state, _past), facts in zip(listed, runs.read_pasts([past for *_, past in listed])):
            if facts[0] in sweeps:
                found[job_id] = (facts[0], state)
        out: dict[int, list[str]] = {}
        for sweep, state in found.values():
            out.setdefault(sweep, []).append(state)
        return out

    def _ids_from(self, low: int) -> Iterator[int]:
        """The finished ids at or past `low`, newest first per state (the ids below are not looked at)."""
        for entry in self.heads.values():
            for job_id in reversed(entry.ids):
                if job_id < low:
                    break
                yield job_id

    def refs(self, state: str) -> list[JobRef]:
        entry = self.heads[state]
        return [JobRef(i, state, n) for i, n in zip(entry.ids, entry.names)]

    def newest(self, limit: int) -> list[JobRef]:
        """The `limit` finished jobs with the highest ids, in id order."""
        found = [
            JobRef(i, s, n) for s, e in self.heads.items() if e.ids for i, n in zip(e.ids[-limit:], e.names[-limit:])
        ]
        found.sort(key=lambda ref: ref.id)
        return found[-limit:]


class FinishedIndex:
    def __init__(self, layout: Layout, files: Files, jobs: JobStore, kept: KeptRuns, ids: IdCounter) -> None:
        self.layout, self.files, self.jobs, self.kept, self.ids = layout, files, jobs, kept, ids
        self.journal = Journal(layout, FORMAT)

    def note(self, ref: JobRef) -> None:
        """Append the row of a job file just put in a finished state to the journal (its finisher
        calls this once the move has committed). Never raises; a file that is not a valid job, or
        whose row depends on the clock, is left for the build to read."""
        try:
            data, inode = read_job_file(self.layout.job_path(ref.state, ref.name), MAX_JOB_BYTES)
            row, clocked = file_row(data, ref.state, ref.id, 0.0)
        except (OSError, schema.InvalidJob):
            return
        if not clocked:
            self.journal.append(ref.state, ref.name, inode, row)

    def forget(self, ref: JobRef) -> None:
        """A job file that left its finished state (a retry): its row in the journal, if any, is
        believed no more."""
        self.journal.forget(ref.state, ref.name)

    def read(self, write: bool = True) -> Finished:
        """The index as the directories are now. `write=False`: nothing is written (a look that
        leaves no trace, `gpuq add --dry-run`)."""
        stored, kept_stamp, kept, runs, rows = self._load()
        entries, changed, now = {}, False, time.time()
        journal: list[tuple[int, Rows]] = []  # read once, by the first state listed anew
        for state in FINISHED:
            old = stored.get(state, EMPTY)
            try:
                st = os.stat(self.layout.state_dir(state), follow_symlinks=False)
            except FileNotFoundError:
                entries[state], changed = EMPTY, changed or bool(old.ids)
                continue
            stamp = (st.st_ino, st.st_mtime_ns)
            if old.stamp == stamp:
                entries[state] = old  # as read: a head stays a head
                continue
            if old.rows is None:  # a head: its rows are read now that the directory is listed
                old = old._replace(rows=rows()[state])
            settled = stamp if now - st.st_mtime > SETTLE_SECONDS else None
            journal = journal or [self.journal.read()]
            entries[state], listed_anew = self._refresh(state, old, settled, now, journal[0][1])
            changed = changed or listed_anew or settled != old.stamp
        signature = self.kept.signature()
        if signature != kept_stamp:
            kept, kept_stamp, changed = self.kept.read(), signature, True
        if not changed:
            return Finished(entries, kept, runs, rows)
        finished = Finished(entries, kept, {}, rows)
        finished.runs = recent_runs(finished.entries[DONE])
        if write:  # a file moved in by hand may hold an id the counter has not reached
            self.ids.seen(max((entry.ids[-1] for entry in entries.values() if entry.ids), default=0))
        if write and self._write(finished.entries, kept_stamp, kept, finished.runs) and journal:
            self.journal.fold(journal[0][0])
        return finished

    def _refresh(
        self, state: str, old: Entry, stamp: Optional[tuple[int, int]], now: float, journal: Rows
    ) -> tuple[Entry, bool]:
        """A state's entry for its files now, and whether they differ from `old`'s: a file's row
        taken from the journal where its last line for that name has that inode, else kept where
        `old` lists the same name and inode (a job file is never edited in place), else read. The
        journal comes first: a file that left (a retry) frees its inode, which the file that comes
        back under its name may get, and then only the journal's later lines tell them apart."""
        try:
            with os.scandir(self.layout.state_dir(state)) as listing:
                listed = sorted(
                    (int(e.name[: e.name.index("-")]), e.name, e.inode()) for e in listing if is_job_name(e.name)
                )
        except FileNotFoundError:
            listed = []
        same = [n for _i, n, _ino in listed] == list(old.names) and [i for _i, _n, i in listed] == list(old.inodes)
        if same and not any(s == state for s, _n in journal):
            return old._replace(stamp=stamp), False
        known = {name: (inode, row) for name, inode, row in zip(old.names, old.inodes, old.rows or ())}
        found = []
        for job_id, name, inode in listed:
            hit = journal.get((state, name)) or known.get(name)
            row = hit[1] if hit is not None and hit[0] == inode else self._row(state, job_id, name, now)
            if row is not None:
                found.append((job_id, name, inode, row))
        entry = Entry(stamp, *(tuple(zip(*found)) or ((), (), (), ())))
        return entry, entry[1:] != old[1:]

    def _row(self, state: str, job_id: int, name: str, now: float) -> Optional[tuple]:
        """The row of one file (None: gone since the listing)."""
        try:
            return file_row(self.jobs.read_bytes(state, name), state, job_id, now)[0]
        except FileNotFoundError:
            return None
        except schema.InvalidJob as exc:  # shown as what it is: never left out, never a traceback
            return _unreadable_row(name, str(exc))

    def _load(self) -> tuple[dict[str, Entry], Any, list[tuple], Runs, Callable[[], dict]]:
        """(state -> head, the stamp of the kept records, those records, the recent runs, the
        function that reads the rows) as last written; empty where the file is missing, damaged
        or of another format."""
        path = self.layout.cache_path(NAME)
        try:
            data, identity, at = self._head_bytes(path)
            head = marshal.loads(data[HEAD_SIZE_BYTES:at]) if data else (None, {}, None, [], {})
            form, stored, kept_stamp, kept, runs = head
            if form == FORMAT:
                heads = {state: Entry._make((*stored[state], None)) for state in FINISHED if state in stored}
                rest = lambda: _same_file(read_span(path, at, mine=True), identity)  # noqa: E731
                return heads, kept_stamp, list(kept), runs, _rows_reader(rest, heads, self._rows_from_files)
        except (EOFError, ValueError, TypeError, KeyError, IndexError):
            pass
        return {}, False, [], {}, dict  # False: no kept-runs signature, so they are read again

    @staticmethod
    def _head_bytes(path: str) -> tuple[bytes, Any, int]:
        """(the index up to the end of its head, the file's identity, where the head ends): the
        head alone is read, the rows being most of the file and a plain `status` reading none. A
        head longer than the first read is read on, from the same file (else read again whole)."""
        for _attempt in range(3):
            data, identity = read_span(path, 0, HEAD_PROBE_BYTES, mine=True) or (b"", None)
            at = HEAD_SIZE_BYTES + int.from_bytes(data[:HEAD_SIZE_BYTES], "little")
            if len(data) >= at or len(data) < HEAD_PROBE_BYTES:  # all of the head, or all there is
                return data, identity, at
            more = read_span(path, len(data), at, mine=True)
            if more is not None and more[1] == identity:
                return data + more[0], identity, at
        raise ValueError("the index is written again and again")

    def _rows_from_files(self, heads: dict[str, Entry]) -> dict[str, tuple]:
        """The rows of `heads`, read from the job files: the index's rows were damaged."""
        now = time.time()
        return {
            state: tuple(self._row(state, *ref, now) or _unreadable_row(ref[1], "gone") for ref in zip(e.ids, e.names))
            for state, e in heads.items()
        }

    def _write(self, entries: dict[str, Entry], kept_stamp: Any, kept: list[tuple], runs: Runs) -> bool:
        """Whether the index was written."""
        if free_bytes(self.layout.home) < MIN_FREE_TO_START:
            return False  # the disk's last room is for job files (spool_layout.md section 14)
        heads = {state: tuple(entry[:4]) for state, entry in entries.items()}
        head = marshal.dumps((FORMAT, heads, kept_stamp, kept, runs))
        rows = marshal.dumps({state: entry.rows for state, entry in entries.items()})
        data = len(head).to_bytes(HEAD_SIZE_BYTES, "little") + head + rows
        try:
            self.files.replace(self.layout.cache_path(NAME), data, "cache", durable=False)
            for name in OLD_NAMES:
                unlink_quietly(self.layout.cache_path(name))
        except OSError:
            return False  # a read-only or full spool reads its files every time
        return True


def _unreadable_row(name: str, why: str) -> tuple:
    return name, "", None, (None, "", None, "", "", "", None, why), "", None, ""


def _same_file(span: Optional[tuple[bytes, tuple]], identity: Any) -> bytes:
    """The bytes of a later read of the index, if it read the file the head came from (it is
    replaced whole when written again); ValueError otherwise, which makes it damaged."""
    if span is None or span[1] != identity:
        raise ValueError("the index was written again meanwhile")
    return span[0]


def _rows_reader(
    data: Callable[[], bytes], heads: dict[str, Entry], from_files: Callable[[dict[str, Entry]], dict]
) -> Callable[[], dict]:
    """The function that reads and unmarshals the rows (`data()`: the index after its head) once;
    where they are damaged (not one row a job of `heads`) or the file was written again since its
    head was read, they are read from the job files instead."""

    @cache
    def rows() -> dict:
        try:
            loaded = marshal.loads(data())
            found = {state: tuple(loaded[state]) for state in heads}
            if any(len(found[state]) != len(entry.ids) for state, entry in heads.items()):
                raise ValueError("rows and ids differ")
            return found
        except (EOFError, ValueError, TypeError, KeyError):
            return from_files(heads)

    return rows
