"""Progress and ETA: from the progress file, from each log format, from checkpoints; the rate-based
ETA of a resumed job; the stray 100%; the queue ETA of pending jobs. Real jobs run under a real
worker; the parsers and the queue planner are also called directly as plain functions."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, WAIT_FOR_GO, wait_for
from hypothesis import given, settings
from hypothesis import strategies as st
from test_triage import _bytes_read as bytes_read

from gpuq.core.job import Job
from gpuq.engine.schedule.scheduler import Wait
from gpuq.engine.tracking import eta, progress, queue_eta
from gpuq.spool import Spool

PY = sys.executable


def row_of(gq, job_id: int) -> dict:
    return next(r for r in gq.status_json() if r["id"] == job_id)


def wait_state(gq, job_id: int, state: str, timeout: float = 20) -> None:
    """Like gq.wait_state, through `gpuq status --json`: conftest's file listing can catch a job
    mid-move (two copies for an instant) and fail."""
    wait_for(lambda: row_of(gq, job_id)["state"] == state, timeout, interval=0.1, what=f"job {job_id} {state}")


def running_row(gq, job_id: int, cond=lambda r: True, timeout: float = 20) -> dict:
    """Poll `gpuq status --json` (each look also records a progress sample) until `cond`."""
    found = {}

    def look():
        row = row_of(gq, job_id)
        assert row["state"] in ("pending", "running"), row
        found["row"] = row
        return row["state"] == "running" and cond(row)

    wait_for(look, timeout, interval=0.1, what=f"job {job_id}: {found.get('row')}")
    return found["row"]


# ---- log formats, as plain functions -----------------------------------------------------------
@pytest.mark.parametrize(
    "text, step, total, kind",
    [
        ("loading\nStep 120/300 loss=2.1\n", 120, 300, "Step N/M"),
        ("2026-12-01 10:00:01 INFO step: 7 of 50\n", 7, 50, "Step N/M"),
        ("[12/40] loss 0.3\n", 12, 40, "[N/M]"),
        ("Epoch 3/10 - loss 0.2\n", 3, 10, "Epoch N/M"),
        ("Iteration 45 of 90\n", 45, 90, "Iteration N of M"),
        ("progress: 37%\n", 37, 100, "N%"),
        (" 20%|██        | 60/300 [00:12<00:37, 6.47it/s]", 60, 300, "tqdm"),
        ("\r 10%|█ | 30/300 [00:05<00:45, 6.00it/s]\r 20%|██ | 60/300 [00:12<00:37, 6.47it/s]", 60, 300, "tqdm"),
        ("{'loss': '3.91', 'grad_norm': '0.8', 'epoch': '0.48'}\n", 0.48, None, "HF log (epoch)"),
    ],
)
def test_each_log_format_is_recognised(text: str, step: float, total, kind: str) -> None:
    reading = progress.from_log_text(text, at=1000.0)
    assert reading is not None, text
    assert (reading.step, reading.total, reading.kind) == (step, total, kind)
    assert reading.source == "log"


def test_tqdm_rate_and_hf_epochs_from_argv() -> None:
    bar = progress.from_log_text(" 5%|▌| 15/300 [00:05<01:35, 2.50s/it]", at=0.0)
    assert bar.rate == pytest.approx(0.4)  # s/it turned into steps per second
    epochs = progress.num_epochs(["--num_train_epochs=3"])
    hf = progress.from_log_text("{'loss': '3.9', 'epoch': '1.5'}\n", 0.0, epochs=epochs)
    assert hf.fraction == pytest.approx(0.5)
    done = progress.from_log_text("{'train_runtime': '2.9', 'train_loss': '3.9', 'epoch': '2.5'}\n", 0.0)
    assert done.finished and done.fraction == 1.0


def test_a_stray_100_percent_does_not_finish_the_job() -> None:
    log = (
        "Step 40/100 loss=1.2\n"
        "GPU utilisation 100%\n"  # no progress context: not progress at all
        "sanity check 100% done\n"  # progress words, but this counter was never seen running
        "Map: 100%|██████████| 1000/1000 [00:01<00:00, 900.00 examples/s]\n"  # a finished side bar
    )
    reading = progress.from_log_text(log, at=0.0)
    assert (reading.kind, reading.step, reading.total) == ("Step N/M", 40, 100)
    assert progress.from_log_text("accuracy on the test set: 100% done\n", at=0.0) is None
    # a side bar that ran inside training (eval loop) does not end the job either
    inner = (
        " 20%|██ | 60/300 [00:12<00:37, 6.47it/s]\r"
        "Eval:  50%|█ | 25/50 [00:01<00:01]\rEval: 100%|█| 50/50 [00:02<00:00]\n"
    )
    assert progress.from_log_text(inner, at=0.0).step == 60
    # the job's own counter reaching its end is believed: it was seen below 100% first
    assert progress.from_log_text("Step 99/100\nStep 100/100\n", at=0.0).fraction == 1.0


# HF Trainer with --disable_tqdm true: transformers 5's save bar at every save is the log's only counter
SAVE_BARS = (
    "resume_from_checkpoint: None\n"
    "\rWriting model shards:   0%|          | 0/1 [00:00<?, ?it/s]"
    "\rWriting model shards: 100%|##########| 1/1 [00:00<00:00, 287.08it/s]\n"
) * 2


def test_side_bars_and_counters_of_one_item_are_never_the_jobs_progress() -> None:
    assert progress.from_log_text(SAVE_BARS, 0.0) is None
    assert progress.last_step(SAVE_BARS.encode()) is None  # a preemption's "last progress" is unknown, not 1
    loading = "Loading checkpoint shards:  50%|#####     | 1/2 [00:01<00:01,  1.20s/it]\n"
    weights = "Loading weights:  40%|####      | 60/148 [00:00<00:00, 900.00it/s]\n"
    assert progress.from_log_text(loading + weights + "Fetching 3 files:  33%|###   | 1/3\n", 0.0) is None
    assert progress.from_log_text("Step 0/1\n", 0.0) is None
    assert progress.from_log_text("Step 40/100\n" + SAVE_BARS, 0.0).step == 40
    # after an `Epoch N/M` line a save bar is no bar within the epoch (it made epoch 2 of 10 into 3)
    epoch = progress.from_log_text("Epoch 2/10\n" + SAVE_BARS, 0.0)
    assert (epoch.kind, epoch.step) == ("Epoch N/M", 2.0)
    # one epoch of one is a whole run: its counters still count
    assert progress.from_log_text("{'loss': '3.9', 'epoch': '0.5'}\n", 0.0, epochs=1.0).fraction == 0.5
    within = progress.from_log_text("Epoch 1/1:  40%|####  | 40/100 [00:04<00:06, 10.00it/s]\n", 0.0)
    assert within.fraction == pytest.approx(0.4)


def test_a_line_cut_mid_write_is_not_read_as_a_wrong_total() -> None:
    assert progress.from_log_text("Step 11/300\nStep 12/3", at=0.0).step == 11


def test_a_very_long_line_is_read_by_its_end() -> None:
    # a sparse log's zeros or a dumped tensor before the bar: the bar at its end is still read,
    # a counter buried at the start of such a line is not (only the segment's last KiB is searched)
    junk = "\0" * 60_000
    assert progress.from_log_text(f"{junk}train:  12/100 [00:12<01:30, 1.10it/s]\n", at=0.0).step == 12
    assert progress.from_log_text(f"Step 5/100 {'x' * 60_000}\n", at=0.0) is None


# ---- rate-based ETA, as plain functions ----------------------------------------------------------
def test_eta_comes_from_the_rate_not_from_elapsed_time() -> None:
    # resumed at step 150 of 300; 10 steps per second since then
    reading = progress.Reading(170.0, 300.0, "log", "Step N/M", at=1002.0)
    est = eta.estimate(reading, [(1000.0, 150.0), (1002.0, 170.0)], now=1002.0)
    assert est.eta_seconds == pytest.approx(13.0)
    assert "10 steps/s over 2 samples" in est.method
    single = eta.estimate(reading, [(1002.0, 170.0)], now=1002.0)
    assert single.eta_seconds is None and "second sample" in single.method
    stalled = eta.estimate(reading, [(1000.0, 150.0), (1002.0, 170.0)], now=1002.0 + 600)
    assert stalled.eta_seconds is None and "stalled" in stalled.method


def test_samples_restart_when_the_counter_goes_back() -> None:
    points = eta.merge_points([[1.0, 50.0], [2.0, 60.0]], [(3.0, 5.0), (4.0, 9.0)], started=0.0)
    assert points == [(3.0, 5.0), (4.0, 9.0)]


# ---- real jobs ----------------------------------------------------------------------------------
REPORTER = f"""
import sys, time
sys.path.insert(0, {str(REPO)!r})
from gpuq.integrations import ProgressWriter
w = ProgressWriter(min_interval=0)
with open("paces.txt", "a", buffering=1) as paces:  # when each step was reached: its real pace
    for step in range(0, 201):
        w.update(step, 200)
        paces.write(f"{{step}} {{time.time()}}\\n")
        time.sleep(0.05)
