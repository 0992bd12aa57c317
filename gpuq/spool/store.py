"""Job files: listing them, reading them safely, publishing them, and moving them between states
(a state change writes rev + 1 into the target directory, then unlinks the old file: after a crash
the higher rev wins, engine/lifecycle/repairs.py). The caller holds the job's claim (claims.py).
"""

# Real annotations, no future import: see test_the_everyday_commands_compile_no_source.
import json
import os
from contextlib import suppress
from typing import Any, Iterator, NamedTuple, Optional

from gpuq.core import schema
from gpuq.core.job import Job
from gpuq.core.states import PENDING, RUNNING, STATES
from gpuq.spool.files import Files, read_job_file, unlink_quietly
from gpuq.spool.layout import JOB_NAME_RE, Layout, is_job_name
from gpuq.system import fsutil

MAX_JOB_BYTES = 1 << 20
RACY_SECONDS = 0.1  # see JobStore.racy


class JobRef(NamedTuple):
    id: int
    state: str  # its directory
    name: str


class JobStore:
    def __init__(self, layout: Layout, files: Files):
        self.layout, self.files = layout, files

    def names(self, state: str) -> list[str]:
        """Job file names in a state directory, in id order (dot-files and strangers excluded)."""
        try:
            entries = os.listdir(self.layout.state_dir(state))
        except FileNotFoundError:
            return []
        return sorted(filter(JOB_NAME_RE.match, entries), key=lambda name: (int(name[: name.index("-")]), name))

    def refs(self, states: tuple[str, ...] = STATES) -> Iterator[JobRef]:
        for state in states:
            for name in self.names(state):
                yield JobRef(int(name[: name.index("-")]), state, name)

    def index(self) -> dict[int, list[JobRef]]:
        """id -> every copy of that job in the tree (more than one only after a crash mid-move)."""
        found: dict[int, list[JobRef]] = {}
        for ref in self.refs():
            found.setdefault(ref.id, []).append(ref)
        return found

    def find(self, job_id: int, states: tuple[str, ...] = STATES) -> Optional[JobRef]:
        prefix = f"{job_id:06d}-"
        for state in states:
            for name in self.names(state):
                if name.startswith(prefix):
                    return JobRef(job_id, state, name)
        return None

    def states_holding(self, name: str, states: tuple[str, ...]) -> list[str]:
        """The states among `states` whose directory holds a file `name` (a job keeps its file
        name in every state): one lstat each, no listing."""
        return [state for state in states if os.path.lexists(self.layout.job_path(state, name))]

    def pending_ref(self, job_id: int, name: Optional[str] = None) -> Optional[JobRef]:
        """The job's file in pending/: `name` (what the worker saw) if it is one of this job's and
        is there, else found by listing pending/."""
        if name and name.startswith(f"{job_id:06d}-") and is_job_name(name):
            if os.path.lexists(self.layout.job_path(PENDING, name)):
                return JobRef(job_id, PENDING, name)
        return self.find(job_id, (PENDING,))

    def signature(self) -> tuple[tuple[int, int], ...]:
        """Changes whenever a job enters or leaves pending/ or running/, or a claim or request
        appears or goes: a worker that sees the same has nothing new to schedule."""
        out = []
        for sub in (PENDING, RUNNING, "locks", "control"):
            try:
                st = os.stat(self.layout.state_dir(sub), follow_symlinks=False)
            except FileNotFoundError:
                st = None
            out.append((st.st_ino, st.st_mtime_ns) if st else (0, 0))
        return tuple(out)

    @staticmethod
    def racy(signature: tuple[tuple[int, int], ...], read_at: float) -> bool:
        """Whether a signature read at `read_at` proves nothing: a directory's mtime advances in
        clock ticks (a few ms), so a change in the same tick as the reading, after it, would leave
        the same signature (git's "racily clean" index entries)."""
        return max(mtime_ns for _ino, mtime_ns in signature) >= (read_at - RACY_SECONDS) * 1e9

    def written_ns(self, ref: JobRef) -> int:
        """When the file was written (its mtime in ns; a published file is never edited), 0 if gone."""
        try:
            return os.lstat(self.layout.job_path(ref.state, ref.name)).st_mtime_ns
        except FileNotFoundError:
            return 0

    def read_bytes(self, state: str, name: str) -> bytes:
        return read_job_file(self.layout.job_path(state, name), MAX_JOB_BYTES)[0]

    def load(self, ref: JobRef) -> Job:
        """A valid job for `ref`; schema.InvalidJob or FileNotFoundError otherwise."""
        obj = schema.parse_bytes(self.read_bytes(ref.state, ref.name))
        return schema.validate(obj, expected_id=ref.id)

    def load_many(self, state: str) -> list[tuple[JobRef, Job]]:
        out = []
        for ref in self.refs((state,)):
            with suppress(FileNotFoundError, schema.InvalidJob):
                out.append((ref, self.load(ref)))
        return out

    def publish(self, job: Job, state: str = PENDING) -> JobRef:
        """Publish a new job file; once this returns it survives a power cut. FileExistsError if
        that name is taken."""
        name, data = schema.filename(job.id, job.name), encode(job)
        self.files.place_new(self.layout.job_path(state, name), data, "job")
        return JobRef(job.id, state, name)

    def move(
        self,
        ref: JobRef,
        job: Job,
        state: str,
        changes: dict[str, Any],
        keep_old: bool = False,
    ) -> tuple[JobRef, Job]:
        """Move a job to `state` (or write it anew in place when the state is the same) with
        `changes` applied and rev + 1. The caller holds the job's claim. On a full disk the spool's
        emergency room is given up for it. `keep_old`: the old file is left for the caller to remove
        (a supervisor starts the job first, spool_layout.md section 6)."""
        unknown = set(changes) - schema.KNOWN_FIELDS
        if unknown:  # a misspelt field would otherwise be written and never read
            raise KeyError(f"not job fields: {', '.join(sorted(unknown))}")
        new = Job(job, **changes)
        new.rev = job.rev + 1
        data = encode(new)
        name = schema.filename(new.id, new.name)
        in_place = state == ref.state and name == ref.name  # else a new file, then the old one goes
        target = self.layout.job_path(state, name)
        write = self.files.replace if in_place else self.files.place_new  # in place: our own file, by design
        self.files.with_room(lambda: write(target, data, "job"))
        if not in_place and not keep_old:
            self.remove(ref)  # a recovery scan may have removed the old copy already
        return (ref, new) if in_place else (JobRef(new.id, state, name), new)

    def rewrite(self, ref: JobRef, job: Job, **changes: Any) -> Job:
        """A new version of a job in its current state (never an edit of the published file)."""
        return self.move(ref, job, ref.state, changes)[1]

    def remove(self, ref: JobRef) -> None:
        if unlink_quietly(self.layout.job_path(ref.state, ref.name)):
            fsutil.fsync_dir(self.layout.state_dir(ref.state))

    def newest_copy(self, ref: JobRef, job: Job, states: tuple[str, ...]) -> tuple[JobRef, Job]:
        """The job as it is: mid-move (or after a crash there) it has a second file under the same
        name in another of `states`, and the one of higher rev is the job (spool_layout.md), not the
        first found. Read only: exact-name lookups, a few lstats."""
        for state in self.states_holding(ref.name, states):
            if state != ref.state:
                with suppress(FileNotFoundError, schema.InvalidJob):
                    other = JobRef(ref.id, state, ref.name)
                    newer = self.load(other)
                    ref, job = (other, newer) if newer.rev > job.rev else (ref, job)
        return ref, job

    def newer_copy_elsewhere(self, ref: JobRef, job: Job) -> bool:
        """Whether a crash mid-move left this job in another state (or, renamed by an edit, under
        another name in its own) with a higher rev: then `ref` is the stale copy. Older copies are
        removed. A job keeps its file name in every state: exact-name lookups and one listing."""
        others = [JobRef(ref.id, state, ref.name) for state in STATES if state != ref.state]
        prefix = f"{ref.id:06d}-"
        try:  # a plain listing: only this job's names are matched (the queue may be long)
            entries = os.listdir(self.layout.state_dir(ref.state))
        except FileNotFoundError:
            entries = []
        others += [
            JobRef(ref.id, ref.state, n) for n in entries if n.startswith(prefix) and n != ref.name and is_job_name(n)
        ]
        newer = False
        for other in others:
            try:
                other_rev = self.load(other).rev
            except (FileNotFoundError, schema.InvalidJob):
                continue
            if other_rev > job.rev:
                newer = True
            else:
                self.remove(other)
        return newer


def encode(job: Job) -> bytes:
    try:
        return (json.dumps(job, indent=2, ensure_ascii=False) + "\n").encode()
    except UnicodeEncodeError:
        # an argument or variable holding bytes that are not UTF-8 (kept by Python as \udcXX):
        # \u escapes keep them exactly, in a file that is still valid UTF-8
        return (json.dumps(job, indent=2, ensure_ascii=True) + "\n").encode()
