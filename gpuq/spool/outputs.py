"""What jobs wrote (log tails, progress files), gpuq's progress samples, and derived caches."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Optional


class OutputsMixin:
    # ---- reading what a job wrote (preemption: how far did it get?) ---------------------------
    def log_tail_bytes(self, job_id: int, limit: int = 65536) -> bytes:
        """The last `limit` bytes of a job's log (b"" if none); cost does not grow with the log."""
        try:
            fd = os.open(self.log_path(job_id), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return b""
        try:
            size = os.fstat(fd).st_size
            return os.pread(fd, min(limit, size), max(0, size - limit))
        finally:
            os.close(fd)

    def read_progress(self, job_id: int) -> Optional[tuple[dict[str, Any], float]]:
        """(contents, mtime) of the progress file a job may write via GPUQ_PROGRESS_FILE."""
        path = self.progress_path(job_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            data = json.loads(os.read(fd, 65536))
            mtime = os.fstat(fd).st_mtime
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        return (data, mtime) if isinstance(data, dict) else None

    # ---- progress and ETA (see "Progress and ETA" in spool_layout.md) ------------------------
    def job_log_tail(self, job: dict[str, Any], limit: int = 65536) -> tuple[bytes, float]:
        """The last `limit` bytes of a job's log and the log's mtime ((b"", 0.0) if none). An
        adopted job's log is the file it writes itself (its `log` field); others have ours."""
        path = Path(job["log"]) if job.get("adopted") and job.get("log") else self.log_path(job["id"])
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return b"", 0.0
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return b"", 0.0
            return os.pread(fd, min(limit, st.st_size), max(0, st.st_size - limit)), st.st_mtime
        finally:
            os.close(fd)

    def samples_path(self, job_id: int) -> Path:
        return self.home / "progress" / f"{job_id:06d}.samples.json"

    def read_samples(self, job_id: int) -> dict[str, Any]:
        """The progress samples recorded by earlier looks at a job ({} if none or unreadable)."""
        try:
            fd = os.open(self.samples_path(job_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return {}
        try:
            data = json.loads(os.read(fd, 1 << 20))
        except (OSError, ValueError):
            return {}
        finally:
            os.close(fd)
        return data if isinstance(data, dict) else {}

    def write_samples(self, job_id: int, samples: dict[str, Any]) -> None:
        """Replace a job's samples file atomically. Two lookers at once may each drop the other's
        newest sample; that costs a little precision, never a wrong value. Not fsynced: losing
        samples in a power cut only delays the next ETA."""
        path = self._tmp_path("samples")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, json.dumps(samples, separators=(",", ":")).encode())
        finally:
            os.close(fd)
        os.replace(path, self.samples_path(job_id))

    # ---- caches (derived data, always rebuildable: see "Caches" in spool_layout.md) ---------
    def dir_signature(self, state: str) -> Optional[tuple[int, int, float]]:
        """(inode, mtime_ns, mtime) of a state directory: it changes whenever a file is added,
        removed or replaced there. None if it is missing."""
        try:
            st = os.stat(self.home / state, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_mtime

    def file_signatures(self, state: str, names: list[str]) -> dict[str, tuple[int, int, int]]:
        """name -> (inode, mtime_ns, size) of job files in `state`; vanished ones are left out."""
        directory, out = os.fspath(self.home / state), {}
        for name in names:
            try:
                st = os.stat(os.path.join(directory, name), follow_symlinks=False)
            except FileNotFoundError:
                continue
            out[name] = (st.st_ino, st.st_mtime_ns, st.st_size)
        return out

    def read_cache(self, name: str) -> Optional[bytes]:
        """A cache file (cache/NAME) if it is a regular file of ours, else None."""
        try:
            fd = os.open(self.home / "cache" / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return None
            chunks = []
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
        finally:
            os.close(fd)

    def write_cache(self, name: str, data: bytes) -> None:
        """Replace cache/NAME atomically. Not fsynced: a cache lost in a power cut is rebuilt."""
        path = self._tmp_path("cache")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        os.replace(path, self.home / "cache" / name)