"""


def paces(gq, upto: float, recent: int = 20) -> tuple[float, float]:
    """The job's steps per second by its own clock (paces.txt), up to step `upto`: over the whole
    run, and over its last `recent` steps. The pace of a job on a loaded machine is the machine's;
    an ETA is checked against the pace the job really had."""
    upto = round(upto)

    def stamped() -> dict[int, float]:  # whole lines only: the job may be writing the next one
        lines = (gq.work / "paces.txt").read_text().split("\n")[:-1]
        times = {int(step): float(at) for step, at in (line.split() for line in lines)}
        return times if upto in times else {}

    times = wait_for(stamped, 10, what=f"the job's time of step {upto}")
    done = sorted(n for n in times if n <= upto)
    first, last, back = done[0], done[-1], done[max(0, len(done) - 1 - recent)]
    return tuple((last - n) / (times[last] - times[n]) for n in (first, back))


def test_progress_file_reaches_status_json(gq) -> None:
    gq.script("report.py", REPORTER)
    job_id = gq.add("report.py")
    gq.start_worker()
    row = running_row(gq, job_id, lambda r: r["progress"] and r["eta_seconds"] is not None)
    assert row["progress_source"] == "reported"
    assert 0 < row["progress"] < 1
    # about 20 steps/s: the remaining steps at the pace the job really had (its own clock)
    left = (1 - row["progress"]) * 200
    fast, slow = left / max(paces(gq, 200 - left)), left / min(paces(gq, 200 - left))
    assert 0.5 * fast <= row["eta_seconds"] <= 3 * slow + 1, (row, fast, slow)
    table = gq.gpuq("status").stdout
    assert "%" in table and "ETA" in table and "[" in table
    assert f"#{job_id}" in gq.gpuq("eta", str(job_id)).stdout
    assert "reported (progress file)" in gq.gpuq("eta", str(job_id)).stdout


def test_tqdm_carriage_return_stream(gq) -> None:
    gq.script(
        "bar.py",
        "import sys, time\n"
        "for n in range(0, 401):\n"
        "    sys.stderr.write(f'\\r{n * 100 // 400:3d}%|##  | {n}/400 [00:{n // 20:02d}<00:20, 20.00it/s]')\n"
        "    sys.stderr.flush(); time.sleep(0.05)\n",
    )
    job_id = gq.add("bar.py")
    gq.start_worker()
    row = running_row(gq, job_id, lambda r: r["progress"] and r["progress"] > 0.02)
    assert row["progress_source"] == "log" and "tqdm" in row["eta_method"]
    assert row["eta_seconds"] is not None


def test_progress_from_the_tail_of_a_log_over_100_mb(gq) -> None:
    gq.script(
        "big.py",
        "import sys, time\n"
        "chunk = (b'x' * 1023 + b'\\n') * 1024\n"
        "for _ in range(105):\n"
        "    sys.stdout.buffer.write(chunk)\n"
        "print('Step 40/100', flush=True)\n"
        "time.sleep(60)\n",
    )
    job_id = gq.add("big.py")
    gq.start_worker()
    row = running_row(gq, job_id, lambda r: r["progress"] is not None, timeout=60)
    assert row["progress"] == pytest.approx(0.4)
    log = gq.home / "logs" / f"{job_id:06d}.log"
    assert log.stat().st_size > 100 * 1024 * 1024
    spool, job = Spool(gq.home), Job(gq.job(job_id))
    small = Job(job, adopted=True, log=str(gq.script("small.log", "Step 40/100\n")))
    read = {}
    for name, which in (("big", job), ("small", small)):
        before = bytes_read()
        reading, _extra, _log = eta.observe(spool, which, {})  # no samples yet: the log itself is read
        read[name] = bytes_read() - before  # counted by the kernel, whatever the load (timed: bench/latencies.py)
        assert reading.step == 40
    # only the tail is read: the 100 MB log costs a one-line log's reads and its last TAIL_BYTES at most
    assert read["big"] < read["small"] + 2 * progress.TAIL_BYTES, read


def test_resumed_job_gets_the_right_eta_from_its_first_samples(gq) -> None:
    gq.script(
        "resume.py",
        "import time\n"
        "with open('paces.txt', 'a', buffering=1) as paces:\n"
        "    for step in range(150, 301):\n"  # resumed from a checkpoint at step 150
        "        print(f'Step {step}/300', flush=True)\n"
        "        paces.write(f'{step} {time.time()}\\n')\n"
        "        time.sleep(0.1)\n",
    )
    job_id = gq.add("resume.py")
    gq.start_worker()
    row = running_row(gq, job_id, lambda r: r["eta_seconds"] is not None and r["progress"] > 0.6)
    step = row["progress"] * 300
    # About 10 steps a second, at the pace the machine's load allows: the job's own clock says which.
    # "Elapsed x remaining / done" would count the 150 steps done before as this run's: far too short.
    fast, slow = (300 - step) / max(paces(gq, step)), (300 - step) / min(paces(gq, step))
    assert 0.5 * fast <= row["eta_seconds"] <= 2.5 * slow, (row, fast, slow)
    assert "elapsed x remaining / done" not in row["eta_method"], row


def test_a_retried_attempt_shows_neither_the_last_attempts_progress_nor_its_jump(gq) -> None:
    """A training that crashed at step 25 is retried from checkpoint-20: while it loads, its log
    has only the crashed attempt's bar (25/60) above its header; then HF's bar jumps from 0 to 21
    in one update, tqdm's rate counting the jump."""
    shutil.copy(Path(__file__).with_name("fake_trainer.py"), gq.work / "fake_trainer.py")
    (gq.work / "hold").write_text("")
    args = ("--output_dir", "out", "--max_steps", "60", "--save_steps", "10", "--step_time", "0.1")
    crash = ("--log_style", "bar", "--fail_at", "25", "--fail_once", "--hold_on_resume", "hold")
    job_id = gq.add("--retries", "1", "-p", PY, "fake_trainer.py", *args, *crash)
    gq.start_worker()
    wait_for(lambda: "Resumed from step 20" in gq.log(job_id), 30, what="the retry to load")
    loading = running_row(gq, job_id)
    assert loading["progress_source"] == "checkpoint", loading
    assert loading["progress"] == pytest.approx(20 / 60, abs=1e-3), loading
    (gq.work / "hold").unlink()
    row = running_row(gq, job_id, lambda r: r["progress_source"] == "log" and r["eta_seconds"] is not None)
    left = 60 - row["progress"] * 60
    assert row["eta_seconds"] >= 0.5 * left * 0.1, row  # at 0.1 s a step or slower, not tqdm's 210/s
    gq.gpuq("kill", str(job_id))  # what it shows is checked; running to its end would prove nothing more


