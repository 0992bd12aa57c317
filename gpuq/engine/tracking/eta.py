"""ETA of a running job: from the *rate* of progress over its samples (elapsed x remaining / done
serves only the first look: it calls a job resumed at step 150 of 300 nearly done after a minute),
plus the tail its command's earlier runs took after their last step, scaled to its pace now. The
rate blends the newest RATE_POINTS samples with the mean since the first (bench/eta_accuracy.py).
"""

# Real annotations, no future import: see test_the_everyday_commands_compile_no_source.
from contextlib import suppress
from typing import Any, NamedTuple, Optional

from gpuq.core.job import Job
from gpuq.core.states import DONE
from gpuq.core.times import duration, median, parse_iso
from gpuq.engine.tracking import checkpoints, progress
from gpuq.spool import Spool
from gpuq.spool.cache import runs as past_runs
from gpuq.spool.kept import summarise

MAX_POINTS = 32  # samples kept per job: the series' first one and the newest 31
RATE_POINTS = 8  # the window: this many newest samples ("recent")
WINDOW_WEIGHT = 0.25  # the window's share of the blended rate; the rest is the mean since the first sample
MIN_SPAN = 0.5  # seconds between the first and last sample for a rate to mean anything
HISTORY_FILES = 200  # newest done/ jobs read to learn run times and tails
TAIL_RUNS = 5  # the tail is the median of this many newest earlier runs
TAIL_REACH = 0.2  # a run's end may be extrapolated from a sample within this fraction of its total
PACE_BAND = 1.25  # a pace within this factor of the earlier runs' is their own spread: the tail is kept
STALL_FACTOR = 5.0  # no new step for this many expected step-times past the ETA: say "stalled"


class Estimate(NamedTuple):
    """What `gpuq status`, `gpuq eta` and `status --json` show for one job."""

    reading: Optional[progress.Reading]
    eta_seconds: Optional[float]  # running: until it ends; pending: until its expected end
    method: str  # how eta_seconds was produced, or why it is unknown
    starts_in: Optional[float] = None  # pending only: until its expected start

    @property
    def fraction(self) -> Optional[float]:
        return self.reading.fraction if self.reading else None


class Attempt(NamedTuple):
    """What the ETA knows about the current attempt beyond its samples."""

    started: float  # epoch seconds
    start_step: Optional[float] = 0.0  # the step it resumed from; None: resumed from an unknown step
    tail: Optional[float] = None  # seconds earlier runs took after their last step
    tail_runs: int = 0  # how many runs `tail` is from
    tail_steps: Optional[float] = None  # the tail in steps: in those runs' own step times at their end


def observe(
    spool: Spool, job: Job, stored: dict[str, Any]
) -> tuple[Optional[progress.Reading], list[tuple[float, float]], Optional[dict[str, Any]]]:
    """The most trusted reading now, extra (time, step) points its source has, the log's memo to keep."""
    started = progress.attempt_started(job)
    report = progress.progress_report(spool, job)
    if report:
        reading = progress.from_report(report[0], report[1])
        if reading:
            return reading, progress.recent_points(report[0]), stored.get("log")
    reading, log = log_reading(spool, job, stored)
    if reading and (reading.total or reading.finished):
        return reading, [], log
    # a log without a total (HF's loss dicts) gives way to checkpoints with one (max_steps)
    found, points = progress.from_checkpoints(job)
    if reading and not (found and found.total):
        return reading, [], log
    # the checkpoint it resumed from is where the attempt began, not a sample of its pace
    return found, [p for p in points if progress.wrote_since(p[0], started, job.adopted)], log


def log_reading(
    spool: Spool, job: Job, stored: dict[str, Any]
) -> tuple[Optional[progress.Reading], Optional[dict[str, Any]]]:
    """The reading of the job's log tail and its memo: an unchanged log (and counters seen) is not read again."""
    signature = spool.logs.signature(job)
    if signature is None:
        return None, None
    seen = [x for x in stored.get("incomplete", []) if isinstance(x, list)]
    epochs = progress.num_epochs(job.cmd)
    of = [*signature, epochs, seen]
    memo = stored.get("log")
    if isinstance(memo, dict) and memo.get("of") == of:
        kept = progress.Reading.of(memo.get("reading"))
        if kept is not None or memo.get("reading") is None:
            return kept, memo
    tail, mtime = progress.log_tail(spool, job, progress.TAIL_BYTES)  # this attempt's part only
    if not tail:
        return None, None
    reading = progress.from_log_text(tail.decode("utf-8", "replace"), mtime, epochs, [tuple(x) for x in seen])
    return reading, {"of": of, "reading": None if reading is None else list(reading)}


