"""The queue's ETA: when each pending job is expected to start and end, behind the running ones.

Running jobs' ETAs come from eta.py; a pending job's run time is the median of earlier successful
runs of the same command in the same directory (the finished rows hold their run times).
"""

from __future__ import annotations

import marshal
from itertools import compress, count

from gpuq.core.states import DONE, PENDING, RUNNING, SLURM
from gpuq.core.times import duration, parse_iso
from gpuq.engine.schedule import scheduler
from gpuq.engine.tracking import eta, kept_runs
from gpuq.engine.views import finished_index, kept_jobs
from gpuq.spool import Spool
from gpuq.spool.cache import runs as past_runs

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Iterable, Iterator, Optional


RUNS = 5  # a pending job's run time: the median of the newest RUNS successful runs of its command
NEW_FILES = 200  # finished files newer than the cached rows read while done/ is changing; more: refreshed


RUNS_CACHE = "queue-runs"  # cache/queue-runs: each command's newest run times, for one done/ listing
_RUNS_FORMAT = 2  # 2: with what `gpuq clear` kept


def past_durations(spool: Spool, keys: set[str], listing: Optional[Any] = None) -> dict[str, list[float]]:
    """Run times of the newest RUNS successful jobs of each command and cwd of `keys`, oldest
    first, from the finished rows, which hold each job's command key and run time (adopted jobs
    and unknown times left out), and from what `gpuq clear` kept of the jobs it removed. While
    done/ is settled and unchanged, from cache/queue-runs (the rows' newest run times of every
    command, a few KB), not from the rows of every finished job.
    While done/ keeps changing (jobs finishing: its listing is not settled), checking every row
    against its file on each call would cost more than the files it spares (an lstat each): the
    rows as last cached serve then, with the few files finished since read. `listing`: the
    finished listing (engine/views/finished_index.py), if the caller has it."""
    listing = finished_index.finished(spool) if listing is None else listing
    settled = listing.signatures.get(DONE)
    if settled is not None:
        every = _settled_runs(spool, listing, settled)
        return {key: every[key][::-1] for key in keys if key in every}
    found: dict[str, list[tuple[int, float]]] = {}  # key -> (id, run time), newest first
    from gpuq.spool.cache.finished import cached_rows

    view = cached_rows(spool)
    newer = _newer_refs(listing, view)
    if view is not None and len(newer) <= NEW_FILES:
        _newest_runs(keys, _loaded_runs(spool, newer, keys), found)
    else:
        view = finished_index.rows(spool, listing)
    _newest_runs(keys, _row_runs(view, keys), found)
    merged = _with_kept(found, kept_runs.summary(spool)[0], keys)
    return {key: newest[::-1] for key, newest in merged.items()}


def durations_read_only(spool: Spool, keys: set[str]) -> dict[str, list[float]]:
    """past_durations for a look that writes nothing (`gpuq add --dry-run`): the finished rows as
    last cached, unchecked, and the done/ files newer than them (the newest NEW_FILES at most);
    no cache is made or brought up to date, and no journal taken."""
    from gpuq.spool.cache.finished import cached_rows

    view = cached_rows(spool)
    newest = view.ids[-1] if view is not None and len(view) else 0
    newer = [ref for ref in spool.jobs.refs((DONE,)) if ref.id > newest][-NEW_FILES:]
    found: dict[str, list[tuple[int, float]]] = {}
    _newest_runs(keys, _loaded_runs(spool, newer, keys), found)
    if view is not None:
        _newest_runs(keys, _row_runs(view, keys), found)
    merged = _with_kept(found, kept_runs.summary(spool, write=False)[0], keys)
    return {key: runs[::-1] for key, runs in merged.items()}


def _settled_runs(spool: Spool, listing: Any, settled: tuple[int, int]) -> dict[str, list[float]]:
    """Every command's newest RUNS run times, newest first, while done/ has the signature
    `settled` and what clear kept is unchanged: from cache/queue-runs when it was made for them by
    this code, else from the rows and the kept records (and cached). Finished files are never
    edited in place, so while done/ keeps its inode and mtime so do the rows made from its files."""
    kept_at = spool.kept.signature()
    stamp = (_RUNS_FORMAT, marshal.version, tuple(settled), kept_at, kept_jobs.code_stamp(*ROW_CODE))
    data = spool.cache.read(RUNS_CACHE)
    try:
        cached = marshal.loads(data) if data else None
    except (EOFError, ValueError, TypeError):
        cached = None  # damaged: made again
    if type(cached) is tuple and len(cached) == 2 and cached[0] == stamp and _is_runs(cached[1]):
        return cached[1]
    view = finished_index.rows(spool, listing)
    found: dict[str, list[tuple[int, float]]] = {}
    for job_id, key, run in _row_runs(view, None):
        newest = found.setdefault(key, [])
        if len(newest) < RUNS:
            newest.append((job_id, run))
    kept = kept_runs.summary(spool)[0] if kept_at is not None else {}
    every = _with_kept(found, kept, set(found) | set(kept))
    if kept_jobs.room_for_caches(spool):
        try:
            spool.cache.write(RUNS_CACHE, marshal.dumps((stamp, every)))
        except OSError:
            pass  # a read-only or full spool: the rows are read every time
    return every


