"""Progress as jobs report it (progress/NNNNNN.json, written by the job at GPUQ_PROGRESS_FILE) and
gpuq's own samples of it over time (progress/NNNNNN.samples.json), read by the ETA."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from gpuq.spool.files import Files, open_regular, read_object, remove_counting
from gpuq.spool.layout import Layout


class Reports:
    def __init__(self, layout: Layout, files: Files):
        self.layout, self.files = layout, files

    def progress_path(self, job_id: int) -> str:
        """Given to the job as GPUQ_PROGRESS_FILE: the job writes it, gpuq only reads it."""
        return self.layout.progress_path(job_id)

    def read_progress(self, job_id: int) -> Optional[tuple[dict[str, Any], float]]:
        fd = open_regular(self.layout.progress_path(job_id))
        if fd is None:
            return None
        try:
            data = json.loads(os.read(fd, 65536))
            mtime = os.fstat(fd).st_mtime
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        return (data, mtime) if isinstance(data, dict) else None

    def read_samples(self, job_id: int) -> dict[str, Any]:
        """The progress samples recorded by earlier looks at a job ({} if none or unreadable)."""
        return read_object(self.layout.samples_path(job_id)) or {}

    def write_samples(self, job_id: int, samples: dict[str, Any]) -> None:
        """Not fsynced: samples lost in a power cut only delay the next ETA. Two lookers at once may
        each drop the other's newest sample: a little precision, never a wrong value."""
        data = json.dumps(samples, separators=(",", ":")).encode()
        self.files.replace(self.layout.samples_path(job_id), data, "samples", durable=False)

    def read_gpu_use(self, job_id: int) -> dict[str, Any]:
        """What the job's GPUs did, per attempt (engine/tracking/gpuuse.py; {} if none or unreadable)."""
        return read_object(self.layout.gpu_use_path(job_id)) or {}

    def gpu_use_ids(self) -> set[int]:
        """The jobs that have a GPU record: one listing, so that `history` over thousands of jobs
        opens only the records there are."""
        suffix = os.path.basename(self.layout.gpu_use_path(0))[6:]
        try:
            names = os.listdir(os.path.dirname(self.layout.gpu_use_path(0)))
        except OSError:
            return set()
        stems = (n[: -len(suffix)] for n in names if n.endswith(suffix))
        return {int(stem) for stem in stems if len(stem) >= 6 and stem.isascii() and stem.isdecimal()}

    def write_gpu_use(self, job_id: int, record: dict[str, Any]) -> None:
        """Written by the job's supervisor only; not fsynced: losing it costs only figures."""
        data = json.dumps(record, separators=(",", ":")).encode()
        self.files.replace(self.layout.gpu_use_path(job_id), data, "gpu-use", durable=False)

    def delete_progress(self, job_id: int) -> int:
        """Remove the progress file the job wrote (not gpuq's samples of it); the bytes that frees."""
        return remove_counting(self.layout.progress_path(job_id))

    def delete(self, job_id: int) -> int:
        paths = (self.layout.progress_path(job_id), self.layout.samples_path(job_id), self.layout.gpu_use_path(job_id))
        return sum(remove_counting(path) for path in paths)
