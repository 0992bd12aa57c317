"""Save a checkpoint and stop when gpuq preempts a Hugging Face Trainer run (any transformers).

    from gpuq.integrations.hf_preempt import GpuqPreemptCallback
    trainer = Trainer(model=..., args=..., callbacks=[GpuqPreemptCallback()])

Active when the job was queued with `gpuq add --preemptible` (gpuq then sets GPUQ_PREEMPTIBLE=1),
or always when built with `always=True`. On SIGTERM it lets the step in flight finish, has the
Trainer save `checkpoint-<global step>` the normal way (trainer_state.json last, so gpuq sees a
complete checkpoint) and stops training, so the script exits 0 and no step is lost.

transformers >= 5 has a built-in equivalent (`--enable_jit_checkpoint true`, which `--preemptible`
adds): it waits 3 s after SIGTERM and can save before the optimizer update of the step in flight,
losing that one step. When both are present this callback's handler, installed when training
begins (after the Trainer installed its own), is the one that answers SIGTERM.
Imports transformers (only scripts that use it import this module).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from transformers import TrainerCallback

ENV_VAR = "GPUQ_PREEMPTIBLE"


class GpuqPreemptCallback(TrainerCallback):
    def __init__(self, always: bool = False):
        self.active = always or os.environ.get(ENV_VAR) == "1"
        self.requested = False
        self._previous: Any = None

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.requested = True  # acted on at the end of the current step, never inside it

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # signal handlers can only be installed from the main thread
        if self.active and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.requested:
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
