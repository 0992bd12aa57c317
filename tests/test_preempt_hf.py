"""Preempt and resume a real Hugging Face Trainer run (tiny random GPT-2 on CPU, no downloads).

Skipped when transformers (and torch) are not importable; CI installs them (the `hf` extra).
"""

from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import REPO, wait_for

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HF_MAJOR = int(transformers.__version__.split(".")[0])

TRAIN = r'''
import os, sys, time
import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainerCallback, TrainingArguments

args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16))


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class Pace(TrainerCallback):
    """Logs each step like many training scripts do, and slows the run down enough to preempt."""

    def on_step_end(self, args, state, control, **kwargs):
        print(f"Step {state.global_step}/{state.max_steps}", flush=True)
        time.sleep(0.1)


callbacks = [Pace()]
if os.environ.get("USE_GPUQ_CALLBACK") == "1":
    from gpuq.integrations.hf_preempt import GpuqPreemptCallback

    callbacks.append(GpuqPreemptCallback())
trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=callbacks)
trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
print(f"finished at global step {trainer.state.global_step}", flush=True)
'''

COMMON = ["--per_device_train_batch_size", "2", "--report_to", "none", "--use_cpu", "true", "--logging_steps", "1000"]


def attempt_steps(log: str) -> list[list[int]]:
    """The `Step N/M` numbers printed by each attempt (the supervisor heads each with a line)."""
    parts = log.split("=== gpuq: job #")[1:]
    return [[int(n) for n in re.findall(r"Step (\d+)/", part)] for part in parts]


def state_of(gq, job_id: int) -> object:
    found = [
        s
        for s in ("pending", "running", "done", "failed", "preempted")
        if any(n.startswith(f"{job_id:06d}-") for n in gq.files(s))
    ]
    return found[0] if len(found) == 1 else None


def run_preempt_resume(
    gq, extra_add: tuple, save_steps: int, max_steps: int, preempt_at: int
) -> tuple[dict, dict, list[list[int]]]:
    (gq.work / "train.py").write_text(TRAIN)
    gq.env.update(
        PYTHONPATH=str(REPO),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
    )
    jid = gq.add(
        *extra_add,
        "-p",
        sys.executable,
        "train.py",
        "--output_dir",
        "out",
        "--max_steps",
        str(max_steps),
        "--save_steps",
        str(save_steps),
        *COMMON,
    )
    gq.start_worker("--watch")

    def steps_now() -> int:
        attempts = attempt_steps(gq.log(jid))
        return attempts[-1][-1] if attempts and attempts[-1] else 0

    wait_for(lambda: steps_now() >= preempt_at, 120, interval=0.1, what=f"step {preempt_at}")
    gq.gpuq("preempt", str(jid), timeout=120)
    wait_for(lambda: state_of(gq, jid) == "preempted", 30, what="preempted")
    preempted = gq.job(jid)
    gq.gpuq("resume", str(jid))
    wait_for(lambda: state_of(gq, jid) in ("done", "failed"), 180, interval=0.2, what="the resumed run to end")
    return preempted, gq.job(jid), attempt_steps(gq.log(jid))


def test_hf_trainer_preempt_loses_steps_since_last_save_and_resumes(gq) -> None:
    preempted, final, attempts = run_preempt_resume(gq, (), save_steps=10, max_steps=40, preempt_at=13)
    record = preempted["preemptions"][-1]
    assert preempted["exit_code"] == 143  # HF Trainer dies at once on SIGTERM without JIT
    ckpt = record["checkpoint_step"]
    assert ckpt is not None and ckpt % 10 == 0 and ckpt >= 10
    assert record["lost_steps"] == record["last_step"] - ckpt > 0
    assert final["state"] == "done", final.get("note")
    # The resumed run starts from the checkpoint's global step and reaches max_steps.
    assert attempts[-1][0] == ckpt + 1 and attempts[-1][-1] == 40
    assert "finished at global step 40" in gq.log(final["id"])
    assert final["resumed_from"] == str(gq.work / "out" / f"checkpoint-{ckpt}")
    state = json.loads((gq.work / "out" / "checkpoint-40" / "trainer_state.json").read_text())
    assert state["global_step"] == 40


