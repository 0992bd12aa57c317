"""How far a job has got, from the first source that yields a reading: its progress file
("reported"), its log's tail ("log"), its checkpoints ("checkpoint"). A retried job keeps its id:
only the log after the last ATTEMPT_HEADER and a progress file newer than the attempt are its own.
"""

# Real annotations, no future import: see test_the_everyday_commands_compile_no_source.
import os
import re
from typing import Any, Iterable, NamedTuple, Optional

from gpuq.core.job import ATTEMPT_HEADER as ATTEMPT_HEADER_TEXT
from gpuq.core.job import Job, is_number
from gpuq.core.times import parse_iso
from gpuq.engine.tracking import checkpoints
from gpuq.spool import Spool

TAIL_BYTES = 64 * 1024
ATTEMPT_HEADER = ATTEMPT_HEADER_TEXT.encode()  # as the log's bytes are searched
CLOCK_SLACK = 0.05  # seconds: file times come from the kernel's coarse clock, a tick or two behind
MAX_TRAINER_STATE_BYTES = 8 << 20
# A longer line (a dumped tensor) is read by its end only: progress is what a bar prints last.
LONG_SEGMENT = 1024

# Each log pattern yields (kind, step, total); earlier ones win within a line. Text, compiled at first use.
TQDM_RE = r"(\d+)/(\d+)\s*\[([\d:]+)<([\d:?]+)(?:,\s*([\d.]+|\?)\s*([A-Za-z]+/s|s/[A-Za-z]+))?[^\]\r\n]*\]"
LINE_PATTERNS = [
    ("Step N/M", r"(?i)\bsteps?\b\s*[:=#]?\s*(\d+)\s*(?:/|of)\s*(\d+)"),
    ("Iteration N of M", r"(?i)\biter(?:ation)?s?\b\s*[:=#]?\s*(\d+)\s*(?:/|of)\s*(\d+)"),
    ("[N/M]", r"\[\s*(\d+)\s*/\s*(\d+)\s*\]"),
    ("Epoch N/M", r"(?i)\bepochs?\b\s*[:=#]?\s*(\d+)\s*(?:/|of)\s*(\d+)"),
]
# A percentage is progress alone on its line, in a tqdm bar (`45%|`) or beside a word that says so;
# `accuracy 93.5%` is not.
PERCENT_RE = r"(?<![\w.])(\d{1,3}(?:\.\d+)?)\s?%(?:(\|)|(?!\w))"
LONE_PERCENT_RE = r"\s*\d{1,3}(?:\.\d+)?\s?%\s*"
PERCENT_CONTEXT_RE = r"(?i)\b(progress|complete[d]?|done|finished)\b"
# Every pattern above needs one of these; lines without are skipped with a single cheap search.
CANDIDATE_RE = r"(?i)\d\s*(?:/|%|of\b)|'epoch'"
NOT_LETTERS_RE = r"[^A-Za-z]+"
LINE_BREAKS_RE = r"[\r\n]+"
HF_PAIR_RE = r"'(\w+)':\s*'?(-?[\d.]+(?:e-?\d+)?)'?"
TRL_COMPLETIONS_RE = r"^completions_(\d+)\.parquet$"
EPOCHS_FLAGS = ("--num_train_epochs", "--num-train-epochs")
# The epoch a bar's description names (`Epoch 2/10: 45%|`, Lightning's `Epoch 2: 45%|`).
BAR_EPOCH_RE = r"(?i)\bepochs?\b\s*[:=#]?\s*(\d+)(?:\s*(?:/|of)\s*(\d+))?"
EPOCH_KINDS = ("Epoch N/M", "HF log (epoch)", "Epoch N")  # counters of epochs, not steps
BAR_KIND = "tqdm"
# Hugging Face's bars beside the training, by label: they count shards or files, never steps.
SIDE_BAR_LABELS = ("writing model shards", "loading checkpoint shards", "loading weights", "fetching files")