def record(
    spool: Spool,
    job: Job,
    reading: progress.Reading,
    extra: list[tuple[float, float]],
    stored: Optional[dict[str, Any]] = None,
    log: Optional[dict[str, Any]] = None,
    keep: bool = True,
) -> tuple[list[tuple[float, float]], Attempt]:
    """Add this look to the job's samples (unless not `keep`); the series' points, and the attempt."""
    stored = spool.reports.read_samples(job.id) if stored is None else stored
    key = f"{reading.source}|{reading.counter or reading.kind}|{reading.total}"
    old = stored.get("points", []) if stored.get("key") == key else []
    run = attempt_of(spool, job, stored)
    points = past_resume(merge_points(old, extra + [(reading.at, reading.step)], run.started), reading, run)
    incomplete = [x for x in stored.get("incomplete", []) if isinstance(x, list)]
    if reading.source == "log" and reading.total and reading.step < reading.total:
        if [reading.counter, reading.total] not in incomplete:
            incomplete = (incomplete + [[reading.counter, reading.total]])[-16:]
    new = {
        "key": key,
        "points": [list(p) for p in points],
        "incomplete": incomplete,
        "total": reading.total,
        "tail": {"for": run.started, "seconds": run.tail, "runs": run.tail_runs, "steps": run.tail_steps},
    }
    if log is not None:
        new["log"] = log
    if keep:
        _keep(spool, job, stored, new)
    return points, run


def _keep(spool: Spool, job: Job, stored: dict[str, Any], new: dict[str, Any]) -> None:
    if new != stored:
        with suppress(OSError):  # a read-only or full spool: the ETA just has fewer samples
            spool.reports.write_samples(job.id, new)


def merge_points(old: list[Any], new: list[tuple[float, float]], started: float) -> list[tuple[float, float]]:
    """Samples of one series by time, one per time: the first (the mean rate's) and the newest
    MAX_POINTS - 1. A step lower than an earlier one (a restarted counter) drops all before it."""
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
    return ordered if len(ordered) <= MAX_POINTS else ordered[:1] + ordered[-(MAX_POINTS - 1) :]


def past_resume(
    points: list[tuple[float, float]], reading: progress.Reading, run: Attempt
) -> list[tuple[float, float]]:
    """The samples that show a resumed attempt's pace: a log's bar jumps from 0 to the resumed step
    (HF's fast-forward), no work. All of them while below that step: it counts something else."""
    start = run.start_step
    counts_steps = reading.source == "log" and reading.kind not in (*progress.EPOCH_KINDS, "N%")
    if not start or not counts_steps or reading.step < start:
        return points
    return [p for p in points if p[1] >= start]


def _seconds_per_step(a: tuple[float, float], b: tuple[float, float]) -> Optional[float]:
    if b[0] - a[0] < MIN_SPAN or b[1] <= a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1])


def rate_of(points: list[tuple[float, float]], window_weight: float = WINDOW_WEIGHT) -> tuple[Optional[float], str]:
    """Steps per second: the newest RATE_POINTS samples blended with the mean since the first sample."""
    recent = points[-RATE_POINTS:]
    if len(recent) < 2:
        return None, ""
    window = _seconds_per_step(recent[0], recent[-1])
    if window is None:
        return None, ""
    note = f"over {len(recent)} samples in {duration(recent[-1][0] - recent[0][0]) or '0s'}"
    mean = _seconds_per_step(points[0], points[-1]) if len(points) > RATE_POINTS else None
    if mean is None:
        return 1.0 / window, note
    blended = window_weight * window + (1.0 - window_weight) * mean
    since = duration(points[-1][0] - points[0][0]) or "0s"
    return 1.0 / blended, f"{note}, blended {window_weight:.0%} with the mean over {len(points)} samples in {since}"