@pytest.mark.skipif(HF_MAJOR < 5, reason="JIT checkpointing needs transformers >= 5")
def test_hf_trainer_preemptible_loses_no_steps(gq) -> None:
    # save_steps beyond max_steps: the only checkpoint before the end can be the one saved on SIGTERM
    preempted, final, attempts = run_preempt_resume(gq, ("--preemptible",), save_steps=1000, max_steps=80, preempt_at=8)
    assert preempted["cmd"][-2:] == ["--enable_jit_checkpoint", "true"]
    assert preempted["env"].get("GPUQ_PREEMPTIBLE") == "1"
    record = preempted["preemptions"][-1]
    assert preempted["exit_code"] == 0  # saved, then stopped cleanly
    ckpt = record["checkpoint_step"]
    assert ckpt is not None and 8 <= ckpt < 80
    # HF's JIT save runs at the next step boundary, 3 s after SIGTERM: nothing before it is lost. When
    # the request lands during a step's backward pass it saves before that step's optimizer update, the
    # step completes, and that one step is not in the checkpoint: gpuq reports 0 or 1 honestly.
    assert record["lost_steps"] == record["last_step"] - ckpt == attempts[0][-1] - ckpt
    assert record["lost_steps"] in (0, 1)
    state = json.loads((gq.work / "out" / f"checkpoint-{ckpt}" / "trainer_state.json").read_text())
    assert state["global_step"] == ckpt
    assert final["state"] == "done", final.get("note")
    assert attempts[-1][0] == ckpt + 1 and attempts[-1][-1] == 80


def test_hf_trainer_with_gpuq_preempt_callback_loses_nothing(gq) -> None:
    """The callback for any transformers version: saves after the step in flight, at once."""
    opts = ("--preemptible", "-e", "USE_GPUQ_CALLBACK=1")
    preempted, final, attempts = run_preempt_resume(gq, opts, save_steps=1000, max_steps=40, preempt_at=8)
    record = preempted["preemptions"][-1]
    assert preempted["exit_code"] == 0
    ckpt = record["checkpoint_step"]
    assert ckpt is not None and 8 <= ckpt < 40
    assert record["lost_steps"] == 0 and record["last_step"] == attempts[0][-1] == ckpt
    state = json.loads((gq.work / "out" / f"checkpoint-{ckpt}" / "trainer_state.json").read_text())
    assert state["global_step"] == ckpt
    assert final["state"] == "done", final.get("note")
    assert attempts[-1][0] == ckpt + 1 and attempts[-1][-1] == 40


def test_hf_trainer_killed_with_its_supervisor_continues_from_its_own_checkpoint(gq) -> None:
    """Issue 13's reboot case with a real Trainer: the job and its supervisor die at once; `gpuq
    recover` continues it from its newest complete checkpoint, not from one a crash cut short and
    not from a stale checkpoint an earlier run left in the same output directory."""
    import os
    import signal
    import time

    stale = gq.work / "out" / "checkpoint-35"  # an earlier run's, an hour old: loading it would fail
    stale.mkdir(parents=True)
    (stale / "trainer_state.json").write_text('{"global_step": 35}')
    old = time.time() - 3600
    os.utime(stale / "trainer_state.json", (old, old))
    os.utime(stale, (old, old))
    (gq.work / "train.py").write_text(TRAIN)
    gq.env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    args = ["--output_dir", "out", "--max_steps", "40", "--save_steps", "10", *COMMON]
    jid = gq.add("-p", sys.executable, "train.py", *args)
    worker = gq.start_worker("--watch")

    def steps_now() -> int:
        attempts = attempt_steps(gq.log(jid))
        return attempts[-1][-1] if attempts and attempts[-1] else 0

    wait_for(lambda: steps_now() >= 23 and gq.job(jid).get("supervisor"), 120, interval=0.1, what="step 23")
    worker.send_signal(signal.SIGTERM)
    worker.wait(15)
    job = gq.job(jid)
    os.kill(job["supervisor"]["pid"], signal.SIGKILL)
    os.killpg(job["pid"], signal.SIGKILL)
    cut = gq.work / "out" / "checkpoint-30"  # as if it died while saving: weights, no trainer_state.json
    cut.mkdir()
    (cut / "model.safetensors").write_bytes(b"half")
    wait_for(lambda: gq.gpuq("status") and gq.state_of(jid) == "interrupted", 30, what="the job to be interrupted")
    out = gq.gpuq("recover", "--all").stdout
    assert "continues from checkpoint-20" in out
    gq.gpuq("run", timeout=240)
    final = gq.job(jid)
    assert final["state"] == "done", gq.log(jid)[-2000:]
    attempts = attempt_steps(gq.log(jid))
    assert attempts[-1][0] == 21 and attempts[-1][-1] == 40
    assert "finished at global step 40" in gq.log(jid)
    assert final["history"][-1]["resumed_from"] == str(gq.work / "out" / "checkpoint-20")