def test_stray_100_percent_in_a_running_jobs_log(gq) -> None:
    gq.script(
        "stray.py",
        "import time\n"
        "print('Step 40/100', flush=True)\n"
        "print('Downloading: 100%|##########| shards', flush=True)\n"
        "print('GPU memory 100%', flush=True)\n"
        "time.sleep(60)\n",
    )
    job_id = gq.add("stray.py")
    gq.start_worker()
    row = running_row(gq, job_id, lambda r: r["progress"] is not None)
    assert row["progress"] == pytest.approx(0.4)
    assert row["eta_seconds"] != 0


def make_checkpoint(out: Path, step: int, complete: bool = True, max_steps: int = 0) -> None:
    ckpt = out / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"weights")
    if complete:
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": max_steps}))


def test_progress_from_checkpoint_directories(gq) -> None:
    out = gq.work / "runs" / "a"
    gq.script("ckpt.py", "import time\ntime.sleep(60)\n")
    job_id = gq.add("ckpt.py", "--output_dir", "runs/a", "--max-steps=100")
    gq.start_worker()
    gq.wait_state(job_id, "running")  # checkpoints it writes (one made before it began is another run's)
    make_checkpoint(out, 10)
    make_checkpoint(out, 20)
    make_checkpoint(out, 30, complete=False)  # cut short while saving: not a checkpoint
    make_checkpoint(gq.work / "elsewhere", 90)  # not in the job's output dir: ignored
    row = running_row(gq, job_id, lambda r: r["progress"] is not None)
    assert row["progress_source"] == "checkpoint"
    assert row["progress"] == pytest.approx(0.2)
    assert "checkpoint-20" in row["eta_method"]


