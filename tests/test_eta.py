"""The ETA of a running job (issue 12): the `N%` rule, the save bar after training, the first-look
formula, the blended rate, the first sample kept, the start step, and the end-of-run tail learned
from earlier runs in a real spool; then a real worker showing the first-look figure."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import wait_for

from gpuq.core import schema
from gpuq.core.job import Job
from gpuq.core.times import iso_of
from gpuq.engine.tracking import checkpoints, eta, progress
from gpuq.spool import Spool


def reading(step: float, total: float = 300.0, at: float = 1000.0, **kw) -> progress.Reading:
    return progress.Reading(step, total, kw.pop("source", "log"), kw.pop("kind", "Step N/M"), at, **kw)


# ---- the N% rule ---------------------------------------------------------------------------------
@pytest.mark.parametrize("line", ["6.0%", "  42 %", " 45%|####      | ", "progress: 30%", "30% complete", "done: 7.5%"])
def test_a_percentage_that_says_progress_counts(line: str) -> None:
    got = progress.line_reading(line)
    assert got is not None and got[0].startswith("N%") and got[2] == 100.0, got


@pytest.mark.parametrize("line", ["accuracy 93.5%", "6.0%x", "progress 6.0%x", "gpu util 45% mem 30%", "v1.5%"])
def test_a_percentage_that_is_a_metric_does_not(line: str) -> None:
    assert progress.line_reading(line) is None


def test_percent_lines_give_progress_and_a_lone_100_only_after_a_lower_one() -> None:
    text = "".join(f"{p:.1f}%\n" for p in (2.0, 4.0, 6.0))
    got = progress.from_log_text(text, at=5.0)
    assert got is not None and (got.step, got.total, got.kind) == (6.0, 100.0, "N%")
    assert progress.from_log_text("loading\n100%\n", at=5.0) is None  # never seen running: not progress
    done = progress.from_log_text("40%\n100%\n", at=5.0)
    assert done is not None and done.fraction == 1.0


# ---- the save bar of transformers 5 --------------------------------------------------------------
SAVE_TAIL = (
    " 98%|#########8| 294/300 [00:05<00:00, 56.1it/s]\r100%|##########| 300/300 [00:05<00:00, 56.6it/s]\n"
    "{'train_runtime': '5.3', 'train_loss': '4.7', 'epoch': '0.59'}\n"
    "Writing model shards:   0%|          | 0/1 [00:00<?, ?it/s]\r"
    "Writing model shards: 100%|##########| 1/1 [00:00<00:00, 92.98it/s]\n"
)


def test_the_bar_earlier_looks_saw_running_wins_over_the_save_bar() -> None:
    seen = [("tqdm:", 300.0)]  # what earlier looks recorded while training ran
    got = progress.from_log_text(SAVE_TAIL, 9.0, None, seen)
    assert got is not None and (got.step, got.total, got.counter) == (300.0, 300.0, "tqdm:")
    # no earlier look: the training bar ran in this tail; the save bar is never the job's progress
    assert progress.from_log_text(SAVE_TAIL, 9.0).counter == "tqdm:"
    # a counter still running still beats both
    running = progress.from_log_text(SAVE_TAIL + "Step 5/90\n", 9.0, None, seen)
    assert running is not None and running.step == 5.0


# ---- a resumed attempt's jump to its start step ---------------------------------------------------
def test_a_resumed_attempt_takes_no_rate_from_the_jump_to_its_start_step() -> None:
    """HF's bar jumps from 0 to the step after the checkpoint in one update, and tqdm's rate counts
    the jump: 21 steps in a tenth of a second."""
    run = eta.Attempt(started=990.0, start_step=20.0)
    jumped = reading(21, total=60, kind="tqdm", rate=210.0, rate_note="(tqdm's own rate)")
    est = eta.estimate(jumped, [(1000.0, 21.0)], now=1000.0, run=run)
    assert est.eta_seconds == pytest.approx(390.0) and "since step 20" in est.method  # 1 step in 10 s, 39 left
    scratch = eta.estimate(jumped, [(1000.0, 21.0)], now=1000.0, run=eta.Attempt(990.0))
    assert scratch.eta_seconds == pytest.approx(39 / 210) and "tqdm" in scratch.method  # no jump: tqdm's own
    # a sample of the bar's 0/60, before the jump, is no sample of the pace
    points = [(995.0, 0.0), (1000.0, 21.0), (1002.0, 23.0)]
    assert eta.past_resume(points, reading(23, total=60, kind="tqdm"), run) == points[1:]
    assert eta.past_resume(points, reading(23, total=60, kind="tqdm"), eta.Attempt(990.0)) == points
    # a counter below the step it resumed from counts something else (a bar over epochs): kept whole
    epochs = [(995.0, 2.0), (1000.0, 3.0)]
    assert eta.past_resume(epochs, reading(3, total=10, kind="tqdm"), run) == epochs


def test_a_retried_attempt_reads_only_its_own_part_of_the_log(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool").ensure()
    job = schema.new_job(job_id=4, name="train", cmd=["python", "train.py"], cwd=str(tmp_path), log="")
    log, now = Path(spool.logs.path_of(job)), time.time()
    log.write_text(
        "=== gpuq: job #4 train (attempt 1)\nStep 25/60\n=== gpuq: exit 1 at ... -> pending\n"
        "=== gpuq: job #4 train (attempt 2)\n=== gpuq: started: ...\nloading the model\n"
    )
    job.update(state="running", started_at=iso_of(now - 5), resumed_from_step=20)
    assert eta.running_estimate(spool, job, now).reading is None  # not the crashed attempt's step 25
    with open(log, "a") as out:
        out.write("Step 21/60\n")
    assert eta.running_estimate(spool, job, now).reading.step == 21


# ---- the first look ------------------------------------------------------------------------------
def test_first_look_from_scratch_uses_elapsed_times_remaining_over_done() -> None:
    run = eta.Attempt(started=970.0)
    est = eta.estimate(reading(30), [(1000.0, 30.0)], now=1000.0, run=run)
    assert est.eta_seconds == pytest.approx(270.0)  # 30 steps in 30 s, 270 left
    assert "elapsed x remaining / done (one sample so far)" in est.method
    assert eta.estimate(reading(30), [(1000.0, 30.0)], now=1000.0).eta_seconds is None  # no attempt: as before


def test_first_look_of_a_resumed_job_counts_from_its_start_step() -> None:
    run = eta.Attempt(started=980.0, start_step=150.0)
    est = eta.estimate(reading(170), [(1000.0, 170.0)], now=1000.0, run=run)
    assert est.eta_seconds == pytest.approx(130.0)  # 20 steps in 20 s, 130 left; naive: ~3.5 s
    assert "since step 150" in est.method


@pytest.mark.parametrize(
    ("run", "kind", "why"),
    [
        (eta.Attempt(980.0, start_step=None), "Step N/M", "step is unknown"),
        (eta.Attempt(980.0, start_step=150.0), "Epoch N/M", "epochs or percent"),
        (eta.Attempt(980.0, start_step=150.0), "N%", "epochs or percent"),
    ],
)
def test_first_look_is_unknown_when_the_start_cannot_be_told(run: eta.Attempt, kind: str, why: str) -> None:
    est = eta.estimate(reading(170, kind=kind), [(1000.0, 170.0)], now=1000.0, run=run)
    assert est.eta_seconds is None and why in est.method and "unknown" in est.method


def test_an_epoch_counter_from_scratch_still_gets_the_first_look() -> None:
    est = eta.estimate(reading(1, 4, kind="Epoch N/M"), [(1000.0, 1.0)], now=1000.0, run=eta.Attempt(900.0))
    assert est.eta_seconds == pytest.approx(300.0)


def test_adopted_job_with_a_checkpoint_that_never_moves_gets_the_first_look(tmp_path: Path) -> None:
    ckpt = tmp_path / "out" / "checkpoint-20"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"max_steps": 100}))
    written = (ckpt / "trainer_state.json").stat().st_mtime
    job = Job({"cmd": ["python", "train.py", "--output_dir", "out"], "cwd": str(tmp_path), "adopted": True})
    run = eta.Attempt(written - 40.0, checkpoints.start_step(job))
    for look in range(3):  # every look finds the same single checkpoint: still one sample
        got, points = progress.from_checkpoints(job)
        points = eta.merge_points(points, [(got.at, got.step)], run.started)
        est = eta.estimate(got, points, now=written + look, run=run)
        # 20 steps in the 40 + look seconds it has run (no newer checkpoint yet), 80 left: the ETA
        # grows while nothing moves (counted to the checkpoint's time, it fell to 0 and stayed there)
        assert len(points) == 1 and est.eta_seconds == pytest.approx(4 * (40.0 + look)), est
        assert "one sample so far" in est.method


def test_first_look_of_a_job_long_past_the_end_its_pace_promised_says_stalled() -> None:
    run = eta.Attempt(started=970.0)  # 30 steps in 30 s: at that pace it ends at 1270
    assert eta.estimate(reading(30), [(1000.0, 30.0)], now=1300.0, run=run).eta_seconds == pytest.approx(2970.0)
    late = eta.estimate(reading(30), [(1000.0, 30.0)], now=1340.0, run=run)
    assert late.eta_seconds is None and "no progress for 5m40s; stalled?" in late.method


def test_the_samples_rate_comes_first_then_the_sources_own_then_the_first_look() -> None:
    run = eta.Attempt(started=900.0)
    two = [(998.0, 280.0), (1000.0, 290.0)]  # 5 steps/s
    assert eta.estimate(reading(290, rate=1.0), two, 1000.0, run).eta_seconds == pytest.approx(2.0)
    own = eta.estimate(reading(290, rate=1.0, rate_note="(tqdm's own rate)"), [(1000.0, 290.0)], 1000.0, run)
    assert own.eta_seconds == pytest.approx(10.0) and "tqdm" in own.method
    first = eta.estimate(reading(290), [(1000.0, 290.0)], 1000.0, run)
    assert first.eta_seconds == pytest.approx(10 * 100 / 290) and "one sample so far" in first.method


def test_start_step() -> None:
    assert checkpoints.start_step(Job({"cmd": ["python", "t.py"]})) == 0.0
    assert checkpoints.start_step(Job({"resumed_from_step": 120, "resumed_from": "/o/checkpoint-999"})) == 120.0
    assert checkpoints.start_step(Job({"resumed_from": "/o/checkpoint-150/"})) == 150.0
    adopted = Job({"cmd": ["python", "t.py", "--resume_from_checkpoint", "out/checkpoint-80"], "adopted": True})
    assert checkpoints.start_step(adopted) == 80.0
    assert checkpoints.start_step(Job({"cmd": ["python", "t.py", "--resume_from_checkpoint=True"]})) is None


# ---- the rate: a blend, and the first sample kept --------------------------------------------------
def test_the_rate_blends_the_window_with_the_mean_only_beyond_the_window() -> None:
    slow = [(float(t), float(t)) for t in range(13)]  # 1 step/s for 12 s
    fast = [(12.0 + t, 12.0 + 2 * t) for t in range(1, 8)]  # then 2 steps/s
    points = slow + fast
    window, mean = 0.5, (points[-1][0] - points[0][0]) / (points[-1][1] - points[0][1])
    rate, note = eta.rate_of(points, 0.25)
    assert rate == pytest.approx(1 / (0.25 * window + 0.75 * mean)) and "blended 25%" in note
    assert eta.rate_of(points, 1.0)[0] == pytest.approx(2.0)  # the window alone
    assert eta.rate_of(points[-eta.RATE_POINTS :], 0.25)[0] == pytest.approx(2.0)  # no more than the window
    assert eta.rate_of(points[:1])[0] is None


def test_merge_keeps_the_series_first_sample_and_the_newest() -> None:
    points = eta.merge_points([], [(float(t), float(t)) for t in range(50)], started=0.0)
    assert len(points) == eta.MAX_POINTS and points[0] == (0.0, 0.0) and points[1] == (19.0, 19.0)
    assert eta.merge_points([[1.0, 50.0]], [(2.0, 5.0)], started=0.0) == [(2.0, 5.0)]  # counter restarted


# ---- the tail ------------------------------------------------------------------------------------
def test_tail_of_a_finished_run() -> None:
    job = Job({"started_at": iso_of(900.0), "finished_at": iso_of(1001.5)})
    at_total = {"total": 100, "points": [[990.0, 90.0], [1000.0, 100.0]]}
    assert eta.tail_and_pace(job, at_total)[0] == pytest.approx(1.5)
    # the last look came late; a sample within 20% of the end says when the last step happened
    late = {"total": 100, "points": [[980.0, 80.0], [990.0, 90.0], [1001.0, 100.0]]}
    assert eta.tail_and_pace(job, late)[0] == pytest.approx(1.5)
    assert eta.tail_and_pace(job, {"total": 100, "points": [[980.0, 80.0], [990.0, 90.0]]})[0] == pytest.approx(1.5)
    assert eta.tail_and_pace(job, {"total": 100, "points": [[940.0, 40.0], [950.0, 50.0]]})[0] is None  # too far
    assert eta.tail_and_pace(job, {"points": [[1000.0, 100.0]]})[0] is None  # no total recorded


def test_the_tail_is_added_and_counts_from_when_the_counter_reached_its_total() -> None:
    run = eta.Attempt(started=900.0, tail=0.6, tail_runs=3)
    points = [(990.0, 290.0), (1000.0, 300.0)]
    end = eta.estimate(reading(300, at=1000.2), points + [(1000.2, 300.0)], now=1000.3, run=run)
    assert (
        end.eta_seconds == pytest.approx(0.3) and "+ 0.6s after the last step (median of 3 earlier runs)" in end.method
    )
    mid = eta.estimate(reading(290, at=990.0), [(980.0, 280.0)] + points[:1], now=990.0, run=run)
    assert mid.eta_seconds == pytest.approx(10.6)


# ---- learning the tail in a real spool -------------------------------------------------------------
def finished_run(spool: Spool, job_id: int, cwd: str, tail: float, end: float, **fields) -> None:
    """A finished job in done/ with the samples its looks left, `tail` seconds after its last step."""
    job = schema.new_job(job_id=job_id, name="train", cmd=["python", "train.py"], cwd=cwd, log="")
    job.update(state="done", started_at=iso_of(end - 100), finished_at=iso_of(end), exit_code=0, **fields)
    spool.jobs.publish(job, "done")
    last = end - tail
    spool.reports.write_samples(job_id, {"total": 50, "points": [[last - 10, 40], [last - 5, 45], [last, 50]]})


def test_the_tail_is_learned_from_earlier_runs_of_the_same_command_here(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool").ensure()
    here, now = str(tmp_path), time.time()
    for job_id, tail in ((1, 0.5), (2, 0.9), (3, 0.7)):
        finished_run(spool, job_id, here, tail, now - 1000 + job_id)
    finished_run(spool, 4, str(tmp_path / "elsewhere"), 30.0, now - 900)  # other directory
    finished_run(spool, 5, here, 30.0, now - 900, adopted=True)  # adopted: exit unknown
    other = schema.new_job(job_id=6, name="eval", cmd=["python", "eval.py"], cwd=here, log="")
    other.update(state="done", started_at=iso_of(now - 900), finished_at=iso_of(now - 890), exit_code=0)
    spool.jobs.publish(other, "done")
    spool.reports.write_samples(6, {"total": 50, "points": [[now - 891, 50]]})  # other command (tail 1 s)
    finished_run(spool, 7, here, 30.0, now + 60)  # ended after this attempt started: not earlier

    job = schema.new_job(job_id=9, name="train", cmd=["python", "train.py"], cwd=here, log="")
    job.update(state="running", started_at=iso_of(now - 60))
    assert eta.learned_tail(eta.past_ends(spool, job, now - 60))[:2] == (pytest.approx(0.7, abs=0.01), 3)

    got = reading(10, total=50, at=now - 10)
    points, run = eta.record(spool, job, got, [])
    assert (run.tail, run.tail_runs) == (pytest.approx(0.7, abs=0.01), 3)
    cached = spool.reports.read_samples(9)
    assert cached["total"] == 50 and cached["tail"]["runs"] == 3 and cached["tail"]["for"] == run.started

    finished_run(spool, 8, here, 5.0, now - 500)  # a new run ends: the cached tail stays for this attempt
    assert eta.record(spool, job, got, [])[1].tail == pytest.approx(0.7, abs=0.01)
    job["started_at"] = iso_of(now)  # a retry: its first look learns again
    retry = eta.record(spool, job, reading(10, total=50, at=now + 1), [])[1]
    assert (retry.tail, retry.tail_runs) == (pytest.approx(0.8, abs=0.01), 4)


def test_the_reading_of_a_log_is_kept_until_the_log_changes(tmp_path: Path) -> None:
    """A look at a log not written to since the last one takes the reading kept in the samples
    (parsing nothing); a line written since, a damaged memo or another --num_train_epochs make it
    read the log again."""
    spool = Spool(tmp_path / "spool").ensure()
    log, now = tmp_path / "train.log", time.time()
    log.write_text("Step 3/10\n")
    job = schema.new_job(job_id=4, name="train", cmd=["python", "train.py"], cwd=str(tmp_path), log=str(log))
    job.update(state="running", started_at=iso_of(now - 60), adopted=True)
    first = eta.running_estimate(spool, job, now)
    assert first.reading is not None and first.reading.step == 3
    eta.running_estimate(spool, job, now)  # the counter it saw running is kept: read once more with it
    kept = spool.reports.read_samples(4)["log"]
    assert kept["reading"] == list(first.reading) and kept["of"][:3] == spool.logs.signature(job)

    def look(at: Job) -> float:
        got = eta.running_estimate(spool, at, time.time()).reading
        assert got is not None
        return got.step

    def kept_says(step: float) -> None:
        """A kept reading other than the log's: a look that shows it did not parse the log."""
        samples = spool.reports.read_samples(4)
        samples["log"]["reading"][0] = step
        spool.reports.write_samples(4, samples)

    kept_says(2.0)
    assert look(job) == 2.0  # unchanged: the kept reading, the log not parsed
    with open(log, "a") as out:
        out.write("Step 4/10\n")
    assert look(job) == 4.0  # written to since: read again
    kept_says(2.0)
    assert look(job) == 2.0
    samples = spool.reports.read_samples(4)
    samples["log"]["reading"] = ["not", "a reading"]
    spool.reports.write_samples(4, samples)
    assert look(job) == 4.0  # a damaged memo is no reading: the log is read
    kept_says(2.0)
    assert look(Job(job, cmd=["python", "train.py", "--num_train_epochs", "3"])) == 4.0