class Reading(NamedTuple):
    """One observation of a job's progress: `at` is when it was true (not when we looked); `rate`
    is one the source itself states (steps/s)."""

    step: float
    total: Optional[float]
    source: str  # "reported", "log" or "checkpoint"
    kind: str  # what exactly produced it, for people: "tqdm", "Step N/M", "checkpoint-50", ...
    at: float
    rate: Optional[float] = None
    rate_note: str = ""
    finished: bool = False  # the source says the work loop is over (HF's final train_runtime dict)
    counter: str = ""  # which counter of a log it came from (kind + label), to match later looks

    @classmethod
    def of(cls, fields: Any) -> "Optional[Reading]":
        """The reading `list(reading)` gave, or None for anything else."""
        if not isinstance(fields, list) or len(fields) != len(cls._fields):
            return None
        step, total, source, kind, at, rate, rate_note, finished, counter = fields
        numbers = is_number(step) and is_number(at) and all(x is None or is_number(x) for x in (total, rate))
        texts = all(isinstance(x, str) for x in (source, kind, rate_note, counter))
        return cls(*fields) if numbers and texts and isinstance(finished, bool) else None

    @property
    def fraction(self) -> Optional[float]:
        if self.finished:
            return 1.0
        if not self.total or self.total <= 0:
            return None
        return max(0.0, min(1.0, self.step / self.total))

    def text(self) -> str:
        """`120/300 (40%)`, `epoch 0.48`."""
        pct = self.fraction
        if self.total:
            shown = f"{num_text(self.step)}/{num_text(self.total)}"
        else:
            shown = f"{'epoch' if 'epoch' in self.kind.lower() else 'step'} {num_text(self.step)}"
        return shown + (f" ({pct * 100:.0f}%)" if pct is not None else "")


def num_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


# ---- 1. reported by the job ---------------------------------------------------------------------
def from_report(data: Any, mtime: float) -> Optional[Reading]:
    """A progress file's reading: `step` (and `total`) or `fraction`; `time`, `recent` optional."""
    if not isinstance(data, dict):
        return None
    step: Any = data.get("step")
    total: Any = data.get("total")
    if not is_number(step) and is_number(data.get("fraction")):
        step, total = float(data["fraction"]) * 100, 100.0
    if not is_number(step) or step < 0:
        return None
    total = total if is_number(total) and total > 0 else None
    at = data["time"] if is_number(data.get("time")) else mtime
    rate, note = _rate_from_recent(data.get("recent"))
    return Reading(float(step), total, "reported", "progress file", float(at), rate, note, data.get("finished") is True)


def recent_points(data: Any) -> list[tuple[float, float]]:
    if not isinstance(data, dict) or not isinstance(data.get("recent"), list):
        return []
    pairs = [x for x in data["recent"][-64:] if isinstance(x, list) and len(x) == 2 and all(map(is_number, x))]
    return [(float(t), float(s)) for t, s in pairs]


def _rate_from_recent(recent: Any) -> tuple[Optional[float], str]:
    points = recent_points({"recent": recent})
    if len(points) < 2:
        return None, ""
    (t0, s0), (t1, s1) = points[0], points[-1]
    if t1 <= t0 or s1 <= s0:
        return None, ""
    return (s1 - s0) / (t1 - t0), f"(the job's own rate over its last {len(points)} updates)"


# ---- 2. parsed from the log ---------------------------------------------------------------------
def _tqdm_rate(value: Optional[str], unit: Optional[str]) -> Optional[float]:
    if not value or value == "?" or not unit:
        return None
    rate = float(value)
    if unit.startswith("s/"):
        return 1.0 / rate if rate > 0 else None
    return rate


def _label(prefix: str) -> str:
    """The words before a counter, digits and bar characters dropped: the same for every update."""
    return re.sub(NOT_LETTERS_RE, " ", prefix).strip().lower()[-40:]