def _with_kept(
    found: dict[str, list[tuple[int, float]]], kept: dict[str, list[tuple[int, float]]], keys: set[str]
) -> dict[str, list[float]]:
    """key -> the newest RUNS run times of `keys`, newest first, of the rows' (`found`) and the
    kept records' (id, run time) together; a job in both (a clear cut short) counts once."""
    out = {}
    for key in keys:
        by_id = dict(kept.get(key, ()))
        by_id.update(found.get(key, ()))
        if by_id:
            out[key] = [run for _id, run in sorted(by_id.items(), reverse=True)[:RUNS]]
    return out


def _is_runs(value: Any) -> bool:
    return type(value) is dict and all(
        type(k) is str and type(v) is list and all(type(r) in (float, int) for r in v) for k, v in value.items()
    )


# The code the rows' keys and run times are made by, as spool/cache/finished.py's header names it:
# a new gpuq learns them again.
ROW_CODE = ("spool/cache/journal", "spool/cache/runs", "core/shown", "core/schema", "core/times")


def _row_runs(view: Any, keys: Optional[set[str]]) -> Iterator[tuple[int, str, float]]:
    """(id, key, run time) of the successful rows of commands of `keys` (None: of every command),
    newest first; the rows of these commands picked in C (10,000 rows, often most of them of
    these commands)."""
    ids, states, runs, row_keys = view.ids, view.states, view.runs, view.keys
    picked = range(len(row_keys)) if keys is None else compress(count(), map(keys.__contains__, row_keys))
    for at in reversed(list(picked)):
        if states[at] == DONE and runs[at] is not None:
            yield ids[at], row_keys[at], runs[at]


def _newer_refs(listing: Any, view: Any) -> list[Any]:
    """The done/ files with ids above every cached row's (None: no cached rows)."""
    if view is None:
        return []
    newest = view.ids[-1] if len(view) else 0
    return [ref for ref in listing.refs(DONE) if ref.id > newest]


def _loaded_runs(spool: Spool, refs: list[Any], keys: set[str]) -> Iterator[tuple[int, str, float]]:
    for ref in reversed(refs):
        try:
            job = spool.jobs.load(ref)
        except (OSError, ValueError):
            continue
        key, run = eta.command_key(job), past_runs.run_seconds(job)
        if key in keys and run is not None:
            yield ref.id, key, run


def _newest_runs(
    keys: set[str], newest_first: Iterable[tuple[int, str, float]], found: dict[str, list[tuple[int, float]]]
) -> None:
    """`found` (key -> (id, run time), newest first) filled up to RUNS each from `newest_first`;
    once every key of `keys` has its RUNS, the rest is not looked at."""
    wanted = sum(len(found.get(key, ())) < RUNS for key in keys)
    for job_id, key, run in newest_first if wanted else ():
        newest = found.setdefault(key, [])
        if len(newest) < RUNS:
            newest.append((job_id, run))
            wanted -= len(newest) == RUNS
            if not wanted:
                break


CPU_LANE = "cpu"  # with GPUs, CPU jobs run one at a time beside them (engine/schedule/planner.py)
# placement.DEFAULT_FOREIGN_THRESHOLD_MIB, for views that do not say the worker's own (placement is
# not imported: it imports dataclasses and typing, which `gpuq status` must not)
DEFAULT_FOREIGN_THRESHOLD_MIB = 1024


def worker_slots(workers: list[dict[str, Any]], gpus: Optional[list[int]] = None) -> list[Optional[str]]:
    """The slots live workers serve. With GPUs (`gpus`: the machine's indices): the GPUs they
    use and the CPU lane. Without: [None] for a whole-machine worker, else their --gpus labels."""
    if not workers:
        return []
    whole = any(not w.get("gpus") for w in workers)
    if gpus:
        labels = {g for w in workers for g in w.get("gpus") or []}
        return [str(i) for i in gpus if whole or str(i) in labels] + [CPU_LANE]
    if whole:
        return [None]
    return sorted({g for w in workers for g in w["gpus"]})


def _slots_of(job: dict[str, Any], slots: list[Optional[str]]) -> list[Optional[str]]:
    """The slots a running job occupies."""
    if job.gpus is not None and CPU_LANE in slots:
        return [str(g) for g in job.gpus] or [CPU_LANE]
    if job.slot is None or slots == [None]:
        return list(slots)
    return [job.slot]


