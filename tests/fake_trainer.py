"""A stand-in for a training script, for the preemption tests (no ML libraries needed).

It prints `Step N/M` once per step, writes a checkpoint every K steps the way HF Trainer does
(`checkpoint-N/` with weights first and `trainer_state.json` last), and accepts
`--resume_from_checkpoint DIR` (both `--flag X` and `--flag=X`), or `ckpt_path=FILE` with
`--style epoch` (Lightning-like files `ckpts/model_epoch_N.pt`).

Options: --output_dir D  --max_steps M  --save_steps K  --step_time S (its own pace)
  --save_on_sigterm       on SIGTERM, save a checkpoint at the current step and exit 0
  --save_time S           such a save takes S seconds (a big model's), default 0
  --ignore_sigterm        the main process ignores SIGTERM (only SIGKILL stops it)
  --child_ignoring_sigterm  start a child in the same process group that ignores SIGTERM;
                          its pid goes to D/child.pid
  --style hf|epoch
  --fail_at N             exit 1 right after step N (a crash); with --fail_once only in the first run
                          in this output dir
  --partial_save_at N     at step N leave checkpoint-N/ cut short (weights, no trainer_state.json)
  --log_style steps|bar|none  what it prints per step: `Step N/M` (the default), HF Trainer's tqdm
                          bar (which a resumed run moves from 0 to its first step in one update, its
                          rate counting that jump, as tqdm's does), or nothing (--disable_tqdm)
  --save_bar              after each save, transformers 5's `Writing model shards` 0/1 then 1/1 bar
  --hold_on_resume F      a resumed run waits while the file F exists before its first step
Each run appends its first and last step to D/runs.txt ("start END" lines) for the tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def parse(argv: list[str]) -> dict:
    opts = {"output_dir": "out", "max_steps": 100, "save_steps": 10, "step_time": 0.05, "style": "hf"}
    opts.update(fail_at=0, partial_save_at=0, save_time=0.0, log_style="steps", hold_on_resume="")
    flags = {"save_on_sigterm", "ignore_sigterm", "child_ignoring_sigterm", "fail_once", "save_bar"}
    opts.update({f: False for f in flags})
    opts["resume"] = None
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("ckpt_path="):
            opts["resume"] = word.split("=", 1)[1]
        elif word.startswith("--resume_from_checkpoint"):
            if "=" in word:
                opts["resume"] = word.split("=", 1)[1]
            else:
                i += 1
                opts["resume"] = argv[i]
        elif word[2:] in flags:
            opts[word[2:]] = True
        elif word.startswith("--"):
            key, _, value = word[2:].partition("=")
            if not _:
                i += 1
                value = argv[i]
            kind = type(opts.get(key, ""))
            opts[key] = kind(value)
        i += 1
    return opts


def save(opts: dict, step: int) -> None:
    out = opts["output_dir"]
    if opts["style"] == "epoch":
        os.makedirs(os.path.join(out, "ckpts"), exist_ok=True)
        path = os.path.join(out, "ckpts", f"model_epoch_{step}.pt")
        with open(path + ".tmp", "w") as fh:
            json.dump({"global_step": step}, fh)
        os.replace(path + ".tmp", path)
        return
    path = os.path.join(out, f"checkpoint-{step}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model.safetensors"), "w") as fh:
        fh.write("weights")
    with open(os.path.join(path, "trainer_state.json"), "w") as fh:  # last: marks it complete
        json.dump({"global_step": step}, fh)


SAVE_BAR = (
    "\rWriting model shards:   0%|          | 0/1 [00:00<?, ?it/s]"
    "\rWriting model shards: 100%|##########| 1/1 [00:00<00:00, 287.08it/s]\n"
)


def clock(seconds: float) -> str:
    return f"{int(seconds) // 60:02d}:{int(seconds) % 60:02d}"


class Bar:
    """HF Trainer's training bar: tqdm(total=M) updated by the steps done since its last update, so
    a resumed run's first update jumps from 0 to the step after its checkpoint; the rate is tqdm's,
    counted from the bar's start."""

    def __init__(self, total: int):
        self.total, self.started = total, time.time()
        self.draw(0)

    def draw(self, step: int) -> None:
        spent = time.time() - self.started
        rate = step / spent if step and spent > 0 else 0.0
        left = clock((self.total - step) / rate) if rate else "?"
        shown = f"{rate:.2f}it/s" if rate else "?it/s"
        pct = 100 * step // self.total
        sys.stdout.write(f"\r{pct:3d}%|          | {step}/{self.total} [{clock(spent)}<{left}, {shown}]")
        sys.stdout.flush()


def report_step(opts: dict, bar: Bar | None, step: int) -> None:
    if bar is not None:
        bar.draw(step)
    elif opts["log_style"] == "steps":
        print(f"Step {step}/{opts['max_steps']}", flush=True)


def start_step(opts: dict) -> int:
    path = opts["resume"]
    if not path:
        return 0
    state = os.path.join(path, "trainer_state.json") if os.path.isdir(path) else path
    with open(state) as fh:
        return int(json.load(fh)["global_step"])


def crash_now(opts: dict) -> bool:
    marker = os.path.join(opts["output_dir"], "crashed-once")
    if opts["fail_once"] and os.path.exists(marker):
        return False
    open(marker, "w").close()
    return True


def main() -> int:
    opts = parse(sys.argv[1:])
    os.makedirs(opts["output_dir"], exist_ok=True)
    stop = {"requested": False}
    if opts["ignore_sigterm"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif opts["save_on_sigterm"]:
        signal.signal(signal.SIGTERM, lambda *_: stop.update(requested=True))
    if opts["child_ignoring_sigterm"]:
        code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(300)"
        child = subprocess.Popen([sys.executable, "-c", code])
        with open(os.path.join(opts["output_dir"], "child.pid"), "w") as fh:
            fh.write(str(child.pid))
    first = start_step(opts)
    print(f"Resumed from step {first}" if first else "Starting from scratch", flush=True)
    while first and opts["hold_on_resume"] and os.path.exists(opts["hold_on_resume"]):
        time.sleep(0.02)
    bar = Bar(opts["max_steps"]) if opts["log_style"] == "bar" else None
    step = first
    for step in range(first + 1, opts["max_steps"] + 1):
        time.sleep(opts["step_time"])
        report_step(opts, bar, step)
        if step % opts["save_steps"] == 0:
            save(opts, step)
            if opts["save_bar"]:
                sys.stdout.write(SAVE_BAR)
                sys.stdout.flush()
        if step == opts["partial_save_at"]:
            os.makedirs(os.path.join(opts["output_dir"], f"checkpoint-{step}"), exist_ok=True)
            with open(os.path.join(opts["output_dir"], f"checkpoint-{step}", "model.safetensors"), "w") as fh:
                fh.write("half")
        if step == opts["fail_at"] and crash_now(opts):
            with open(os.path.join(opts["output_dir"], "runs.txt"), "a") as fh:
                fh.write(f"{first} {step} crashed\n")
            print(f"crashed at step {step}", flush=True)
            return 1
        if stop["requested"]:
            time.sleep(opts["save_time"])
            save(opts, step)
            print(f"SIGTERM: saved checkpoint at step {step}", flush=True)
            break
    with open(os.path.join(opts["output_dir"], "runs.txt"), "a") as fh:
        fh.write(f"{first} {step}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
