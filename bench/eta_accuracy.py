"""How right gpuq's ETA is on real Hugging Face Trainer runs, beside the method it replaced.

Each run trains a tiny GPT-2 built from a config (no downloads) on the CPU, with its log (tqdm's bar,
HF's dicts, transformers 5's `save_model()` bar) written to a file, as a gpuq job's log would be.
Every `--interval` seconds the script looks at the log exactly as `gpuq status` does
(progress.from_log_text on the last 64 KiB, stamped with the log's mtime) and records the reading;
the moment the process ends is the real end. Afterwards the looks are replayed through

- the new method: eta.estimate with the attempt's start time and the tail learned from earlier runs
  (eta.tail_and_pace on each earlier run's samples, eta.learned_tail over the newest 5), and
- the old method: the arithmetic gpuq used before (rate over the newest 8 samples, nothing after the
  last step), copied below,

on the same readings at the same instants. A look's error is |predicted end - real end| / time
really remaining; looks are scored from 25% progress up to the last step.

    python bench/eta_accuracy.py --load all --runs 3          # about 5-8 minutes on 2 cores
    python bench/eta_accuracy.py --from-raw raw.json          # score looks recorded earlier

Loads: `off` (nothing added), `on` (`--hogs` busy-loop processes for the whole run), `midway` (the
hogs start when the run reaches 50%). `--learn N` runs N unscored runs first so the first scored run
has a learned tail. The hogs and trainings are this script's own children, killed by pid.

Sessions (`--sessions`): gpuq's supervisor starts every job in a session of its own, and on Linux
with autogroup (`/proc/sys/kernel/sched_autogroup_enabled`) the CPU is shared between sessions
first, then between the processes of each; so where the training and the hogs run decides its pace.
`apart` (the default): the training in a session of its own, as gpuq starts a job, and each hog in
its own (two programs started from two terminals, or by two users); `together`: the training in its
own, both hogs in one (one program with two busy processes, as `make -j2`); `with-job`: the training
and the hogs in this script's session, an arrangement gpuq never makes (the earlier recordings).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuq.core.job import Job  # noqa: E402
from gpuq.core.times import iso_of  # noqa: E402
from gpuq.engine.tracking import eta, progress  # noqa: E402

LOADS = ("off", "on", "midway")
WEIGHTS = (0.0, 0.25, 0.5, 1.0)  # window weights replayed side by side (1.0: the window alone)
SCORED_FROM = 0.25
MIN_LEFT = 0.0  # --min-left: only looks with at least this many seconds really left are scored

TRAIN = """
import sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 16

    def __getitem__(self, i):
        ids = torch.randint(0, 128, (64,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


torch.manual_seed(0)
torch.set_num_threads(1)
model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=2))
args = TrainingArguments(
    output_dir=sys.argv[2], max_steps=int(sys.argv[1]), per_device_train_batch_size=8, logging_steps=50,
    save_strategy="no", report_to="none", use_cpu=True, dataloader_num_workers=0,
)
trainer = Trainer(model=model, args=args, train_dataset=Data())
trainer.train()
trainer.save_model()
"""


# ---- the old method, as gpuq had it before the blend, the first look and the tail ---------------
def old_merge(old: list[tuple[float, float]], new: tuple[float, float]) -> list[tuple[float, float]]:
    points = dict(old)
    points[new[0]] = new[1]
    ordered = sorted(points.items())
    for i in range(len(ordered) - 1, 0, -1):
        if ordered[i][1] < ordered[i - 1][1]:
            ordered = ordered[i:]
            break
    return ordered[-32:]


def old_estimate(reading: progress.Reading, points: list[tuple[float, float]], now: float) -> Optional[float]:
    if reading.finished or (reading.total and reading.step >= reading.total):
        return 0.0
    if not reading.total:
        return None
    recent, rate = points[-8:], None
    if len(recent) >= 2:
        (t0, s0), (t1, s1) = recent[0], recent[-1]
        if t1 - t0 >= 0.5 and s1 > s0:
            rate = (s1 - s0) / (t1 - t0)
    rate = rate or reading.rate
    if rate is None:
        return None
    return max(0.0, reading.at + (reading.total - reading.step) / rate - now)


# ---- running and looking ------------------------------------------------------------------------
SESSIONS = ("apart", "together", "with-job")


def start_hogs(count: int, sessions: str) -> list[subprocess.Popen]:
    spin = [sys.executable, "-c", "while True: pass"]
    if sessions == "together" and count:  # one program that forks its busy processes: one session, one group
        code = f"import os\nfor _ in range({count - 1}):\n    if os.fork() == 0: break\nwhile True: pass"
        forks = [sys.executable, "-c", code]
        return [subprocess.Popen(forks, start_new_session=True)]
    return [subprocess.Popen(spin, start_new_session=sessions == "apart") for _ in range(count)]


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        try:  # the forked hogs of `together`, in the first one's process group
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def look(log: Path, seen: set[tuple[str, float]]) -> Optional[progress.Reading]:
    """What `gpuq status` would read from the log now (and what it remembers between looks)."""
    try:
        with open(log, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - progress.TAIL_BYTES))
            text, mtime = fh.read().decode("utf-8", "replace"), os.fstat(fh.fileno()).st_mtime
    except OSError:
        return None
    reading = progress.from_log_text(text, mtime, None, seen)
    if reading and reading.total and reading.step < reading.total:
        seen.add((reading.counter, reading.total))
    return reading


def run_once(
    script: Path, work: Path, steps: int, interval: float, load: str, hogs: int, sessions: str
) -> dict[str, Any]:
    """One training run, looked at every `interval` seconds; its looks and its real end."""
    log = work / f"run-{time.monotonic_ns()}.log"
    seen: set[tuple[str, float]] = set()
    looks, hog_procs = [], start_hogs(hogs, sessions) if load == "on" else []
    started = time.time()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-u", str(script), str(steps), str(work / "out")],
            stdout=out,
            stderr=out,
            start_new_session=sessions != "with-job",  # as gpuq's supervisor starts a job
        )
    try:
        while True:
            try:
                proc.wait(timeout=interval)
                break
            except subprocess.TimeoutExpired:
                pass
            now, reading = time.time(), look(log, seen)
            if reading is None:
                continue
            looks.append(
                [
                    now,
                    reading.at,
                    reading.step,
                    reading.total,
                    reading.rate,
                    reading.finished,
                    reading.kind,
                    reading.counter,
                ]
            )
            if load == "midway" and not hog_procs and (reading.fraction or 0) >= 0.5:
                hog_procs = start_hogs(hogs, sessions)
        ended = time.time()
    finally:
        stop([proc] + hog_procs)
    if proc.returncode != 0:
        raise SystemExit(f"eta_accuracy: the training exited {proc.returncode}; its log: {log}")
    return {"load": load, "started": started, "ended": ended, "looks": looks}


# ---- replaying the looks ------------------------------------------------------------------------
def replay(run: dict[str, Any], learned: tuple, weight: float) -> dict[str, Any]:
    """Errors of the new and old method at every scored look of one run (`learned`: the tail as
    eta.learned_tail gives it), and the run's own tail and pace at its end."""
    started, ended = run["started"], run["ended"]
    attempt = eta.Attempt(started, 0.0, *learned)
    new_points: list[tuple[float, float]] = []
    old_points: list[tuple[float, float]] = []
    key, new_err, old_err, unknown = None, [], [], {"new": 0, "old": 0}
    for now, at, step, total, rate, finished, kind, counter in run["looks"]:
        reading = progress.Reading(step, total, "log", kind, at, rate, "", finished, counter)
        if (counter, total) != key:  # another series: gpuq starts its samples afresh too
            key, new_points, old_points = (counter, total), [], []
        new_points = eta.merge_points(new_points, [(at, step)], started)
        old_points = old_merge(old_points, (at, step))
        new = eta.estimate(reading, new_points, now, attempt, weight).eta_seconds
        old = old_estimate(reading, old_points, now)
        if not total or step / total < SCORED_FROM or step >= total or ended - now <= MIN_LEFT:
            continue
        for name, value, errors in (("new", new, new_err), ("old", old, old_err)):
            if value is None:
                unknown[name] += 1
            else:
                errors.append(abs(now + value - ended) / (ended - now))
    last = run["looks"][-1] if run["looks"] else None
    samples = {"total": last[3] if last else None, "points": [list(p) for p in new_points]}
    own_tail, pace = eta.tail_and_pace(Job(started_at=iso_of(started), finished_at=iso_of(ended)), samples)
    return {"new": new_err, "old": old_err, "unknown": unknown, "tail": own_tail, "pace": pace, "end": ended}


