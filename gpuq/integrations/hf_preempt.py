"""Save a checkpoint and stop when gpuq preempts a Hugging Face Trainer run:
`Trainer(..., callbacks=[GpuqPreemptCallback()])`, active under `--preemptible` (GPUQ_PREEMPTIBLE=1)
or with `always=True`. On SIGTERM the step in flight finishes, then the Trainer saves and stops. The
handler is installed when training begins, after the Trainer's own (transformers >= 5's
`--enable_jit_checkpoint`, which may lose the step in flight), so it is the one that answers.
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
