"""PyTorch Lightning callback that reports progress to gpuq.

    from gpuq.integrations.lightning import GpuqProgressCallback
    trainer = L.Trainer(..., callbacks=[GpuqProgressCallback()])

Imports `lightning` (or the older `pytorch_lightning`); only scripts that use it import this module.
"""

from __future__ import annotations

import math
from typing import Any, Optional

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # Lightning 1.x / the pytorch_lightning distribution
    # the two distributions' Callback are the same class under two names; a checker sees two types
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment, unused-ignore]

from gpuq.integrations.report import ProgressWriter


def total_steps(trainer: Any) -> Optional[float]:
    """max_steps when set, else the optimizer steps Lightning expects for the whole fit."""
    if getattr(trainer, "max_steps", -1) and trainer.max_steps > 0:
        return float(trainer.max_steps)
    try:
        total = float(trainer.estimated_stepping_batches)
    except Exception:  # not computable (an iterable dataset without length): no total
        return None
    return total if math.isfinite(total) and total > 0 else None


class GpuqProgressCallback(Callback):
    """Writes `global_step` of the expected total after every training batch (rank 0 only)."""

    def __init__(self, path: Optional[str] = None, min_interval: float = 1.0):
        super().__init__()
        self.writer = ProgressWriter(path, min_interval)
        self._total: Optional[float] = None

    def _report(self, trainer: Any, force: bool) -> None:
        if self.writer.enabled and trainer.is_global_zero:
            self.writer.update(trainer.global_step, self._total, force=force, epoch=trainer.current_epoch)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._total = total_steps(trainer)
        self._report(trainer, force=True)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        self._report(trainer, force=False)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._report(trainer, force=True)