def score(raw: dict[str, Any], weight: float = eta.WINDOW_WEIGHT) -> dict[str, dict[str, list[float]]]:
    """Errors per load for both methods, each run's tail learned from the runs before it, as gpuq
    learns it (eta.learned_tail); `flat`: the new method with that tail not scaled to the pace
    (gpuq before it was: its tail in steps left unknown)."""
    ends: list[tuple[float, float, Optional[float]]] = []
    out: dict[str, dict[str, Any]] = {}
    for run in raw["runs"]:
        learned = eta.learned_tail(ends)
        result = replay(run, learned, weight)
        result["flat"] = replay(run, (*learned[:2], None), weight)["new"]
        if result["tail"] is not None:
            ends.append((result["end"], result["tail"], result["pace"]))
        if run.get("scored", True):
            empty = {"new": [], "old": [], "flat": [], "unknown_new": 0, "unknown_old": 0, "runs": 0}
            into = out.setdefault(run["load"], empty)
            into["flat"] += result["flat"]
            into["new"] += result["new"]
            into["old"] += result["old"]
            into["unknown_new"] += result["unknown"]["new"]
            into["unknown_old"] += result["unknown"]["old"]
            into["runs"] += 1
            into.setdefault("each", []).append((run, result))
    return out


def spread(run: dict[str, Any], span: float = 5.0) -> Optional[float]:
    """How steady the run's pace was: the coefficient of variation of its steps/s over successive
    `span`-second stretches of its main counter (the one of its last look). Another load on the
    machine coming and going shows here; two hogs alone hardly do."""
    if not run["looks"]:
        return None
    last = run["looks"][-1]
    points = [(at, step) for _n, at, step, total, *_rest in run["looks"] if total == last[3]]
    paces, start = [], points[0] if points else None
    for at, step in points[1:]:
        if at - start[0] >= span:
            paces.append((step - start[1]) / (at - start[0]))
            start = (at, step)
    if len(paces) < 2 or not sum(paces):
        return None
    mean = sum(paces) / len(paces)
    return (sum((p - mean) ** 2 for p in paces) / len(paces)) ** 0.5 / mean


