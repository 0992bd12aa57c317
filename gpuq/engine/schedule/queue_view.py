"""The worker's view of the queue, kept from one step to the next: file events name the files that
changed, and only those are read again, so that a step costs what changed, not what waits. A full
look is taken whenever the events may not have told everything: at the first step, while no observer
works (`watching(False)`: also a test stepping the worker), every FULL_LOOK_SECONDS (an overflowed
inotify queue says nothing), and after a `doubt()`. Events, not a cheaper validation: a job that
leaves pending/ and comes back between two steps may get the same inode number, but events name
both moves. The observer thread calls `note()`; the worker's thread everything else.
"""

from __future__ import annotations

from collections import deque
from typing import Optional

from gpuq.core import schema
from gpuq.core.job import Job
from gpuq.core.states import ACTIVE, PENDING, RUNNING, STATES, UNFINISHED
from gpuq.engine.schedule.queue_read import Loaded, PendingCache, later
from gpuq.engine.schedule.scheduler import QueueState, queue_key
from gpuq.spool import JobRef, Spool
from gpuq.spool.layout import INTAKE_RE, is_job_name

FULL_LOOK_SECONDS = 5.0  # a full look at least this often, whatever the events said
ELSEWHERE = tuple(s for s in STATES if s not in ACTIVE)  # where a job goes when it leaves both


