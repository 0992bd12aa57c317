"""ETA: from the *rate* of progress seen over recent samples, and for the queue behind running jobs.

Why a rate and not "elapsed x remaining / done": a job resumed at step 150 of 300 has done 150 steps
in its first minute of elapsed time, so the naive formula says it is nearly finished. Steps per
second between recent samples is right from the second sample on.

Where samples come from (ARCHITECTURE.md, "Progress and ETA"): every look (`gpuq status`, `gpuq eta`)
records the current reading, stamped with the time the source wrote it (file mtime, or the
progress file's own `time`), in progress/NNNNNN.samples.json through the Spool. A progress file
written by gpuq.integrations also carries its own recent (time, step) pairs, and checkpoints carry
their write times, so those sources have a rate from the very first look.
"""

from __future__ import annotations

from typing import Any, Optional

from gpuq.core.states import DONE
from gpuq.core.times import duration, parse_iso
from gpuq.engine import attempt, progress, scheduler
from gpuq.spool import Spool

MAX_POINTS = 32  # samples kept per job
RATE_POINTS = 8  # the rate is taken over this many newest samples ("recent")
MIN_SPAN = 0.5  # seconds between the first and last sample for a rate to mean anything
HISTORY_FILES = 200  # newest done/ jobs read to estimate a pending job's duration
STALL_FACTOR = 5.0  # no new step for this many expected step-times past the ETA: say "stalled"


class Estimate:
    """What `gpuq status`, `gpuq eta` and `status --json` show for one job. A plain class (see
    scheduler.Snapshot)."""

    __slots__ = ("reading", "eta_seconds", "method", "starts_in")

    def __init__(
        self,
        reading: Optional[progress.Reading],
        eta_seconds: Optional[float],  # running: until it ends; pending: until its expected end
        method: str,  # how eta_seconds was produced, or why it is unknown
        starts_in: Optional[float] = None,  # pending only: until its expected start
    ) -> None:
        self.reading, self.eta_seconds, self.method, self.starts_in = reading, eta_seconds, method, starts_in

    def __repr__(self) -> str:
        return f"Estimate({self.reading!r}, {self.eta_seconds!r}, {self.method!r}, {self.starts_in!r})"

    @property
    def fraction(self) -> Optional[float]:
        return self.reading.fraction if self.reading else None


# ---- one running job ----------------------------------------------------------------------------
def observe(spool: Spool, job: dict[str, Any]) -> tuple[Optional[progress.Reading], list[tuple[float, float]]]:
    """The most trusted reading available now, plus extra (time, step) points its source carries."""
    started = attempt.started(job)
    report = attempt.progress_report(spool, job)
    if report:
        reading = progress.from_report(report[0], report[1])
        if reading:
            return reading, progress.recent_points(report[0])
    tail, mtime = spool.logs.tail(job, progress.TAIL_BYTES)
    if tail:
        seen = [tuple(x) for x in spool.reports.read_samples(job["id"]).get("incomplete", []) if isinstance(x, list)]
        epochs = progress.num_epochs(job.get("cmd") or [])
        reading = progress.from_log_text(tail.decode("utf-8", "replace"), mtime, epochs, seen)
        if reading:
            return reading, []
    reading, points = progress.from_checkpoints(job)
    return reading, [p for p in points if p[0] >= started - attempt.MTIME_SLACK]  # older: a previous run


def _series_key(reading: progress.Reading) -> str:
    return f"{reading.source}|{reading.counter or reading.kind}|{reading.total}"


