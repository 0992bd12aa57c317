"""cache/finished-jobs: the one index of finished jobs, derived from done/, failed/, cancelled/ and
`kept-runs`, rebuildable at any time (ARCHITECTURE.md and spool_layout.md, "Derived data").

Each state's rows are stamped with its directory's inode and mtime: while the stamp holds, nothing
is listed. A directory changed within SETTLE_SECONDS is not stamped: timestamps are coarse, so a
change in the same tick would leave its mtime as it was.
"""

from __future__ import annotations

import marshal
import os
import time
from operator import itemgetter
from typing import Any, NamedTuple, Optional

from gpuq.core import schema
from gpuq.core.job import Job
from gpuq.core.states import FINISHED
from gpuq.core.times import parse_iso
from gpuq.spool.cache import runs
from gpuq.spool.files import MIN_FREE_TO_START, Files, free_bytes, read_small, unlink_quietly
from gpuq.spool.kept import KeptRuns
from gpuq.spool.layout import Layout, is_job_name
from gpuq.spool.store import JobRef, JobStore

NAME = "finished-jobs"
FORMAT = 4  # 3: the rows packed apart, keys and run times beside them
SETTLE_SECONDS = 2.0
# What gpuq before this index kept in cache/: removed when the index is written.
OLD_NAMES: tuple[str, ...] = ("finished-journal", "finished-view", "finished-index", "finished-table", "queue-runs")
OLD_NAMES += ("status-jobs", "kept-runs", "finished-rows")

# A row: the job's name, its script (schema.display_script), whole seconds run (None: unknown) and
# its end, a tuple of END ("" for an absent string, None for an absent number; `unreadable`: why
# the file is not a valid job). Then what the ETA and history read (runs.py): the command key,
# the run time in seconds (None: unknown or adopted) and the past, its runs as a JSON text.
ROW = ("name", "script", "seconds", "end", "key", "run", "past")
END = ("exit_code", "signal", "slurm_job", "reason", "code_changed", "note", "priority", "unreadable")


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
        runs.past_text(state, job),
    )


class Entry(NamedTuple):
    """One finished state: its directory's stamp (None: list it again), its files' ids, names and
    inodes, and their rows."""

    stamp: Optional[tuple[int, int]]
    ids: tuple[int, ...]
    names: tuple[str, ...]
    inodes: tuple[int, ...]
    rows: tuple[tuple, ...]


EMPTY = Entry(None, (), (), (), ())


class FinishedRows:
    """Every finished row in id order, as columns: what `status -a` prints (cli/render.py)."""

    def __init__(self, entries: dict[str, Entry]) -> None:
        merged = [(i, s, r) for s in FINISHED if entries[s].ids for i, r in zip(entries[s].ids, entries[s].rows)]
        merged.sort(key=itemgetter(0))  # stable: of two copies of a job, the later state's stays after
        self.ids = [i for i, _s, _r in merged]
        self.states = [s for _i, s, _r in merged]
        rows = [r for _i, _s, r in merged]
        self.columns = tuple(zip(*[r[:4] for r in rows])) if rows else ((), (), (), ())

    def __len__(self) -> int:
        return len(self.ids)


class Finished:
    def __init__(self, entries: dict[str, Entry], kept: list[tuple]) -> None:
        self.entries, self.kept = entries, kept

    def count(self) -> int:
        return sum(len(entry.ids) for entry in self.entries.values())

    def states(self) -> dict[int, str]:
        """id -> state of every finished job (the later state if a crash left two copies)."""
        out: dict[int, str] = {}
        for state in FINISHED:  # in the order of STATES: a later one wins
            out.update(dict.fromkeys(self.entries[state].ids, state))
        return out

    def refs(self, state: str) -> list[JobRef]:
        entry = self.entries[state]
        return [JobRef(i, state, n) for i, n in zip(entry.ids, entry.names)]

    def newest(self, limit: int) -> list[JobRef]:
        """The `limit` finished jobs with the highest ids, in id order."""
        found = [
            JobRef(i, s, n) for s, e in self.entries.items() if e.ids for i, n in zip(e.ids[-limit:], e.names[-limit:])
        ]
        found.sort(key=lambda ref: ref.id)
        return found[-limit:]


