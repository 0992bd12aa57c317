"""Whether there can be GPUs to look at here, in two stats and without importing system/gpus.py:
`gpuq status` on a machine without GPUs (and without a worker's view of them) asks only this."""

from __future__ import annotations

import os

FAKE_ENV = "GPUQ_FAKE_GPUS"  # names a JSON file of simulated GPUs (system/gpus.py)
# Present whenever the NVIDIA kernel driver is loaded, inside containers given the GPUs too.
NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"
WSL_GPU_DEVICE = "/dev/dxg"  # WSL2 reaches the Windows driver through this, without /dev/nvidiactl


def may_have_gpus() -> bool:
    """False when a look at the GPUs could only say "no NVIDIA driver here" (system/gpus.look)."""
    return bool(os.environ.get(FAKE_ENV)) or os.path.exists(NVIDIA_CONTROL_DEVICE) or os.path.exists(WSL_GPU_DEVICE)
