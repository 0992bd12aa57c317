"""`gpuq add --preemptible` for Hugging Face Trainer runs: which flag makes the job save when
preempted, decided from the transformers version of the job's own Python."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from typing import Optional

from gpuq.engine.tracking import checkpoints

HF_JIT_FLAG = "--enable_jit_checkpoint"
PREEMPTIBLE_ENV = "GPUQ_PREEMPTIBLE"  # read by CALLBACK: save on SIGTERM
CALLBACK = "gpuq.integrations.hf_preempt.GpuqPreemptCallback"


def make_preemptible(cmd: list[str], venv: Optional[str]) -> tuple[list[str], str]:
    """The command with HF's JIT checkpoint flag when it looks like an HF Trainer run (has
    --output_dir) and the job's Python has transformers >= 5; plus a line for the user."""
    if checkpoints.output_dir(cmd, "/") is None:
        return cmd, "no --output_dir: not an HF Trainer command line; the job must save on SIGTERM itself"
    if any(w == HF_JIT_FLAG or w.startswith(HF_JIT_FLAG + "=") for w in cmd):
        return cmd, f"{HF_JIT_FLAG} already given"
    version = transformers_version(_job_python(cmd, venv))
    if version is None:
        return cmd, f"transformers not found for the job's Python; the script must save on SIGTERM ({CALLBACK})"
    if int(version.split(".")[0]) < 5:
        return cmd, f"transformers {version} has no JIT checkpoint: add {CALLBACK} to the Trainer"
    return cmd + [HF_JIT_FLAG, "true"], f"transformers {version}: added {HF_JIT_FLAG} true"


def _job_python(cmd: list[str], venv: Optional[str]) -> Optional[str]:
    if os.path.basename(cmd[0]).startswith("python"):
        return cmd[0]
    if venv and os.path.exists(os.path.join(venv, "bin", "python")):
        return os.path.join(venv, "bin", "python")
    return shutil.which("python3") or shutil.which("python")


@functools.lru_cache(maxsize=8)  # a sweep's jobs share their interpreter: one probe for all
def transformers_version(python: Optional[str]) -> Optional[str]:
    """The version of transformers installed for `python` (metadata only: no import of it)."""
    if not python:
        return None
    probe = "import importlib.metadata as m\ntry: print(m.version('transformers'))\nexcept Exception: pass"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    return text if re.match(r"^\d+\.", text) else None