# ---- a real worker ---------------------------------------------------------------------------------
def test_status_and_eta_show_the_first_look_figure(gq) -> None:
    gq.script("once.py", "import time\ntime.sleep(2)\nprint('Step 30/300', flush=True)\ntime.sleep(60)\n")
    job_id = gq.add("once.py")
    gq.start_worker()

    def first_look():
        row = next(r for r in gq.status_json() if r["id"] == job_id)
        return row["eta_seconds"] is not None and row

    row = wait_for(first_look, 30, interval=0.3, what="an ETA from one sample")
    assert "elapsed x remaining / done (one sample so far)" in row["eta_method"], row
    assert 5 <= row["eta_seconds"] <= 400, row  # ~2-4 s for 30 steps: 270 left take ~18-36 s
    shown = gq.gpuq("eta", str(job_id)).stdout
    assert "one sample so far" in shown, shown
    assert os.path.exists(gq.home / "progress" / f"{job_id:06d}.samples.json")


# ---- the tail at the job's pace ------------------------------------------------------------------
def test_the_learned_tail_is_scaled_to_the_jobs_pace_beyond_the_runs_own_spread() -> None:
    """Earlier runs went 50 steps/s and took 1 s after their last step (50 steps' worth): a job
    going 10 steps/s on a busier machine gets 5 s, one going 45 steps/s their 1 s."""
    run = eta.Attempt(started=900.0, tail=1.0, tail_runs=3, tail_steps=50.0)
    points = [(900.0 + t, 10.0 * t) for t in range(0, 30, 3)]  # 10 steps/s
    slow = eta.estimate(reading(270, at=927.0), points, now=927.0, run=run)
    assert slow.eta_seconds == pytest.approx(3.0 + 5.0)
    assert "+ 5.0s after the last step (median of 3 earlier runs, 1.0s at their pace)" in slow.method
    near = [(900.0 + t, 45.0 * t) for t in range(0, 6)]  # 45 steps/s: within their own spread
    kept = eta.estimate(reading(225, total=450, at=905.0), near, now=905.0, run=run)
    assert kept.eta_seconds == pytest.approx(5.0 + 1.0) and "at their pace" not in kept.method
    ended = eta.estimate(reading(300, at=930.0), points + [(930.0, 300.0)], now=930.0, run=run)
    assert ended.eta_seconds == pytest.approx(5.0)  # finishing: at the pace it had before its last step
    assert eta.estimate(reading(270, at=927.0), points, now=927.0, run=eta.Attempt(900.0, 0.0, 1.0, 3)).eta_seconds == (
        pytest.approx(3.0 + 1.0)
    )  # a tail learned without the runs' pace stays as it was


def test_the_tail_in_steps_is_learned_with_the_runs_pace_and_kept(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool").ensure()
    here, now = str(tmp_path), time.time()
    for job_id, tail in ((1, 0.5), (2, 0.9), (3, 0.7)):
        finished_run(spool, job_id, here, tail, now - 1000 + job_id)  # 1 step/s before their last step
    job = schema.new_job(job_id=9, name="train", cmd=["python", "train.py"], cwd=here, log="")
    job.update(state="running", started_at=iso_of(now - 60))
    assert eta.learned_tail(eta.past_ends(spool, job, now - 60)) == (
        pytest.approx(0.7, abs=0.01),
        3,
        pytest.approx(0.7, abs=0.01),
    )
    run = eta.record(spool, job, reading(10, total=50, at=now - 10), [])[1]
    assert run.tail_steps == pytest.approx(0.7, abs=0.01)
    assert spool.reports.read_samples(9)["tail"]["steps"] == pytest.approx(0.7, abs=0.01)
    again = eta.attempt_of(spool, job, spool.reports.read_samples(9))  # from the samples, not learned again
    assert again.tail_steps == pytest.approx(0.7, abs=0.01) and again.tail_runs == 3
