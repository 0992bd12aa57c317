"""Real training runs as gpuq jobs, with gpuq's callbacks: a Hugging Face Trainer on a tiny randomly
initialised GPT-2 (no downloads), and a tiny Lightning fit, both on the CPU. Their progress must
reach `gpuq status --json`.

Needs the `hf` extra (torch CPU build, transformers, accelerate) and, for the second test,
`lightning`; each test is skipped when its packages are missing. Importing gpuq.integrations
must not import either framework: checked here without them.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, wait_for

from gpuq.engine.tracking import progress
from gpuq.spool import Spool

STEPS = 120
TRAIN = """
import sys, time
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from gpuq.integrations.hf import GpuqProgressCallback


class Pace(TrainerCallback):
    # keeps the run long enough to be looked at while it runs, on a fast machine too
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.05)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
args = TrainingArguments(
    output_dir="out", max_steps=int(sys.argv[1]), per_device_train_batch_size=4, logging_steps=20,
    save_strategy="no", report_to="none", use_cpu=True, dataloader_num_workers=0,
)
trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[GpuqProgressCallback(), Pace()])
trainer.train()
"""


def run_until_reported(gq, job_id: int) -> dict:
    """Poll status --json until the job's own progress report shows, mid-run, with an ETA."""

    def mid_run():
        row = next(r for r in gq.status_json() if r["id"] == job_id)
        assert row["state"] in ("pending", "running"), (row, gq.log(job_id)[-3000:])
        ok = row["progress_source"] == "reported" and 0 < (row["progress"] or 0) < 1
        return ok and row["eta_seconds"] is not None and row

    return wait_for(mid_run, 90, interval=0.2, what="the callback's progress in status --json")


def wait_end(gq, job_id: int) -> str:
    def ended():
        state = next(r for r in gq.status_json() if r["id"] == job_id)["state"]
        return state not in ("pending", "running") and state

    return wait_for(ended, 120, interval=0.2, what="the run to end")


def test_integrations_import_no_framework() -> None:
    code = (
        "import sys, gpuq.integrations\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'lightning')]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_trainer_callback_progress_reaches_status_json(gq) -> None:
    for module in ("torch", "transformers", "accelerate"):
        pytest.importorskip(module)
    gq.script("train.py", TRAIN)
    # the test's own interpreter runs the job: it is the one that has the hf extra installed
    env = ["-p", sys.executable, "-e", f"PYTHONPATH={REPO}", "-e", "HF_HUB_OFFLINE=1", "-e", "OMP_NUM_THREADS=1"]
    job_id = gq.add(*env, "train.py", str(STEPS))
    gq.start_worker()

    row = run_until_reported(gq, job_id)
    assert "reported (progress file)" in row["eta_method"] and "steps/s" in row["eta_method"]
    assert "%" in gq.gpuq("status").stdout

    assert wait_end(gq, job_id) == "done", gq.log(job_id)[-3000:]
    report, _mtime = Spool(gq.home).reports.read_progress(job_id)
    assert (report["step"], report["total"]) == (STEPS, STEPS)
    # the real Trainer log (tqdm \r bars and logged dicts) is understood too
    reading = progress.from_log_text(gq.log(job_id), at=0.0)
    assert reading is not None and reading.fraction == 1.0


FIT = """
import sys, time
import torch
import lightning as L
from gpuq.integrations.lightning import GpuqProgressCallback


class Pace(L.Callback):
    def on_train_batch_end(self, *args, **kwargs):
        time.sleep(0.05)


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = L.Trainer(max_epochs=int(sys.argv[1]), accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, callbacks=[GpuqProgressCallback(), Pace()])
trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
"""


def test_lightning_callback_progress_reaches_status_json(gq) -> None:
    for module in ("torch", "lightning"):
        pytest.importorskip(module)
    gq.script("fit.py", FIT)
    job_id = gq.add("-p", sys.executable, "-e", f"PYTHONPATH={REPO}", "-e", "OMP_NUM_THREADS=1", "fit.py", "6")
    gq.start_worker()
    row = run_until_reported(gq, job_id)
    assert "steps/s" in row["eta_method"]
    assert wait_end(gq, job_id) == "done", gq.log(job_id)[-3000:]
    report, _mtime = Spool(gq.home).reports.read_progress(job_id)
    assert report["step"] == report["total"] == 6 * 16  # 64 samples in batches of 4, 6 epochs