class FinishedIndex:
    def __init__(self, layout: Layout, files: Files, jobs: JobStore, kept: KeptRuns) -> None:
        self.layout, self.files, self.jobs, self.kept = layout, files, jobs, kept

    def read(self, write: bool = True) -> Finished:
        """The index as the directories are now. `write=False`: nothing is written (a look that
        leaves no trace, `gpuq add --dry-run`)."""
        stored, kept_stamp, kept = self._load()
        entries, changed, now = {}, False, time.time()
        for state in FINISHED:
            old = stored.get(state, EMPTY)
            try:
                st = os.stat(self.layout.state_dir(state), follow_symlinks=False)
            except FileNotFoundError:
                entries[state], changed = EMPTY, changed or bool(old.ids)
                continue
            stamp = (st.st_ino, st.st_mtime_ns)
            if old.stamp == stamp:
                entries[state] = old
                continue
            settled = stamp if now - st.st_mtime > SETTLE_SECONDS else None
            entries[state], listed_anew = self._refresh(state, old, settled, now)
            changed = changed or listed_anew or settled != old.stamp
        signature = self.kept.signature()
        if signature != kept_stamp:
            kept, kept_stamp, changed = self.kept.read(), signature, True
        if changed and write:
            self._write(entries, kept_stamp, kept)
        return Finished(entries, kept)

    def _refresh(self, state: str, old: Entry, stamp: Optional[tuple[int, int]], now: float) -> tuple[Entry, bool]:
        """A state's entry for its files now, and whether they differ from `old`'s: the rows of
        files listed under the same name and inode kept (a job file is never edited in place)."""
        try:
            with os.scandir(self.layout.state_dir(state)) as listing:
                listed = sorted(
                    (int(e.name[: e.name.index("-")]), e.name, e.inode()) for e in listing if is_job_name(e.name)
                )
        except FileNotFoundError:
            listed = []
        if [n for _i, n, _ino in listed] == list(old.names) and [ino for _i, _n, ino in listed] == list(old.inodes):
            return old._replace(stamp=stamp), False
        known = {name: (inode, row) for name, inode, row in zip(old.names, old.inodes, old.rows)}
        found = []
        for job_id, name, inode in listed:
            hit = known.get(name)
            row = hit[1] if hit is not None and hit[0] == inode else self._row(state, job_id, name, now)
            if row is not None:
                found.append((job_id, name, inode, row))
        return Entry(stamp, *(tuple(zip(*found)) or ((), (), (), ()))), True

    def _row(self, state: str, job_id: int, name: str, now: float) -> Optional[tuple]:
        """The row of one file (None: gone since the listing)."""
        try:
            return row_of(self.jobs.load(JobRef(job_id, state, name)), state, now)
        except FileNotFoundError:
            return None
        except schema.InvalidJob as exc:  # shown as what it is: never left out, never a traceback
            return name, "", None, (None, "", None, "", "", "", None, str(exc)), "", None, ""

    def _load(self) -> tuple[dict[str, Entry], Any, list[tuple]]:
        """(state -> entry, the stamp of the kept records, those records) as last written; empty
        where the file is missing, damaged or of another format."""
        data = read_small(self.layout.cache_path(NAME), cap=1 << 34, mine=True)
        try:
            loaded: Any = marshal.loads(data) if data else None
            form, stored, kept_stamp, kept = loaded if loaded else (None, {}, None, [])
            if form == FORMAT:
                entries = {state: Entry(*stored[state]) for state in FINISHED if state in stored}
                return entries, kept_stamp, list(kept)
        except (EOFError, ValueError, TypeError, KeyError, IndexError):
            pass
        return {}, False, []  # False: no kept-runs signature, so they are read again

    def _write(self, entries: dict[str, Entry], kept_stamp: Any, kept: list[tuple]) -> None:
        if free_bytes(self.layout.home) < MIN_FREE_TO_START:
            return  # the disk's last room is for job files (spool_layout.md section 14)
        data = marshal.dumps((FORMAT, {state: tuple(entry) for state, entry in entries.items()}, kept_stamp, kept))
        try:
            self.files.replace(self.layout.cache_path(NAME), data, "cache", durable=False)
            for name in OLD_NAMES:
                unlink_quietly(self.layout.cache_path(name))
        except OSError:
            pass  # a read-only or full spool reads its files every time
