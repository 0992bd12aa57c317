"""What a supervisor is told: one typed message, the same for every start (spool_layout.md, section 6,
"What a supervisor is told").

The worker builds a `StartOrder` for each job it hands to a supervisor (run/worker.py, `_order`)
and sends it, encoded as one JSON line, with the claim's descriptor (run/launcher.py). A supervisor
that may hand its slot on gets further orders for the same slot over the same socket
(run/successor.py): the slot's order with the named jobs' `id`, `rev` and `file` put in.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Optional

JOB_FIELDS = ("id", "rev", "file")  # what differs between two orders for the same slot


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

    def hooks(self) -> dict[str, Any]:
        """The worker's hooks, as run/hooks.after_end takes them."""
        return {"notify": self.notify, "on_finish": self.on_finish, "notify_urls": self.notify_urls}

    def to_fields(self) -> dict[str, Any]:
        return asdict(self)

    def encode(self) -> bytes:
        return json.dumps(self.to_fields()).encode() + b"\n"

    @classmethod
    def from_fields(cls, data: Any) -> StartOrder:
        """The order in `data` (decoded JSON); ValueError if a field is missing or of the wrong type."""
        if not isinstance(data, dict):
            raise ValueError("a start order is a JSON object")
        try:
            order = cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
        except TypeError as exc:  # a field missing
            raise ValueError(f"bad start order: {exc}") from None
        gpus = tuple(order.gpus) if isinstance(order.gpus, list) else order.gpus
        urls = tuple(order.notify_urls) if isinstance(order.notify_urls, list) else order.notify_urls
        order = replace(order, gpus=gpus, notify_urls=urls)
        _check(order)
        return order

    @classmethod
    def decode(cls, line: bytes) -> StartOrder:
        return cls.from_fields(json.loads(line))

    def for_job(self, job_id: int, rev: int, file: str) -> StartOrder:
        """The order for another job in the same slot (one the worker named to follow this one)."""
        return replace(self, id=job_id, rev=rev, file=file)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _check(order: StartOrder) -> None:
    ok = (
        _is_int(order.id)
        and (order.file is None or isinstance(order.file, str))
        and (order.rev is None or _is_int(order.rev))
        and (order.slot is None or isinstance(order.slot, str))
        and (order.gpus is None or (isinstance(order.gpus, tuple) and all(map(_is_int, order.gpus))))
        and isinstance(order.notify, bool)
        and (order.on_finish is None or isinstance(order.on_finish, str))
        and (order.max_log_bytes is None or _is_int(order.max_log_bytes))
        and _is_number(order.default_time)
        and _is_number(order.kill_grace)
        and (order.foreign_threshold_mib is None or _is_int(order.foreign_threshold_mib))
        and isinstance(order.notify_urls, tuple)
        and all(isinstance(url, str) for url in order.notify_urls)
    )
    if not ok:
        raise ValueError(f"bad start order: {order}")