def _first_look(reading: progress.Reading, run: Optional[Attempt], now: float) -> tuple[Optional[float], str]:
    """elapsed x remaining / done, as a rate since the attempt started (or why not). Elapsed runs
    to now: an old checkpoint says the job did at least that much in all the time it has run."""
    if run is None:
        return None, "unknown until a second sample shows a rate; look again later"
    if run.start_step is None:
        return None, "unknown: resumed from a checkpoint whose step is unknown, until a second sample shows a rate"
    if run.start_step and reading.kind in (*progress.EPOCH_KINDS, "N%"):
        return None, "unknown: a resumed job counting in epochs or percent, until a second sample shows a rate"
    elapsed, done = max(now, reading.at) - run.started, reading.step - run.start_step
    if elapsed < MIN_SPAN or done <= 0:
        return None, "unknown until a second sample shows a rate; look again later"
    since = f" since step {progress.num_text(run.start_step)}" if run.start_step else ""
    return done / elapsed, f"elapsed x remaining / done{since} (one sample so far)"


def _overdue(reading: progress.Reading, run: Attempt, now: float) -> Optional[float]:
    """How long ago the job should have ended at the pace of its one reading (None: not overdue)."""
    done, spent = reading.step - (run.start_step or 0.0), reading.at - run.started
    if spent < MIN_SPAN:
        return None
    pace = done / spent
    late = now - (reading.at + ((reading.total or 0.0) - reading.step) / pace)
    return late if late > max(60.0, STALL_FACTOR / pace) else None


def tail_seconds(run: Optional[Attempt], rate: Optional[float]) -> float:
    """The learned tail at the job's pace now (`rate`, steps/s): its steps over `rate` when that is
    off its seconds by more than PACE_BAND (the runs' own spread)."""
    if run is None or run.tail is None:
        return 0.0
    paced = run.tail_steps / rate if rate and run.tail_steps else run.tail
    return paced if not 1 / PACE_BAND <= paced / max(run.tail, 1e-9) <= PACE_BAND else run.tail


def _tail_note(run: Optional[Attempt], seconds: float) -> str:
    if run is None or run.tail is None:
        return ""
    runs = f"{run.tail_runs} earlier run{'s' if run.tail_runs != 1 else ''}"
    scaled = f", {run.tail:.1f}s at their pace" if seconds != run.tail else ""
    return f" + {seconds:.1f}s after the last step (median of {runs}{scaled})"


def estimate(
    reading: Optional[progress.Reading],
    points: list[tuple[float, float]],
    now: float,
    run: Optional[Attempt] = None,
    window_weight: float = WINDOW_WEIGHT,
) -> Estimate:
    """A running job's ETA: its rate from the samples, else the source's own, else the first look's."""
    if reading is None:
        return Estimate(None, None, "unknown: no progress file, no progress in the log tail, no checkpoint")
    where = f"{reading.source} ({reading.kind})"
    if reading.finished or (reading.total and reading.step >= reading.total):
        reached = min((t for t, s in points if reading.total and s >= reading.total), default=reading.at)
        tail = tail_seconds(run, rate_of([p for p in points if p[0] < reached])[0])
        note = f"{where}: at the end of its work; finishing{_tail_note(run, tail)}"
        return Estimate(reading, max(0.0, reached + tail - now), note)
    if not reading.total:
        return Estimate(reading, None, f"{where}: unknown: no total to measure against")
    rate, note = rate_of(points, window_weight)
    # tqdm's own rate counts a resumed attempt's jump to its start step as work (the samples do not)
    resumed = run is not None and run.start_step != 0.0
    if rate is None and reading.rate and not (resumed and reading.source == "log"):
        rate, note = reading.rate, reading.rate_note
    if rate is None:
        rate, note = _first_look(reading, run, now)
        if rate is None:
            return Estimate(reading, None, f"{where}: {note}")
        assert run is not None
        stalled = _overdue(reading, run, now) is not None
        eta = (reading.total - reading.step) / rate  # the rate is counted to now: so is what remains
        note = f"{rate:.3g} steps/s: {note}"
    else:
        eta = reading.at + (reading.total - reading.step) / rate - now
        stalled = eta < 0 and -eta > max(60.0, STALL_FACTOR / rate)
        note = f"{rate:.3g} steps/s {note}".rstrip()
    if stalled:
        return Estimate(reading, None, f"{where}: no progress for {duration(now - reading.at)}; stalled?")
    tail = tail_seconds(run, rate)
    return Estimate(reading, max(0.0, eta + tail), f"{where}: {note}{_tail_note(run, tail)}")


