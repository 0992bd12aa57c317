"""Progress reporting for training scripts (README, "Progress and ETA"): `hf.GpuqProgressCallback`,
`lightning.GpuqProgressCallback`, or `ProgressWriter().update(step, total)` for anything else.
They write the file named by GPUQ_PROGRESS_FILE, which gpuq sets for every job; outside gpuq they do
nothing. This package imports neither transformers nor lightning: only the module you pick does.
"""

from gpuq.integrations.report import ProgressWriter

__all__ = ["ProgressWriter"]
