"""Which checkpoints are a running attempt's progress (engine/tracking/progress.py): those it wrote
or resumed from, never the last checkpoint an earlier run left in the same output directory. Real
runs of an HF-style script (checkpoint-N/ with trainer_state.json last), a real worker, no torch."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from conftest import Env, wait_for

FAKE = Path(__file__).with_name("fake_trainer.py")

# Logs no steps (its checkpoints are its only progress); before training, and again after its
# first checkpoint, it waits while the test's file `hold` (then `hold10`) exists: the job's own
# pace, set by the test.
TRAIN = """import json, os, sys, time
out = sys.argv[sys.argv.index('--output_dir') + 1]
steps = int(sys.argv[sys.argv.index('--max_steps') + 1])
first = 0
if '--resume_from_checkpoint' in sys.argv:
    with open(os.path.join(sys.argv[sys.argv.index('--resume_from_checkpoint') + 1], 'trainer_state.json')) as fh:
        first = json.load(fh)['global_step']
print('loading the model', flush=True)
while os.path.exists('hold'):
    time.sleep(0.02)
for step in range(first + 1, steps + 1):
    time.sleep(0.02)
    if step % 10 == 0:
        path = os.path.join(out, f'checkpoint-{step}')
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, 'model.safetensors'), 'w') as fh:
            fh.write('weights')
        with open(os.path.join(path, 'trainer_state.json'), 'w') as fh:
            json.dump({'global_step': step, 'max_steps': steps}, fh)
        while step == 10 and os.path.exists('hold10'):
            time.sleep(0.02)
"""
CMD = ("train.py", "--output_dir", "out", "--max_steps", "20")


def row(gq: Env, job_id: int) -> dict[str, Any]:
    return next(r for r in gq.status_json() if r["id"] == job_id)


def test_a_new_run_does_not_take_the_last_runs_checkpoint_as_its_progress(gq: Env) -> None:
    gq.script("train.py", TRAIN)
    gq.start_worker("--watch")
    first = gq.add(*CMD)
    gq.wait_state(first, "done", timeout=30)
    assert (gq.work / "out" / "checkpoint-20" / "trainer_state.json").exists()  # the first run's end

    for name in ("hold", "hold10"):
        (gq.work / name).write_text("")
    second = gq.add(*CMD)  # the same command in the same directory
    gq.wait_state(second, "running")
    wait_for(lambda: "loading the model" in gq.log(second), 15, what="the second run to load")
    looked = row(gq, second)  # its first looks: nothing of its own yet
    assert looked["progress"] is None and looked["eta_seconds"] is None, looked
    assert "checkpoint-20" not in looked["eta_method"] and looked["progress_source"] is None, looked

    (gq.work / "hold").unlink()  # it trains, writes its own checkpoint-10 and waits there
    own = wait_for(lambda: (r := row(gq, second))["progress"] is not None and r, 15, what="its own checkpoint")
    assert own["progress"] == 0.5 and own["progress_source"] == "checkpoint", own
    assert "checkpoint-10" in own["eta_method"], own
    (gq.work / "hold10").unlink()
    gq.wait_state(second, "done", timeout=30)


def test_the_checkpoint_a_run_resumed_from_is_its_progress(gq: Env) -> None:
    gq.script("train.py", TRAIN)
    gq.start_worker("--watch")
    gq.wait_state(gq.add(*CMD), "done", timeout=30)  # leaves checkpoint-10 and checkpoint-20
    (gq.work / "hold").write_text("")
    resumed = gq.add(*CMD, "--resume_from_checkpoint", "out/checkpoint-10")
    gq.wait_state(resumed, "running")
    wait_for(lambda: "loading the model" in gq.log(resumed), 15, what="the resumed run to load")
    looked = row(gq, resumed)  # where it starts from, not the newer checkpoint-20 beside it
    assert looked["progress"] == 0.5 and "checkpoint-10" in looked["eta_method"], looked
    (gq.work / "hold").unlink()
    gq.wait_state(resumed, "done", timeout=30)


def test_a_save_bar_is_not_the_progress_of_a_training_that_draws_no_bar(gq: Env) -> None:
    """HF Trainer with --disable_tqdm true: its log's only counter is transformers 5's save bar, 0/1
    then 1/1 at every save. Its checkpoints are its progress, and a preemption does not take the
    bar's 1 for the last step it reached."""
    shutil.copy(FAKE, gq.work / "fake_trainer.py")
    args = ("--output_dir", "out", "--max_steps", "400", "--save_steps", "10", "--step_time", "0.05")
    job = gq.add("-p", sys.executable, "fake_trainer.py", *args, "--log_style", "none", "--save_bar")
    gq.start_worker("--watch")

    def saved() -> Any:
        return "Writing model shards: 100%" in gq.log(job) and (r := row(gq, job))["progress"] is not None and r

    looked = wait_for(saved, 30, interval=0.1, what="its first save")
    assert looked["progress_source"] == "checkpoint" and looked["progress"] < 1, looked
    assert looked["progress"] * 400 % 10 == 0 and "checkpoint-" in looked["eta_method"], looked
    gq.gpuq("preempt", str(job))
    record = gq.wait_state(job, "preempted")["preemptions"][-1]
    assert record["last_step"] is None and record["lost_steps"] is None, record  # unknown, not "1"