# HF Trainer run with --max_steps and --disable_tqdm true: its log has only the loss dicts (an epoch,
# no total); its checkpoints' trainer_state.json carry max_steps.
HF_DICTS = """
import json, os, time
for step in range(1, 16):
    print({'loss': 0.5, 'grad_norm': 1.1, 'learning_rate': 5e-05, 'epoch': round(step / 24, 2)}, flush=True)
    if step % 5 == 0:
        os.makedirs(f"out/checkpoint-{step}")
        with open("state.tmp", "w") as fh:
            json.dump({"global_step": step, "max_steps": 24}, fh)
        os.replace("state.tmp", f"out/checkpoint-{step}/trainer_state.json")
    time.sleep(0.02)
while not os.path.exists("go"):
    time.sleep(0.02)
"""


def test_a_log_without_a_total_does_not_hide_checkpoints_that_have_one(gq) -> None:
    gq.script("hf_dicts.py", HF_DICTS)
    job_id = gq.add("hf_dicts.py", "--output_dir", "out", "--disable_tqdm", "true")
    gq.start_worker()
    wait_for(lambda: (gq.work / "out" / "checkpoint-15" / "trainer_state.json").exists(), 20, what="checkpoint-15")
    row = running_row(gq, job_id, lambda r: r["progress_source"] is not None)
    assert row["progress_source"] == "checkpoint" and "checkpoint-15" in row["eta_method"], row
    assert row["progress"] == pytest.approx(15 / 24)
    (gq.work / "go").touch()


