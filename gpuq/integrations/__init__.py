"""Progress reporting for training scripts, in one line, for `gpuq status` / `gpuq eta`.

    from gpuq.integrations.hf import GpuqProgressCallback          # Hugging Face Trainer
    trainer = Trainer(..., callbacks=[GpuqProgressCallback()])

    from gpuq.integrations.lightning import GpuqProgressCallback   # PyTorch Lightning
    trainer = L.Trainer(..., callbacks=[GpuqProgressCallback()])

    from gpuq.integrations import ProgressWriter                    # anything else
    progress = ProgressWriter()
    progress.update(step, total)

They write the file named by GPUQ_PROGRESS_FILE, which gpuq sets for every job it starts; outside
gpuq they do nothing. This package imports neither transformers nor lightning: only the module
you pick does, and neither is a dependency of gpuq.
"""

from gpuq.integrations.report import ProgressWriter

__all__ = ["ProgressWriter"]
