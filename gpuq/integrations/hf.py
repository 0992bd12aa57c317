"""Hugging Face `transformers` Trainer callback that reports progress to gpuq.

    from gpuq.integrations.hf import GpuqProgressCallback
    trainer = Trainer(model=..., args=..., callbacks=[GpuqProgressCallback()])

Imports transformers (this module is only imported by scripts that use it).
"""

from __future__ import annotations

from typing import Any, Optional

from transformers import TrainerCallback

from gpuq.integrations.report import ProgressWriter


class GpuqProgressCallback(TrainerCallback):
    """Writes `global_step` / `max_steps` (and the epoch) after every optimizer step; only the
    main process writes under torchrun/accelerate."""

    def __init__(self, path: Optional[str] = None, min_interval: float = 1.0):
        self.writer = ProgressWriter(path, min_interval)

    def _report(self, state: Any, force: bool) -> None:
        if self.writer.enabled and state.is_world_process_zero:
            total = state.max_steps if state.max_steps and state.max_steps > 0 else None
            self.writer.update(state.global_step, total, force=force, epoch=state.epoch)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._report(state, force=False)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._report(state, force=True)

    on_save = on_train_end = on_train_begin  # written at once, whatever the interval