def line_reading(line: str) -> Optional[tuple[str, float, Optional[float], Optional[float]]]:
    """(counter: kind and label, step, total, rate) of the most specific pattern in a log line."""
    m = re.search(TQDM_RE, line)
    if m:
        label = _label(re.split(PERCENT_RE, line[: m.start()], maxsplit=1)[0])
        return f"{BAR_KIND}:{label}", float(m.group(1)), float(m.group(2)), _tqdm_rate(m.group(5), m.group(6))
    for kind, pattern in LINE_PATTERNS:
        m = re.search(pattern, line)
        if m:
            return f"{kind}:{_label(line[: m.start()])}", float(m.group(1)), float(m.group(2)), None
    m = re.search(PERCENT_RE, line)
    progress_like = m and (m.group(2) or re.fullmatch(LONE_PERCENT_RE, line) or re.search(PERCENT_CONTEXT_RE, line))
    if m and progress_like and float(m.group(1)) <= 100:
        return f"N%:{_label(line[: m.start()])}", float(m.group(1)), 100.0, None
    return None


Found = tuple[str, float, Optional[float], Optional[float], bool]  # counter, step, total, rate, finished


def hf_dict_reading(line: str, epochs: Optional[float]) -> Optional[Found]:
    """HF Trainer's logged dicts: {'loss': '3.91', ..., 'epoch': '0.48'} -> (counter, epoch, epochs, None, finished)."""
    text = line.strip()
    if not (text.startswith("{") and "'epoch'" in text):
        return None
    pairs = dict(re.findall(HF_PAIR_RE, text))
    if "epoch" not in pairs:
        return None
    return "HF log (epoch):", float(pairs["epoch"]), epochs, None, "train_runtime" in pairs


def log_readings(text: str, epochs: Optional[float] = None) -> list[Found]:
    found: list[Found] = []
    lines = re.split(LINE_BREAKS_RE, text)
    if lines and not text.endswith(("\n", "\r")) and not re.search(TQDM_RE, lines[-1]):
        lines.pop()  # the last line may be cut mid-write: kept only if it holds a whole tqdm bar
    for line in lines:
        if not line.strip():
            continue
        if len(line) > LONG_SEGMENT:
            line = line[-LONG_SEGMENT:]
        if not re.search(CANDIDATE_RE, line):
            continue
        got = hf_dict_reading(line, epochs) or line_reading(line)
        if got and got[0].startswith(f"{BAR_KIND}:") and "epoch" in got[0]:
            found += bar_epoch(line)
        if got and not side_counter(got[0], got[2]):
            found.append(got if len(got) == 5 else (*got, False))
    return found


def side_counter(counter: str, total: Optional[float]) -> bool:
    """A counter that is never the job's progress: HF's side bars, or one counting to at most 1 (a
    save bar's `0/1`, `1/1` would pass for a job at its end). Epoch counters are exempt."""
    if counter.startswith(EPOCH_KINDS):
        return False
    return (total is not None and total <= 1) or counter.split(":", 1)[1].endswith(SIDE_BAR_LABELS)


def bar_epoch(line: str) -> list[Found]:
    """The epoch a bar's description names, as a counter before the bar's ("Epoch N/M" or "Epoch N")."""
    description = re.split(PERCENT_RE, line, maxsplit=1)[0]
    m = re.search(BAR_EPOCH_RE, description)
    if not m:
        return []
    kind = "Epoch N/M" if m.group(2) else "Epoch N"
    total = float(m.group(2)) if m.group(2) else None
    return [(f"{kind}:{_label(description[: m.start()])}", float(m.group(1)), total, None, False)]