def running_estimate(spool: Spool, job: Job, now: float, keep: bool = True) -> Estimate:
    """The running job's ETA now, recorded in its samples unless not `keep` (`add --dry-run`)."""
    try:
        stored = spool.reports.read_samples(job.id)
        reading, extra, log = observe(spool, job, stored)
        points: list[tuple[float, float]] = []
        run: Optional[Attempt] = None
        if reading is None:
            if log is not None and keep:  # no reading in the log: not read again until it changes
                _keep(spool, job, stored, {**stored, "log": log})
        else:
            points, run = record(spool, job, reading, extra, stored, log, keep)
    except (OSError, ValueError) as exc:  # an unreadable output dir must not break `gpuq status`
        return Estimate(None, None, f"unknown: could not read progress ({exc})")
    return estimate(reading, points, now, run)


def sample_running(spool: Spool, running: list[Job], now: float) -> None:
    """A sample of every running job (the worker's step), so a first `gpuq status` has a rate."""
    for job in running:
        running_estimate(spool, job, now)


def command_key(job: Job) -> str:
    return past_runs.command_key(job.cmd, job.cwd)


def attempt_of(spool: Spool, job: Job, stored: dict[str, Any]) -> Attempt:
    """The current attempt; its tail is learned once (at its first look) and kept in its samples."""
    started = progress.attempt_started(job)
    cached = stored.get("tail")
    if isinstance(cached, dict) and cached.get("for") == started:
        tail, runs, steps = (cached.get(k) for k in ("seconds", "runs", "steps"))
        tail, steps = (float(x) if isinstance(x, (int, float)) else None for x in (tail, steps))
        return Attempt(started, checkpoints.start_step(job), tail, runs if isinstance(runs, int) else 0, steps)
    return Attempt(started, checkpoints.start_step(job), *learned_tail(past_ends(spool, job, started)))


def learned_tail(found: list[tuple[float, float, Optional[float]]]) -> tuple[Optional[float], int, Optional[float]]:
    """(tail, runs, tail_steps) from (end, tail, pace) of earlier runs: medians over the newest TAIL_RUNS."""
    newest = sorted(found)[-TAIL_RUNS:]
    steps = [t * p for _e, t, p in newest if p]
    if not newest:
        return None, 0, None
    return median([t for _e, t, _p in newest]), len(newest), median(steps) if steps else None


def past_ends(spool: Spool, job: Job, before: float) -> list[tuple[float, float, Optional[float]]]:
    """(end, tail, pace at the end) of the successful, non-adopted runs of the same command key that
    ended before `before`: the newest HISTORY_FILES done jobs, and those `gpuq clear` kept (no pace)."""
    key, found, seen = command_key(job), [], set()
    for ref in list(spool.jobs.refs((DONE,)))[-HISTORY_FILES:]:
        seen.add(ref.id)
        if ref.id == job.id:
            continue
        try:
            past = spool.jobs.load(ref)
        except (OSError, ValueError):
            continue
        end = parse_iso(past.finished_at)
        if past.adopted or end is None or end > before or command_key(past) != key:
            continue
        tail, pace = tail_and_pace(past, spool.reports.read_samples(ref.id))
        if tail is not None:
            found.append((end, tail, pace))
    kept = summarise(spool.finished.read().kept)[1].get(key, ())  # a job kept by a clear that is still here counts once
    return found + [
        (end, tail, None) for end, tail, kept_id in kept if end <= before and kept_id not in seen | {job.id}
    ]


def tail_and_pace(job: Job, samples: dict[str, Any]) -> tuple[Optional[float], Optional[float]]:
    """Seconds from a finished run's last step to its end (the first sample at the total, or an
    earlier extrapolation from a sample within TAIL_REACH of it), and its rate before."""
    end, total = parse_iso(job.finished_at), samples.get("total")
    if end is None or not isinstance(total, (int, float)) or total <= 0:
        return None, None
    points = merge_points(samples.get("points") or [], [], progress.attempt_started(job))
    reached = [t for t, s in points if s >= total]
    before = [p for p in points if p[1] < total]
    rate, _note = rate_of(before)
    if before and rate and before[-1][1] >= (1 - TAIL_REACH) * total:
        t, s = before[-1]
        reached.append(t + (total - s) / rate)
    if not reached or min(reached) > end:
        return None, None
    return end - min(reached), rate
