"""The history records of every job, finished ones from the spool's finished index."""

from __future__ import annotations

from gpuq.core.states import STATES
from gpuq.engine.views import history
from gpuq.spool import Spool


def history_records(spool: Spool) -> list[history.JobRecord]:
    """The history record of every job: finished ones from their rows, the others from their valid
    files, then those `gpuq clear` removed (not one still with a file: a clear cut short). A job a
    crash left two copies of counts twice, as it always did."""
    done = spool.finished.read()
    out, here = [], set(done.states())
    for state in STATES:  # in the order the files were always read: summed times come out the same
        entry = done.entries.get(state)
        if entry is not None:
            out += history.row_records(entry.ids, entry.rows or ())
        else:
            loaded = spool.jobs.load_many(state)
            out += [history.record_of(state, job) for _ref, job in loaded]
            here.update(ref.id for ref, _job in loaded)
    kept = {record[0]: record for record in done.kept if record[0] not in here}  # the last kept wins
    return out + history.kept_records(list(kept.values()))