class QueueView:
    """pending/ and running/ as parsed jobs, and the state of every job (`states`, handed to the
    QueueState as it is: its readers do not change it)."""

    def __init__(self) -> None:
        self.cache = PendingCache()  # the parse cache of full looks (and of `read_queue()` calls)
        self.jobs: dict[str, dict[str, Loaded]] = {PENDING: {}, RUNNING: {}}  # name -> job or InvalidJob
        self.places: dict[int, set[tuple[str, str]]] = {}  # id -> (state, name) of its pending/running files
        self.elsewhere: dict[int, str] = {}  # id -> its state outside pending/ and running/
        self.states: dict[int, str] = {}
        self._doubled: dict[int, str] = {}  # id -> file name: a job seen in pending/running and elsewhere
        self.dropped = True  # pending/ may hold dropped files (or an intake a crash cut short)
        self.full_at: Optional[float] = None  # when the last full look was taken
        self._hints: deque[tuple[str, str]] = deque()  # (state, name) named by file events
        self._named: set[tuple[str, str]] = set()  # the hints taken from the deque, not yet read
        self._events = False  # an observer reports every change of pending/ and running/
        self._doubt = True

    def watching(self, events: bool) -> None:
        """Whether file events now reach `note()`; a new observer may have missed what came before."""
        if events and not self._events:
            self._doubt = True
        self._events = events

    def note(self, state: str, name: str) -> None:
        self._hints.append((state, name))  # deque.append is atomic: no lock shared with the step

    def doubt(self) -> None:
        self._doubt = True

    @property
    def unsettled(self) -> bool:
        """Whether some job was seen in pending/ or running/ and in another state at once (a move under
        way, or a crash's leftover): its other copy may go without an event, so it is looked at again."""
        return bool(self._doubled)

    def pending_name(self, job_id: int) -> Optional[str]:
        """The name of the job's file in pending/ as last seen (the first, should a crash have left two)."""
        return min((name for state, name in self.places.get(job_id, ()) if state == PENDING), default=None)

    def intake_due(self, now: float) -> bool:
        """Whether pending/ may hold dropped files: seen before, named by an event, or a full look due."""
        self._collect()
        if self.dropped or self._full_due(now):
            return True
        return any(state == PENDING and _dropped_name(name) for state, name in self._named)

    def look(self, spool: Spool, now: float) -> tuple[QueueState, list[tuple[JobRef, str]]]:
        self._collect()
        if self._full_due(now):
            self._full(spool, now)
        else:
            try:
                self._update(spool)
            except OSError:  # out of descriptors...: the hints taken so far are lost with it
                self._doubt = True
                raise
        return self._snapshot(now)

    def _collect(self) -> None:
        hints, named = self._hints, self._named
        while hints:
            named.add(hints.popleft())

    def _full_due(self, now: float) -> bool:
        return self._doubt or not self._events or self.full_at is None or abs(now - self.full_at) >= FULL_LOOK_SECONDS

    def _full(self, spool: Spool, now: float) -> None:
        self._named = set()  # what the hints name happened before the listing below, which sees it
        self._doubt, self.full_at = False, now
        cache = self.cache
        elsewhere = spool.finished.read().states()
        jobs: dict[str, dict[str, Loaded]] = {PENDING: {}, RUNNING: {}}
        places: dict[int, set[tuple[str, str]]] = {}
        present = set()
        for ref in spool.jobs.refs(UNFINISHED):  # finished ones come from their index
            if ref.state not in ACTIVE:
                elsewhere[ref.id] = later(elsewhere[ref.id], ref.state) if ref.id in elsewhere else ref.state
                continue
            key = (ref.state, ref.name)
            present.add(key)
            places.setdefault(ref.id, set()).add(key)  # listed: its state counts even if it vanished
            value = cache.load(spool, ref)
            if value is not None:
                jobs[ref.state][ref.name] = value
        cache.forget_missing(present)
        self.jobs, self.places, self.elsewhere = jobs, places, elsewhere
        self._doubled = {i: min(name for _state, name in places[i]) for i in places if i in elsewhere}
        self.states = dict(elsewhere)
        for job_id in places:
            self._restate(job_id)
        self.dropped = bool(spool.dropbox.dropped() or spool.dropbox.leftovers())

    def _update(self, spool: Spool) -> None:
        named, self._named = self._named, set()
        # id -> a file name it had; a doubled job is looked up again: its other copy may have gone
        moved: dict[int, str] = dict(self._doubled)
        for state, name in named:
            if state not in ACTIVE:
                continue
            if not is_job_name(name):
                if state == PENDING and _dropped_name(name):
                    self.dropped = True  # a dropped file, or an intake under way
                continue
            job_id = int(name[: name.index("-")])  # a job file's id ends at its first "-"
            # Read again whatever its stat says, and kept in the parse cache, so that the next full
            # look finds this very version (one parse per version, also for the memory it keeps).
            self.cache.forget(state, name)
            value = self.cache.load(spool, JobRef(job_id, state, name))
            key = (state, name)
            if value is None:
                self.jobs[state].pop(name, None)
                places = self.places.get(job_id)
                if places is not None:
                    places.discard(key)
                    if not places:
                        del self.places[job_id]
            else:
                self.jobs[state][name] = value
                self.places.setdefault(job_id, set()).add(key)
            moved[job_id] = name
        for job_id, name in moved.items():
            # A job keeps its file name in every state: where else it is now, by name.
            found = spool.jobs.states_holding(name, ELSEWHERE)
            if found:
                self.elsewhere[job_id] = max(found, key=STATES.index)
            else:
                self.elsewhere.pop(job_id, None)
            if found and job_id in self.places:
                self._doubled[job_id] = name
            else:
                self._doubled.pop(job_id, None)
            self._restate(job_id)

    def _restate(self, job_id: int) -> None:
        state = self.elsewhere.get(job_id)
        for place, _name in self.places.get(job_id, ()):
            state = place if state is None else later(state, place)
        if state is None:
            self.states.pop(job_id, None)
        else:
            self.states[job_id] = state

    def _snapshot(self, now: float) -> tuple[QueueState, list[tuple[JobRef, str]]]:
        snap = QueueState(states=self.states, now=now)
        invalid: list[tuple[JobRef, str]] = []
        found: dict[str, list[Job]] = {PENDING: [], RUNNING: []}
        for state, jobs in self.jobs.items():
            for name, value in jobs.items():
                if isinstance(value, schema.InvalidJob):
                    invalid.append((JobRef(int(name[: name.index("-")]), state, name), str(value)))
                elif value is not None and (state == RUNNING or self.states.get(value.id) == PENDING):
                    found[state].append(value)  # a pending/ copy of a job in another state: a crash's leftover
        snap.running = found[RUNNING]
        snap.pending = sorted(found[PENDING], key=queue_key)
        snap.ordered = True
        snap.running.sort(key=lambda job: job.id)  # the order of `ls running/`, as a listing gave it
        return snap, invalid


def _dropped_name(name: str) -> bool:
    """A name in pending/ that intake looks at: not a job file's, nor a dot-file but a cut-short intake's."""
    return not is_job_name(name) and (not name.startswith(".") or INTAKE_RE.match(name) is not None)