def test_checkpoint_progress_uses_trainer_state_and_trl_completions() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "out")
        make_checkpoint(out, 50, max_steps=200)
        then = time.time() - 30
        os.utime(out / "checkpoint-50" / "trainer_state.json", (then, then))
        job = Job({"cmd": ["python", "train.py", "--output-dir", "out"], "cwd": tmp})
        reading, points = progress.from_checkpoints(job)
        assert (reading.step, reading.total, reading.source) == (50, 200, "checkpoint")
        (out / "completions").mkdir()
        for n, age in ((60, 20), (70, 10)):
            path = out / "completions" / f"completions_{n:05d}.parquet"
            path.write_bytes(b"PAR1")
            os.utime(path, (time.time() - age, time.time() - age))
        reading, points = progress.from_checkpoints(job)
        assert (reading.step, reading.kind) == (70, "completions/completions_00070.parquet")
        # files written over time: a rate (20 steps in 20 s) from a single look
        assert eta.rate_of(points)[0] == pytest.approx(1.0, rel=0.05)


# ---- queue ETA ----------------------------------------------------------------------------------
def test_queue_plan_is_unknown_rather_than_a_guess() -> None:
    run = Job({"id": 1, "slot": None})
    a = Job({"id": 2, "cmd": ["a"], "cwd": "/w", "after": [], "after_any": []})
    b = Job({"id": 3, "cmd": ["b"], "cwd": "/w", "after": [], "after_any": []})
    blocked = Job({"id": 4, "cmd": ["a"], "cwd": "/w", "after": [9], "after_any": []})
    durations = {eta.command_key(a): [30.0, 40.0, 50.0]}
    plan = queue_eta.plan_queue(
        [(run, 100.0)], [(a, None), (b, None), (blocked, Wait("after #9", True))], [None], durations
    )
    assert (plan[2].starts_in, plan[2].eta_seconds) == (100.0, 140.0)
    assert (plan[3].starts_in, plan[3].eta_seconds) == (140.0, None)  # never ran before: unknown
    assert plan[4].starts_in is None and "will not start" in plan[4].method
    two_gpus = queue_eta.plan_queue([(Job(run, slot="0"), 100.0)], [(b, None)], ["0", "1"], {})
    assert two_gpus[3].starts_in == 0.0
    assert queue_eta.plan_queue([(run, None)], [(a, None)], [None], durations)[2].starts_in is None
    assert "no worker" in queue_eta.plan_queue([], [(a, None)], [], durations)[2].method


