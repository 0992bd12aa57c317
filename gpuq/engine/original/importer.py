"""Bringing the original gpuq's queue into the spool, ids kept. The import is recorded under the
queue's fingerprint before anything is published, so a queue is never imported twice (not even from
its `.bak`) and one cut short by a crash is finished by the next; the old file is renamed to `.bak`."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gpuq.core import schema, states
from gpuq.core.errors import Refused
from gpuq.core.job import Job
from gpuq.core.times import now_iso
from gpuq.engine.lifecycle import ending
from gpuq.engine.original import reader
from gpuq.spool import Spool
from gpuq.spool.layout import LEGACY_DB_NAME, LEGACY_JSON_NAME
from gpuq.system import fsutil, procs


@dataclass
class ImportReport:
    source: Path
    counts: dict[str, int] = field(default_factory=dict)  # state -> jobs imported into it
    problems: list[str] = field(default_factory=list)  # rows or jobs that could not be taken
    notes: list[str] = field(default_factory=list)  # what was changed on the way
    retired: list[tuple[Path, Path]] = field(default_factory=list)  # renames done
    already: Optional[dict[str, Any]] = None  # the record, when this queue had been imported before
    older_than: Optional[str] = None  # set for a queue.json left as the older form of this imported gpuq.db
    finished_earlier_try: bool = False

    def lines(self) -> list[str]:
        done = ", ".join(f"{n} {state}" for state, n in sorted(self.counts.items())) or "no jobs"
        if self.older_than:
            moved = f"the original moved it into {self.older_than}, imported here"
            out = [f"{self.source}: not imported: the same queue's older form ({moved})"]
        elif self.already is not None:
            at, source = self.already.get("at", "?"), self.already.get("source", "?")
            came = f" from {source}" if source != str(self.source) else ""
            out = [f"{self.source}: already imported on {at}{came}: {done}; nothing to do"]
        else:
            head = f"imported the original gpuq's queue {self.source}: {done}"
            out = [head + (" (finishing an import a crash cut short)" if self.finished_earlier_try else "")]
        out += [f"  not imported: {p}" for p in self.problems]
        out += [f"  note: {n}" for n in self.notes]
        out += [f"  renamed {a.name} -> {b.name}" for a, b in self.retired]
        return out


def _from_record(source: Path, record: dict[str, Any]) -> ImportReport:
    """What an earlier import did, as its record keeps it, to be said again."""
    report = ImportReport(source, already=record)
    report.counts = {str(k): v for k, v in (record.get("counts") or {}).items() if isinstance(v, int)}
    report.problems = [str(p) for p in record.get("problems") or []]
    report.notes = [str(n) for n in record.get("notes") or []]
    return report


def import_queue(spool: Spool, path: Path) -> ImportReport:
    """Import the queue at `path` (see the module docstring). Refused when its ids are taken."""
    queue = reader.read_queue(path)
    report = ImportReport(queue.source_path)
    record = spool.imports.find(queue.fingerprint)
    if record is not None and record.get("complete"):
        report = _from_record(queue.source_path, record)
        report.retired = _retire(queue.source_path)  # a crash came between import and rename
        return report
    taken = _taken_ids(spool, queue, resuming=record is not None)
    if taken:
        raise Refused(
            f"cannot import {queue.source_path}: this spool already has jobs with its ids ({taken}); "
            "import into an empty spool (GPUQ_HOME=...)"
        )
    report.finished_earlier_try = record is not None
    spool.imports.write(queue.fingerprint, _record(queue))
    spool.ids.allocate(count=0, at_least=queue.next_id)  # the old ids are never given out again
    report.notes += queue.notes
    for job in queue.jobs:
        _import_job(spool, queue, job, report)
    report.problems += [f"row {p.id if p.id is not None else '?'}: {p.reason}" for p in queue.problems]
    spool.imports.write(queue.fingerprint, _record(queue, report))
    report.retired = _retire(queue.source_path)
    return report


def _taken_ids(spool: Spool, queue: reader.LegacyQueue, resuming: bool) -> str:
    """The queue's ids already in the spool (those of an earlier, interrupted try excepted)."""
    present = spool.jobs.index()
    taken: set[int] = set()
    for job in queue.jobs:
        for ref in present.get(job.id, []):
            try:
                mine = spool.jobs.load(ref).source.startswith(states.SOURCE_IMPORTED)
            except (FileNotFoundError, schema.InvalidJob):
                mine = False
            if not (resuming and mine):
                taken.add(job.id)
    return ", ".join(f"#{job_id}" for job_id in sorted(taken))


