"""What a supervisor is told: one typed message, the same for every start (spool_layout.md, section 6),
sent as one JSON line with the claim's descriptor.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, Optional


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


_number = _opt(lambda v: is_int(v) or isinstance(v, float))
_text = _opt(lambda v: isinstance(v, str))


@dataclass(frozen=True)
class StartOrder:
    id: int  # the job
    file: Optional[str]  # its file name in pending/ (None: the supervisor looks for it)
    rev: Optional[int]  # start it only if its file still has this `rev` (None: the worker checked it)
    slot: Optional[str]  # its CUDA_VISIBLE_DEVICES (None: unset, the whole machine; "": a CPU job)
    gpus: Optional[tuple[int, ...]]  # the GPU indices it holds (None: a machine without GPUs)
    notify: bool = False  # the worker's --notify
    on_finish: Optional[str] = None  # the worker's --on-finish
    max_log_bytes: Optional[int] = None  # the worker's --max-log-size (the job's own comes first)
    default_time: Optional[float] = None  # the worker's --default-time (the job's own comes first)
    kill_grace: Optional[float] = None  # the worker's --kill-grace (None: KILL_GRACE_SECONDS)
    foreign_threshold_mib: Optional[int] = None  # the worker's --foreign-mem-threshold (for a job handed on)
    notify_urls: tuple[str, ...] = ()  # the worker's --notify URLs (or GPUQ_NOTIFY's, the config file's)
    host_mem_cap_mib: Optional[int] = None  # the worker's host memory cap: an out-of-memory retry's --mem grows to it

    def hooks(self) -> dict[str, Any]:
        return {"notify": self.notify, "on_finish": self.on_finish, "notify_urls": self.notify_urls}

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode() + b"\n"

    @classmethod
    def from_fields(cls, data: Any) -> StartOrder:
        """The order in `data` (decoded JSON); ValueError if a field is missing or of the wrong type."""
        if not isinstance(data, dict):
            raise ValueError("a start order is a JSON object")
        try:
            given = {f.name: data[f.name] for f in fields(cls) if f.name in data}
            kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
            order = cls(**kwargs)
        except TypeError as exc:  # a field missing
            raise ValueError(f"bad start order: {exc}") from None
        if not all(check(getattr(order, name)) for name, check in CHECKS.items()):
            raise ValueError(f"bad start order: {order}")
        return order

    @classmethod
    def decode(cls, line: bytes) -> StartOrder:
        return cls.from_fields(json.loads(line))

    def for_job(self, job_id: int, rev: int, file: str) -> StartOrder:
        return replace(self, id=job_id, rev=rev, file=file)


CHECKS: dict[str, Callable[[Any], bool]] = {
    "id": is_int,
    "file": _text,
    "rev": _opt(is_int),
    "slot": _text,
    "gpus": _opt(lambda v: isinstance(v, tuple) and all(map(is_int, v))),
    "notify": lambda v: isinstance(v, bool),
    "on_finish": _text,
    "max_log_bytes": _opt(is_int),
    "default_time": _number,
    "kill_grace": _number,
    "foreign_threshold_mib": _opt(is_int),
    "host_mem_cap_mib": _opt(is_int),
    "notify_urls": lambda v: isinstance(v, tuple) and all(isinstance(url, str) for url in v),
}