def test_an_unknown_start_names_the_jobs_before_it_that_have_no_eta() -> None:
    adopted = Job({"id": 1, "name": "hand/train", "adopted": True, "gpus": [0], "slot": "0"})
    other = Job({"id": 2, "name": "runs/long", "gpus": [1], "slot": "1"})
    waits = Job({"id": 3, "cmd": ["a"], "cwd": "/w", "after": [], "after_any": []})
    after = Job({"id": 4, "cmd": ["b"], "cwd": "/w", "after": [1], "after_any": []})
    plan = queue_eta.plan_queue([(adopted, None)], [(waits, None)], ["0", "cpu"], {})
    assert plan[3].method.startswith("start unknown (#1 hand/train, adopted, has no ETA); run time unknown")
    plan = queue_eta.plan_queue([(adopted, None), (other, None)], [(waits, None), (after, None)], ["0", "1", "cpu"], {})
    assert plan[3].method.startswith("start unknown (#1 hand/train, adopted, and 1 more have no ETA)")
    assert plan[4].method.startswith("start unknown (#1 hand/train, adopted, has no ETA)")  # its dependency


def test_pending_job_behind_a_running_one_has_a_start_time(gq) -> None:
    gq.script("short.py", "import time\ntime.sleep(1)\n")
    first = gq.add("short.py")
    foreground = gq.start_worker()
    wait_state(gq, first, "done")
    foreground.wait(30)  # it leaves once the queue is empty: one worker at a time for the spool
    gq.script("long.py", REPORTER)
    gq.start_worker("--watch")
    running = gq.add("long.py")
    wait_state(gq, running, "running")
    waiting = gq.add("short.py")
    never_ran = gq.add("--after", str(waiting), "long.py")

    def planned():
        rows = {r["id"]: r for r in gq.status_json()}
        return rows[running]["eta_seconds"] is not None and rows[waiting]["starts_in_seconds"] is not None and rows

    rows = wait_for(planned, 20, interval=0.1, what="a start time for the waiting job")
    head, behind = rows[running], rows[waiting]
    assert behind["state"] == "pending"
    assert behind["starts_in_seconds"] == pytest.approx(head["eta_seconds"], abs=1.5)
    # it ran once before in about a second: it should end about a second after it starts
    assert 0.5 <= behind["eta_seconds"] - behind["starts_in_seconds"] <= 5
    assert rows[never_ran]["eta_seconds"] is None and rows[never_ran]["starts_in_seconds"] is not None
    text = gq.gpuq("eta").stdout
    assert f"#{waiting}" in text and "starts in ~" in text and "median of 1 earlier run" in text
    assert "starts ~" in gq.gpuq("status").stdout


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="Step Epoch[]/%|0123456789 \r\n{}':.epochtrain_runtime", max_size=300))
def test_any_log_tail_gives_a_sane_reading_or_none(text: str) -> None:
    reading = progress.from_log_text(text, at=0.0)
    assert reading is None or reading.fraction is None or 0.0 <= reading.fraction <= 1.0
    if reading is not None:
        assert reading.text() and eta.estimate(reading, [(0.0, reading.step)], now=1.0).method


def test_samples_taken_between_looks_give_a_rate_at_the_first_look(gq) -> None:
    # what a worker's periodic step does with eta.sample_running: samples accumulate unseen
    gq.script(
        "steps.py",
        "import time\nfor i in range(1000):\n    print(f'Step {i}/1000', flush=True)\n    time.sleep(0.05)\n",
    )
    job_id = gq.add("steps.py")
    gq.start_worker()
    spool = Spool(gq.home)
    job = Job(wait_for(lambda: (j := gq.job(job_id)).get("pid") and gq.log(job_id).count("Step ") > 2 and j, 15))
    eta.sample_running(spool, [job], time.time())
    wait_for(lambda: gq.log(job_id).count("Step ") > 30, 15, what="more steps")
    row = row_of(gq, job_id)  # the first `gpuq status` of a user
    assert row["eta_seconds"] is not None and "samples" in row["eta_method"], row