def _record(queue: reader.LegacyQueue, report: Optional[ImportReport] = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "source": str(queue.source_path),
        "kind": queue.kind,
        "at": now_iso(),
        "jobs": [job.id for job in queue.jobs],
        "complete": report is not None,
    }
    if report is not None:
        out.update(counts=report.counts, problems=report.problems, notes=report.notes)
    return out


def _import_job(spool: Spool, queue: reader.LegacyQueue, old: reader.LegacyJob, report: ImportReport) -> None:
    if spool.jobs.find(old.id) is not None:
        return  # published by an earlier try that a crash cut short
    state, job = _job(spool, queue, old)
    try:
        schema.validate(job)
        ending.landed(spool, spool.jobs.publish(job, state))
    except (schema.InvalidJob, FileExistsError) as exc:
        report.problems.append(f"#{old.id} {old.name}: {exc}")
        return
    report.counts[state] = report.counts.get(state, 0) + 1
    report.notes += [f"#{old.id}: {note}" for note in old.notes]


def _job(spool: Spool, queue: reader.LegacyQueue, old: reader.LegacyJob) -> tuple[str, Job]:
    job = schema.new_job(
        job_id=old.id,
        name=old.name,
        cmd=old.cmd,
        cwd=old.cwd,
        log=old.log_file or str(spool.layout.log_path(old.id)),
        env=old.env,
        after_any=old.after,  # the original started a dependent once the other ended, in any way
        retries=old.retries,
        source=states.SOURCE_IMPORTED + queue.kind,
    )
    # a row that started ran at least once, also where it has no `attempt` (the original's first rows)
    ran = max(old.attempts, 1) if old.started_at else old.attempts
    job.update(
        attempts=ran,
        created_at=old.created_at or job.created_at,
        started_at=old.started_at,
        finished_at=old.finished_at,
        exit_code=old.exit_code,
        signal=old.signal,
        note=f"imported from the original gpuq ({old.legacy_status})",
        rev=1,
    )
    if old.status in states.FINISHED + states.NEEDS_USER and old.started_at:
        job.history = [
            {
                "attempt": ran,
                "started_at": old.started_at,
                "finished_at": old.finished_at,
                "exit_code": old.exit_code,
                "signal": old.signal,
                "outcome": old.status,
            }
        ]
    if old.status == states.RUNNING:  # alive: adopted, as `gpuq adopt` would
        job.update(
            adopted=True,
            pid=old.pid,
            pid_create_time=old.pid_create_time,
            boot_id=procs.boot_id(),
            host=socket.gethostname(),
            note="imported from the original gpuq while running: adopted; its exit code cannot be known",
        )
    return old.status, job


def _retire(path: Path) -> list[tuple[Path, Path]]:
    """Rename the imported file (and its SQLite companions) out of the way, never clobbering; a
    copy under another name is left where it is."""
    if path.name not in (LEGACY_DB_NAME, LEGACY_JSON_NAME):
        return []
    done = []
    for source, target in reader.retire_plan(path):
        try:
            fsutil.rename_noreplace(source, target)
        except FileNotFoundError:
            continue
        done.append((source, target))
    if done:
        fsutil.fsync_dir(Path(os.path.dirname(path)))
    return done


def import_found(spool: Spool) -> list[ImportReport]:
    """The original gpuq's queue in the spool's own directory, imported the first time any gpuq
    command runs there (as the original imported its queue.json). A queue.json beside a gpuq.db
    imported here is that queue's older form (the original moved it into gpuq.db): only renamed."""
    reports: list[ImportReport] = []
    for _ in (LEGACY_DB_NAME, LEGACY_JSON_NAME):  # each found one is renamed: at most two turns
        found = reader.find_legacy(spool.home)
        if found is None:
            break
        db = str(Path(spool.home, LEGACY_DB_NAME).absolute())
        if Path(found).name == LEGACY_JSON_NAME and any(
            r.get("source") == db and r.get("complete") for r in spool.imports.all()
        ):
            reports.append(ImportReport(Path(found), older_than=LEGACY_DB_NAME, retired=_retire(Path(found))))
        else:
            reports.append(import_queue(spool, Path(found)))
    return reports


def recorded(spool: Spool) -> list[ImportReport]:
    """Every import recorded in this spool, said again: what was not imported and the notes too."""
    return [_from_record(Path(str(r.get("source", "?"))), r) for r in spool.imports.all() if r.get("complete")]