def _needs(job: dict[str, Any], slots: list[Optional[str]]) -> tuple[list[Optional[str]], int]:
    """The slots a pending job can take and how many of them it needs."""
    if CPU_LANE not in slots:
        return list(slots), 1
    count = job.gpu_request
    if count == 0:
        return [CPU_LANE], 1
    return [s for s in slots if s != CPU_LANE], count


def _later(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else max(a, b)


def _held_off(
    job: dict[str, Any], usable: list[Optional[str]], outside: dict[str, tuple[int, int]], threshold: int
) -> dict[str, int]:
    """The GPUs among `usable` that memory of processes not gpuq's keeps `job` off (slot -> MiB
    they hold), as engine/schedule/placement.py's gate decides: a whole GPU while they hold more than the
    threshold, a share while it does not fit beside them. When they free it cannot be known."""
    need = job.gpu_mem_mib
    out = {}
    for slot in usable:
        held, total = outside.get(str(slot), (0, 0))
        if held and (held > threshold if need is None else total - held < need):
            out[slot] = held
    return out


def outside_memory(gpus: list[dict[str, Any]], home: Optional[str] = None) -> dict[str, tuple[int, int]]:
    """Slot -> (MiB held by processes not gpuq's, total MiB) from a GPU view (engine/schedule/gpuview.py;
    a view of an older worker has no `foreign_mib`: its listed processes then). The leases of other
    parties than this spool (`home`) hold memory too: a whole one all of it, a memory one its size
    beyond what its processes use (which `foreign_mib` counts)."""
    out = {}
    for gpu in gpus:
        held = gpu.get("foreign_mib")
        if not isinstance(held, int):
            held = sum(p.get("used_memory_mib") or 0 for p in gpu.get("foreign") or [])
        total = gpu.get("memory_total_mib") or 0
        for lease in gpu.get("leases") or []:
            if lease.get("spool") == home:
                continue  # this spool's own jobs: the running ones of the plan
            using = sum(p.get("used_memory_mib") or 0 for p in gpu["foreign"] if p.get("lease") == lease.get("file"))
            held = total if lease.get("whole") else held + max(0, (lease.get("mem_mib") or 0) - using)
        out[str(gpu["index"])] = (min(held, total), total)
    return out


def plan_queue(
    running: list[tuple[dict[str, Any], Optional[float]]],
    pending: list[tuple[dict[str, Any], Any]],
    slots: list[Optional[str]],
    durations: dict[str, list[float]],
    now: Optional[float] = None,
    outside: Optional[dict[str, tuple[int, int]]] = None,
    threshold: int = DEFAULT_FOREIGN_THRESHOLD_MIB,
) -> dict[int, eta.Estimate]:
    """Expected start and end (seconds from now, None = unknown) of each pending job.

    `running`: (job, seconds until it ends); `pending`: (job, scheduler wait) in queue order. Each
    job takes the slot that frees first, once its dependencies have ended; its run time is the
    median of earlier runs of the same command in the same directory. Whatever depends on an
    unknown is unknown: no guessing. `outside`: per GPU slot, (MiB held by processes that are not
    gpuq's, total MiB); a GPU such memory keeps a job off (`threshold`: the worker's
    --foreign-mem-threshold) frees at an unknown time, so the job starts when another GPU frees,
    or at a time unknown.
    """
    if not slots:
        return {j.id: eta.Estimate(None, None, "unknown: no worker is running (`gpuq run`)") for j, _w in pending}
    free: dict[Optional[str], Optional[float]] = {s: 0.0 for s in slots}
    ends: dict[int, Optional[float]] = {}
    for job, until in running:
        ends[job.id] = until
        for slot in _slots_of(job, slots):
            if slot in free:
                free[slot] = _later(free[slot], until)
    out: dict[int, eta.Estimate] = {}
    for job, wait in _dependencies_first(pending):
        if wait is not None and getattr(wait, "forever", False):
            out[job.id] = eta.Estimate(None, None, f"will not start by itself: {wait.reason}")
            ends[job.id] = None
            continue
        ready: Optional[float] = 0.0
        begin = parse_iso(job.begin_at) if now is not None else None
        if begin is not None:
            ready = max(0.0, begin - now)  # --begin: not before
        for dep in _deps(job):
            ready = _later(ready, ends.get(dep, 0.0))
        ready = _later(ready, _host_room_at(job, wait, running))
        usable, count = _needs(job, slots)
        held_off = _held_off(job, usable, outside or {}, threshold)
        known = sorted((s for s in usable if free[s] is not None and s not in held_off), key=lambda s: free[s])
        taken = known[:count] if len(known) >= count else usable[:count]
        start = ready
        for slot in taken:
            start = None if slot in held_off else _later(start, free[slot])
        gpus_known = all(s not in held_off and free[s] is not None for s in taken)
        past = durations.get(eta.command_key(job), [])[-RUNS:]
        run = eta.median(past) if past else None
        end = None if start is None or run is None else start + run
        for slot in taken:
            free[slot] = end
        ends[job.id] = end
        note = _queue_note(start, run, len(past), _held_text(held_off), taken if gpus_known else None)
        out[job.id] = eta.Estimate(None, end, note, starts_in=start)
    return out


def _host_room_at(
    job: dict[str, Any], wait: Any, running: list[tuple[dict[str, Any], Optional[float]]]
) -> Optional[float]:
    """A job its worker holds back for host memory or CPUs (engine/schedule/hostroom.py) starts, at
    the earliest, when a running job that holds some of it ends (None: none ends at a known time)."""
    reason = getattr(wait, "reason", "")
    asked = [
        field for field, word in (("mem_mib", "host memory"), ("cpus", "CPUs")) if word in reason and job.get(field)
    ]
    if not asked:
        return 0.0
    ends = [until for held, until in running if until is not None and any(held.get(f) for f in asked)]
    return min(ends) if ends else None


def _held_text(held_off: dict[str, int]) -> str:
    return "; ".join(
        f"GPU {slot}: {mib / 1024:.1f} GiB held by processes that are not gpuq's" for slot, mib in held_off.items()
    )


def _dependencies_first(pending: list[tuple[dict[str, Any], Any]]) -> list[tuple[dict[str, Any], Any]]:
    """Queue order, except that a job comes after pending jobs it depends on (a high-priority job
    can wait for a lower-priority one)."""
    left, done, out = list(pending), set(), []
    ids = {j.id for j, _w in pending}
    while left:
        ready = [n for n, (job, _w) in enumerate(left) if not (_deps(job) & ids) - done]
        job, wait = left.pop(ready[0] if ready else 0)  # none ready: a cycle; never loop forever
        done.add(job.id)
        out.append((job, wait))
    return out


def _deps(job: dict[str, Any]) -> set[int]:
    return set(job.after) | set(job.after_any)


def _queue_note(
    start: Optional[float], run: Optional[float], runs: int, held: str = "", taken: Optional[list[Any]] = None
) -> str:
    """How the start and run time were found. `held`: the GPUs others' memory keeps the job off
    (when they free them cannot be known); `taken`: the GPUs it is expected on instead (None:
    none frees at a known time)."""
    if held and taken is None:
        when = f"start unknown: {held} (no telling when they free it), and no other GPU frees at a known time"
    elif start is None:
        when = "start unknown (something before it has no ETA)"
    elif held:
        on = ",".join(map(str, taken or ()))
        when = f"starts in ~{duration(start)} on GPU {on} ({held}, no telling when they free it)"
    else:
        when = f"starts in ~{duration(start)}"
    if run is None:
        return f"{when}; run time unknown (no earlier successful run of this command here)"
    return f"{when}; runs ~{duration(run)} (median of {runs} earlier run{'s' if runs > 1 else ''})"


def annotate(
    spool: Spool,
    rows: list[Any],
    workers: list[dict[str, Any]],
    now: float,
    gpus: Optional[dict[str, Any]] = None,
    finished: Optional[Any] = None,
) -> None:
    """Set `row.estimate` for every running and pending row of a status listing, and for jobs
    Slurm runs (`gpus`: the GPU view of engine/schedule/gpuview.py, when the machine has GPUs;
    `finished`: the finished listing the status was made from)."""
    running = [r for r in rows if r.state == RUNNING]
    for row in running:
        row.estimate = eta.running_estimate(spool, row.job, now)
    for row in rows:  # a job Slurm runs writes the same log: its progress is read the same way
        if row.state == SLURM and (row.job.slurm or {}).get("state") == "RUNNING":
            row.estimate = eta.running_estimate(spool, row.job, now)
    order = {j.id: n for n, j in enumerate(scheduler.queue_order([r.job for r in rows if r.state == PENDING]))}
    pending = sorted((r for r in rows if r.state == PENDING), key=lambda r: order[r.job.id])
    if not pending:
        return
    durations = past_durations(spool, {eta.command_key(r.job) for r in pending}, finished)
    shown = gpus["gpus"] if gpus else []
    threshold = gpus.get("foreign_threshold_mib") if gpus else None
    plan = plan_queue(
        [(r.job, r.estimate.eta_seconds) for r in running],
        [(r.job, r.wait) for r in pending],
        worker_slots(workers, [g["index"] for g in shown]),
        durations,
        now,
        outside_memory(shown, spool.home),
        threshold if isinstance(threshold, int) else DEFAULT_FOREIGN_THRESHOLD_MIB,
    )
    for row in pending:
        row.estimate = plan.get(row.job["id"])