def stats(errors: list[float]) -> str:
    if not errors:
        return "- | - | -"
    ordered = sorted(errors)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"{100 * ordered[len(ordered) // 2]:.1f}% | {100 * p90:.1f}% | {100 * ordered[-1]:.1f}%"


def report(raw: dict[str, Any]) -> str:
    scored = score(raw)
    lines = [
        "| load | runs | looks | old: median / p90 / worst | tail not scaled | new: median / p90 / worst "
        "| unknown (old, new) |",
        "|---|---|---|---|---|---|---|",
    ]
    for load, res in scored.items():
        old, flat, new = (stats(res[m]).replace(" |", " /") for m in ("old", "flat", "new"))
        lines.append(
            f"| {load} | {res['runs']} | {len(res['new'])} | {old} | {flat} | {new} "
            f"| {res['unknown_old']}, {res['unknown_new']} |"
        )
    lines += ["", "New method, window weight replayed (same looks; 1.0 = the window alone):", ""]
    lines += ["| window weight | load | median / p90 / worst |", "|---|---|---|"]
    for weight in WEIGHTS:
        for load, res in score(raw, weight).items():
            lines.append(f"| {weight} | {load} | {stats(res['new']).replace(' |', ' /')} |")
    own = [replay(r, eta.learned_tail([]), eta.WINDOW_WEIGHT) for r in raw["runs"]]
    shown = ", ".join(f"{o['tail']:.2f}s" if o["tail"] is not None else "?" for o in own)
    lines += ["", f"Each run's own tail (process end minus reaching the last step): {shown}"]
    paces = ", ".join(f"{o['pace']:.1f}" if o["pace"] else "?" for o in own)
    lines += ["", f"Each run's pace before its last step (steps/s): {paces}"]
    lines += ["", "Each scored run (spread: variation of its pace over 5 s stretches; see spread()):", ""]
    lines += ["| load | spread | tail | old: median / p90 | tail not scaled | new: median / p90 |"]
    lines += ["|---|---|---|---|---|---|"]
    for load, res in scored.items():
        for run, result in res["each"]:
            cv, tail = spread(run), result["tail"]
            old, flat, new = (" / ".join(stats(result[m]).split(" | ")[:2]) for m in ("old", "flat", "new"))
            shown = f"| {'?' if cv is None else f'{100 * cv:.0f}%'} | {'?' if tail is None else f'{tail:.2f}s'}"
            lines.append(f"| {load} {shown} | {old} | {flat} | {new} |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
        "autogroup": _autogroup(),
    }