def within_epochs(found: list[Found], epochs: Optional[float]) -> list[Found]:
    """A bar after an epoch counter (`Epoch 2/10`) read as the run's progress, (N + bar) / M, in
    place of the counter. N counts from 1 (N - 1 done) unless the tail shows an `Epoch 0/M`, and
    never past the last epoch: progress that errs, errs low. Without M (Lightning counts from 0)
    the result has no total."""
    out: list[Optional[Found]] = []
    epoch: Optional[tuple[int, Found]] = None  # the newest epoch counter, and where it is in `out`
    from_zero = any(c.startswith("Epoch N/M:") and s == 0 for c, s, *_rest in found)
    for item in found:
        counter, step, total, rate, _finished = item
        if counter.startswith(("Epoch N/M:", "Epoch N:")):
            epoch = (len(out), (counter, step, total or epochs, None, False))
            out.append(epoch[1])
        elif epoch and counter.startswith(f"{BAR_KIND}:") and total:
            place, (epoch_counter, number, epoch_total, _rate, _done) = epoch
            out[place] = None  # said better by the bar
            if epoch_counter.startswith("Epoch N/M:") and not from_zero:
                number = max(0.0, number - 1)  # counted from 1: the epoch under way is not done
            done = min(number, max(0.0, epoch_total - 1)) if epoch_total else number
            epoch_rate = rate / total if rate else None  # epochs per second
            out.append((f"{epoch_counter}+{counter}", done + min(step, total) / total, epoch_total, epoch_rate, False))
        else:
            out.append(item)
    return [item for item in out if item is not None]


def from_log_text(
    text: str,
    at: float,
    epochs: Optional[float] = None,
    seen_incomplete: Iterable[tuple[str, float]] = (),
    steps_only: bool = False,
) -> Optional[Reading]:
    """The job's progress according to a log tail: each counter's (kind + label + total) newest
    reading; a complete one only if that counter was seen below its total (here or in
    `seen_incomplete`, earlier looks): a stray `100%` is not progress. An open counter wins over
    completed ones (an eval or download bar completes inside training), the newest first; then one
    that earlier looks saw running; readings with a total win. `steps_only`: no epoch counters."""
    found = log_readings(text, epochs)
    earlier = set(seen_incomplete)
    if steps_only:  # epoch counters say how far, but not at which step: a bar's own step is one
        found = [f for f in found if not f[0].startswith(EPOCH_KINDS)]
    else:
        found = within_epochs(found, epochs)
    incomplete = earlier | {(c, t) for c, s, t, _r, _f in found if t and s < t}
    latest: dict[tuple[str, Optional[float]], tuple[int, Found]] = {}
    for pos, item in enumerate(found):
        latest[(item[0], item[2])] = (pos, item)
    ranked = []
    for (counter, total), (pos, item) in latest.items():
        step, finished = item[1], item[4]
        complete = finished or (total is not None and step >= total)
        if complete and not finished and (counter, total) not in incomplete:
            continue  # never seen running: a stray 100% or a side bar that was already done
        running_before = complete and (counter, total) in earlier
        ranked.append(
            (((not complete or finished) and total is not None, total is not None, running_before, pos), item)
        )
    if not ranked:
        return None
    counter, step, total, rate, finished = max(ranked, key=lambda r: r[0])[1]
    kind = counter.split(":", 1)[0]
    return Reading(step, total, "log", kind, at, rate, "(tqdm's own rate)" if rate else "", finished, counter)


def last_step(data: bytes) -> Optional[int]:
    """The step a log tail shows last (None: none), by the ETA's rules: how far an attempt got."""
    reading = from_log_text(data.decode("utf-8", "replace"), 0.0, steps_only=True)
    return int(reading.step) if reading is not None else None


def num_epochs(cmd: list[str]) -> Optional[float]:
    return checkpoints.number_arg(cmd, EPOCHS_FLAGS, float)