# Lightning's default bar counts within an epoch (`Epoch 0: 90%|...| 9/10`), and so does a bar after
# an `Epoch 2/10` line: neither bar alone is the run's progress.
LIGHTNING_BARS = "".join(
    f"\rEpoch {epoch}: {step * 10}%|{'#' * step}| {step}/10 [00:0{step}<00:01, 5.00it/s, v_num=0]"
    for epoch in range(3)
    for step in range(1, 10)
)
EPOCH_LINE_THEN_BAR = "Epoch 2/10\n" + "".join(
    f"\r {step}%|#| {step}/100 [00:0{step // 10}<00:10, 4.00it/s]" for step in range(1, 46)
)


def test_a_bar_within_an_epoch_counts_with_its_epoch() -> None:
    """Epochs are counted from 1 (Keras, `desc=f"Epoch {e + 1}/{n}"`: at `Epoch 2/10` one is done)
    unless the tail shows an `Epoch 0/M`: read from 0, a run counted from 1 showed 40% where 7% was
    done, then fell back to 67% as its last epoch began."""
    inner = progress.from_log_text(EPOCH_LINE_THEN_BAR, 0.0)
    assert (inner.step, inner.total, inner.kind) == (pytest.approx(1.45), 10, "Epoch N/M")
    assert inner.rate == pytest.approx(0.04)  # epochs per second: 4 it/s of 100 a epoch
    in_its_description = progress.from_log_text("Epoch 2/10: 45%|####5     | 45/100 [00:11<00:13, 4.00it/s]\n", 0.0)
    assert in_its_description.fraction == pytest.approx(0.145)
    from_zero = progress.from_log_text("Epoch 0/10\n" + EPOCH_LINE_THEN_BAR, 0.0)
    assert from_zero.fraction == pytest.approx(0.245)
    last = progress.from_log_text(EPOCH_LINE_THEN_BAR.replace("Epoch 2/10", "Epoch 10/10"), 0.0)
    assert last.fraction == pytest.approx(0.945)
    seen = [
        progress.from_log_text(f"Epoch {e}/3: {s}0%|#| {s}/10 [00:01<00:01, 2.00it/s]\n", 0.0)
        for e, s in ((1, 2), (2, 6), (3, 0))
    ]
    assert [round(r.fraction, 3) for r in seen] == [0.067, 0.533, 0.667]  # never ahead, never backwards
    # Lightning's bar names its epoch but not how many: epochs, no fraction, so no ETA
    lightning = progress.from_log_text(LIGHTNING_BARS, 0.0)
    assert (lightning.step, lightning.total, lightning.fraction) == (pytest.approx(2.9), None, None)
    assert lightning.text() == "epoch 2.90"
    assert eta.estimate(lightning, [], 10.0).eta_seconds is None
    assert progress.from_log_text(LIGHTNING_BARS, 0.0, epochs=5).fraction == pytest.approx(2.9 / 5)
    # a preempted job's last step is still the bar's own
    assert progress.last_step(EPOCH_LINE_THEN_BAR.encode()) == 45 and progress.last_step(LIGHTNING_BARS.encode()) == 9


def test_status_of_jobs_whose_bars_count_within_an_epoch(gq) -> None:
    """`gpuq status` of real jobs: Lightning's per-epoch bar gives no percentage and no ETA (it said
    90% ETA 0s, then 30%, then 90% again); a bar at 45% after `Epoch 2/10` is 14.5% of the run."""
    ids = {}
    for name, text in (("lightning.py", LIGHTNING_BARS), ("epochs.py", EPOCH_LINE_THEN_BAR)):
        gq.script(name, f"import sys\nsys.stderr.write({text!r})\nsys.stderr.flush()\n" + WAIT_FOR_GO)
        ids[name] = gq.add(name)
    gq.start_worker("--gpus", "0,1")  # two slots
    lightning = running_row(gq, ids["lightning.py"], lambda r: r["eta_method"] and "Epoch" in r["eta_method"])
    assert lightning["progress"] is None and lightning["eta_seconds"] is None, lightning
    assert "no total" in lightning["eta_method"], lightning
    epochs = running_row(gq, ids["epochs.py"], lambda r: r["progress"] is not None)
    assert epochs["progress"] == pytest.approx(0.145), epochs
    line = next(
        line for line in gq.gpuq("status").stdout.splitlines() if line.lstrip().startswith(f"{ids['lightning.py']} ")
    )
    assert "epoch 2.90 ETA ?" in line, line
    (gq.work / "go").touch()