def _autogroup() -> Optional[str]:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        return None  # not Linux, or a kernel without autogroup


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", choices=("all",) + LOADS, default="all", help="which load conditions to run")
    ap.add_argument("--learn", type=int, default=2, help="unscored runs first, to learn the tail from")
    ap.add_argument("--runs", type=int, default=3, help="scored runs per load condition")
    ap.add_argument("--steps", type=int, default=400, help="training steps per run")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between looks")
    ap.add_argument("--hogs", type=int, default=2, help="busy-loop processes in the loaded conditions")
    ap.add_argument("--sessions", choices=SESSIONS, default="apart", help="where the training and the hogs run")
    ap.add_argument("--raw", type=Path, help="write every look and end here (JSON)")
    ap.add_argument("--from-raw", type=Path, help="score looks recorded earlier instead of running")
    ap.add_argument("--min-left", type=float, default=0.0, help="score only looks with more than this many s left")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.steps < 10 or args.interval <= 0 or args.learn < 0 or args.hogs < 0 or args.min_left < 0:
        ap.error("--runs >= 1, --steps >= 10, --interval > 0, --learn >= 0, --hogs >= 0, --min-left >= 0")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    global MIN_LEFT
    MIN_LEFT = args.min_left
    if args.from_raw:
        raw = json.loads(args.from_raw.read_text())
    else:
        loads = LOADS if args.load == "all" else (args.load,)
        raw = {"machine": machine(), "options": {k: str(v) for k, v in vars(args).items()}, "runs": []}
        with tempfile.TemporaryDirectory(prefix="gpuq-eta-bench-") as tmp:
            work = Path(tmp)
            script = work / "train.py"
            script.write_text(TRAIN)
            plan = [("off", False)] * args.learn + [(load, True) for load in loads for _ in range(args.runs)]
            for n, (load, scored) in enumerate(plan, 1):
                print(f"run {n}/{len(plan)}: load {load}{'' if scored else ' (learning)'}", file=sys.stderr)
                run = run_once(script, work, args.steps, args.interval, load, args.hogs, args.sessions)
                raw["runs"].append(dict(run, scored=scored))
        raw["machine"]["loadavg_after"] = os.getloadavg()
        if args.raw:
            args.raw.write_text(json.dumps(raw))
    print(json.dumps(raw.get("machine", {})))
    print(report(raw))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