# ---- 3. checkpoints -----------------------------------------------------------------------------
def checkpoint_points(job: Job) -> tuple[list[tuple[float, float, str]], Optional[float]]:
    """(mtime, step, label) of the current attempt's complete checkpoints with a step, oldest first,
    and the total steps (--max_steps, else trainer_state.json's). The attempt's own: those it wrote
    or resumed from, not an earlier run's in the same output dir."""
    cmd, cwd, started = job.cmd, job.cwd, attempt_started(job)
    out = checkpoints.output_dir(cmd, cwd)
    marker = checkpoints.HF_COMPLETE_MARKER  # when a checkpoint was completed: its marker's mtime, else its own
    dated = [
        (c, checkpoints.mtime(os.path.join(c.path, marker)) or checkpoints.mtime(c.path))
        for c in checkpoints.candidates(job)
        if c.step is not None
    ]
    resumed = _resumed_from(job, dated, started)
    ours = [(c, at) for c, at in dated if c.path == resumed or wrote_since(at, started, job.adopted)]
    points = [(at, float(c.step or 0), os.path.basename(c.path.rstrip("/"))) for c, at in ours]
    if out is not None:
        points += [p for p in _trl_completions(out) if wrote_since(p[0], started, job.adopted)]
    points.sort(key=lambda p: (p[1], p[0]))
    total = checkpoints.max_steps(cmd)
    if total is None and ours:
        found = checkpoints.trainer_state(ours[-1][0].path, "max_steps", MAX_TRAINER_STATE_BYTES)
        total = found if isinstance(found, int) and not isinstance(found, bool) and found > 0 else None
    return points, float(total) if total else None


def wrote_since(mtime: float, started: float, adopted: bool = False) -> bool:
    """Whether a file completed at `mtime` was written after the attempt started (recorded before
    the spawn), give or take CLOCK_SLACK; MTIME_SLACK for whole-second times and an adopted start."""
    return mtime >= started - (checkpoints.MTIME_SLACK if adopted or float(mtime).is_integer() else CLOCK_SLACK)


def _resumed_from(job: Job, dated: list[tuple[Any, float]], started: float) -> Optional[str]:
    """The checkpoint the attempt resumed from: gpuq's, else its --resume_from_checkpoint (`true`:
    the newest one there at its start, as HF picks it); `dated`: (checkpoint, when completed)."""
    value = job.resumed_from or checkpoints.arg_value(job.cmd, checkpoints.RESUME_FLAGS)
    if not value:
        return None
    if value.lower() == "true":
        before = [c.path for c, at in dated if not wrote_since(at, started, job.adopted)]
        return before[-1] if before else None
    return os.path.abspath(os.path.join(job.cwd, os.path.expanduser(value)))


def from_checkpoints(job: Job) -> tuple[Optional[Reading], list[tuple[float, float]]]:
    """The attempt's newest checkpoint as a reading, and each as a (time, step) sample."""
    points, total = checkpoint_points(job)
    if not points:
        return None, []
    at, step, label = points[-1]
    return Reading(step, total, "checkpoint", label, at), [(t, s) for t, s, _l in points]


def _trl_completions(out_dir: str) -> list[tuple[float, float, str]]:
    """TRL's completions/completions_N.parquet as (mtime, step, label); a vanished one has mtime 0."""
    folder = os.path.join(out_dir, "completions")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [
        (checkpoints.mtime(os.path.join(folder, name)), float(m.group(1)), f"completions/{name}")
        for name in names
        if (m := re.match(TRL_COMPLETIONS_RE, name))
    ]


def attempt_started(job: Job) -> float:
    return parse_iso(job.started_at) or 0.0


def progress_report(spool: Spool, job: Job) -> Optional[tuple[dict[str, Any], float]]:
    """(contents, mtime) of the job's progress file if the current attempt wrote it."""
    report = spool.reports.read_progress(job.id)
    if report is None or report[1] < attempt_started(job) - checkpoints.MTIME_SLACK:
        return None
    return report


def log_tail(spool: Spool, job: Job, limit: int) -> tuple[bytes, float]:
    """The last `limit` bytes of the job's log that the current attempt wrote, and the log's mtime."""
    tail, mtime = spool.logs.tail(job, limit)
    cut = tail.rfind(ATTEMPT_HEADER)
    return (tail[cut:] if cut >= 0 else tail), mtime