def record(
    spool: Spool, job: dict[str, Any], reading: progress.Reading, extra: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Add this look to the job's samples and return the points of the reading's series."""
    stored = spool.reports.read_samples(job["id"])
    key = _series_key(reading)
    old = stored.get("points", []) if stored.get("key") == key else []
    points = merge_points(old, extra + [(reading.at, reading.step)], attempt.started(job))
    incomplete = [x for x in stored.get("incomplete", []) if isinstance(x, list)]
    if reading.source == "log" and reading.total and reading.step < reading.total:
        if [reading.counter, reading.total] not in incomplete:
            incomplete = (incomplete + [[reading.counter, reading.total]])[-16:]
    new = {"key": key, "points": [list(p) for p in points], "incomplete": incomplete}
    if new != stored:
        try:
            spool.reports.write_samples(job["id"], new)
        except OSError:
            pass  # a read-only or full spool: the ETA just has fewer samples
    return points


def merge_points(old: list[Any], new: list[tuple[float, float]], started: float) -> list[tuple[float, float]]:
    """Samples of one series, by time, one per time, newest MAX_POINTS. A step lower than an
    earlier one means the counter restarted: everything before it is dropped."""
    points: dict[float, float] = {}
    for item in list(old) + list(new):
        try:
            t, s = float(item[0]), float(item[1])
        except (TypeError, ValueError, IndexError):
            continue
        if t >= started - 1:
            points[t] = s
    ordered = sorted(points.items())
    for i in range(len(ordered) - 1, 0, -1):
        if ordered[i][1] < ordered[i - 1][1]:
            ordered = ordered[i:]
            break
    return ordered[-MAX_POINTS:]


def rate_of(points: list[tuple[float, float]]) -> tuple[Optional[float], str]:
    """Steps per second over the newest RATE_POINTS samples."""
    recent = points[-RATE_POINTS:]
    if len(recent) < 2:
        return None, ""
    (t0, s0), (t1, s1) = recent[0], recent[-1]
    if t1 - t0 < MIN_SPAN or s1 <= s0:
        return None, ""
    return (s1 - s0) / (t1 - t0), f"over {len(recent)} samples in {duration(t1 - t0) or '0s'}"


def estimate(reading: Optional[progress.Reading], points: list[tuple[float, float]], now: float) -> Estimate:
    """The ETA of a running job from its reading and the samples of that reading's series."""
    if reading is None:
        return Estimate(None, None, "unknown: no progress file, no progress in the log tail, no checkpoint")
    where = f"{reading.source} ({reading.kind})"
    if reading.finished or (reading.total and reading.step >= reading.total):
        return Estimate(reading, 0.0, f"{where}: at the end of its work; finishing")
    if not reading.total:
        return Estimate(reading, None, f"{where}: unknown: no total to measure against")
    rate, note = rate_of(points)
    if rate is None and reading.rate:
        rate, note = reading.rate, reading.rate_note
    if rate is None:
        return Estimate(reading, None, f"{where}: unknown until a second sample shows a rate; look again later")
    eta = reading.at + (reading.total - reading.step) / rate - now
    if eta < 0 and -eta > max(60.0, STALL_FACTOR / rate):
        return Estimate(reading, None, f"{where}: no progress for {duration(now - reading.at)}; stalled?")
    return Estimate(reading, max(0.0, eta), f"{where}: {rate:.3g} steps/s {note}".rstrip())


def running_estimate(spool: Spool, job: dict[str, Any], now: float) -> Estimate:
    try:
        reading, extra = observe(spool, job)
        points = record(spool, job, reading, extra) if reading else []
    except (OSError, ValueError) as exc:  # an unreadable output dir must not break `gpuq status`
        return Estimate(None, None, f"unknown: could not read progress ({exc})")
    return estimate(reading, points, now)


def sample_running(spool: Spool, running: list[dict[str, Any]], now: float) -> None:
    """Record a progress sample of every running job. Meant for the worker's periodic step, so a
    log-only job already has a rate when someone first runs `gpuq status`."""
    for job in running:
        running_estimate(spool, job, now)


# ---- the queue ----------------------------------------------------------------------------------
def command_key(job: dict[str, Any]) -> str:
    return repr((list(job.get("cmd") or []), job.get("cwd")))


def past_durations(spool: Spool, keys: set[str]) -> dict[str, list[float]]:
    """Run times of the newest HISTORY_FILES successful jobs whose command and cwd are in `keys`.
    Bounded on purpose: done/ can hold many thousands of files."""
    found: dict[str, list[float]] = {}
    for ref in list(spool.jobs.refs((DONE,)))[-HISTORY_FILES:]:
        try:
            job = spool.jobs.load(ref)
        except (OSError, ValueError):
            continue
        key = command_key(job)
        start, end = parse_iso(job.get("started_at")), parse_iso(job.get("finished_at"))
        if key in keys and start is not None and end is not None and end >= start and not job.get("adopted"):
            found.setdefault(key, []).append(end - start)
    return found


CPU_LANE = "cpu"  # with GPUs, CPU jobs run one at a time beside them (engine/planner.py)


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
    if job.get("gpus") is not None and CPU_LANE in slots:
        return [str(g) for g in job["gpus"]] or [CPU_LANE]
    if job.get("slot") is None or slots == [None]:
        return list(slots)
    return [job["slot"]]


def _needs(job: dict[str, Any], slots: list[Optional[str]]) -> tuple[list[Optional[str]], int]:
    """The slots a pending job can take and how many of them it needs."""
    if CPU_LANE not in slots:
        return list(slots), 1
    count = job.get("gpu_request", 1)
    if count == 0:
        return [CPU_LANE], 1
    return [s for s in slots if s != CPU_LANE], count


def _later(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else max(a, b)


def plan_queue(
    running: list[tuple[dict[str, Any], Optional[float]]],
    pending: list[tuple[dict[str, Any], Any]],
    slots: list[Optional[str]],
    durations: dict[str, list[float]],
    now: Optional[float] = None,
) -> dict[int, Estimate]:
    """Expected start and end (seconds from now, None = unknown) of each pending job.

    `running`: (job, seconds until it ends); `pending`: (job, scheduler wait) in queue order. Each
    job takes the slot that frees first, once its dependencies have ended; its run time is the
    median of earlier runs of the same command in the same directory. Whatever depends on an
    unknown is unknown: no guessing.
    """
    if not slots:
        return {j["id"]: Estimate(None, None, "unknown: no worker is running (`gpuq run`)") for j, _w in pending}
    free: dict[Optional[str], Optional[float]] = {s: 0.0 for s in slots}
    ends: dict[int, Optional[float]] = {}
    for job, eta in running:
        ends[job["id"]] = eta
        for slot in _slots_of(job, slots):
            if slot in free:
                free[slot] = _later(free[slot], eta)
    out: dict[int, Estimate] = {}
    for job, wait in _dependencies_first(pending):
        if wait is not None and getattr(wait, "forever", False):
            out[job["id"]] = Estimate(None, None, f"will not start by itself: {wait.reason}")
            ends[job["id"]] = None
            continue
        ready: Optional[float] = 0.0
        begin = parse_iso(job.get("begin_at")) if now is not None else None
        if begin is not None:
            ready = max(0.0, begin - now)  # --begin: not before
        for dep in _deps(job):
            ready = _later(ready, ends.get(dep, 0.0))
        usable, count = _needs(job, slots)
        known = sorted((s for s in usable if free[s] is not None), key=lambda s: free[s])
        taken = known[:count] if len(known) >= count else usable[:count]
        start = ready
        for slot in taken:
            start = _later(start, free[slot])
        past = durations.get(command_key(job), [])[-5:]
        run = median(past) if past else None
        end = None if start is None or run is None else start + run
        for slot in taken:
            free[slot] = end
        ends[job["id"]] = end
        out[job["id"]] = Estimate(None, end, _queue_note(start, run, len(past)), starts_in=start)
    return out


def median(values: list[float]) -> float:
    """The median (the statistics module costs `gpuq status` several ms to import)."""
    ordered, mid = sorted(values), len(values) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _dependencies_first(pending: list[tuple[dict[str, Any], Any]]) -> list[tuple[dict[str, Any], Any]]:
    """Queue order, except that a job comes after pending jobs it depends on (a high-priority job
    can wait for a lower-priority one)."""
    left, done, out = list(pending), set(), []
    ids = {j["id"] for j, _w in pending}
    while left:
        ready = [n for n, (job, _w) in enumerate(left) if not (_deps(job) & ids) - done]
        job, wait = left.pop(ready[0] if ready else 0)  # none ready: a cycle; never loop forever
        done.add(job["id"])
        out.append((job, wait))
    return out


def _deps(job: dict[str, Any]) -> set[int]:
    return set(job.get("after") or []) | set(job.get("after_any") or [])


def _queue_note(start: Optional[float], run: Optional[float], runs: int) -> str:
    when = "start unknown (something before it has no ETA)" if start is None else f"starts in ~{duration(start)}"
    if run is None:
        return f"{when}; run time unknown (no earlier successful run of this command here)"
    return f"{when}; runs ~{duration(run)} (median of {runs} earlier run{'s' if runs > 1 else ''})"


def annotate(
    spool: Spool, rows: list[Any], workers: list[dict[str, Any]], now: float, gpus: Optional[list[int]] = None
) -> None:
    """Set `row.estimate` for every running and pending row of a status listing (`gpus`: the
    machine's GPU indices, when it has GPUs)."""
    running = [r for r in rows if r.state == "running"]
    for row in running:
        row.estimate = running_estimate(spool, row.job, now)
    order = {j["id"]: n for n, j in enumerate(scheduler.queue_order([r.job for r in rows if r.state == "pending"]))}
    pending = sorted((r for r in rows if r.state == "pending"), key=lambda r: order[r.job["id"]])
    if not pending:
        return
    durations = past_durations(spool, {command_key(r.job) for r in pending})
    plan = plan_queue(
        [(r.job, r.estimate.eta_seconds) for r in running],
        [(r.job, r.wait) for r in pending],
        worker_slots(workers, gpus),
        durations,
        now,
    )
    for row in pending:
        row.estimate = plan.get(row.job["id"])
