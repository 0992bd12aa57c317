"""Starting a sender for a message (sender.py, in a session of its own) and not waiting for it: the
process that saw the event goes on at once. The sender bounds itself to GPUQ_NOTIFY_TIMEOUT seconds
per destination, writes its failures into the log it is given, and says in its exit status which
destinations failed, so that this process's next message to the same log keeps quiet about them
(and about those of a sender still under way): a destination that is down is said once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import suppress
from importlib.util import find_spec
from typing import Any, Callable

from gpuq.system.extras import notify_missing

TIMEOUT_ENV = "GPUQ_NOTIFY_TIMEOUT"  # seconds a destination may take
DEFAULT_TIMEOUT = 10.0
TRACKED = 7  # destinations whose failure a sender's exit status can say (bits 0 to 6)
MAX_TEXT = 2000  # characters of a reason or a name in a message (the whole goes through a pipe)

_running: list[tuple[subprocess.Popen, str, list[str]]] = []  # (sender, log, its destinations)
_failed: set[tuple[str, str]] = set()  # (log, URL): its failure has been logged there
_said_missing: set[str] = set()  # the logs told that Apprise is missing


def env_seconds(name: str, default: float, most: float) -> float:
    """Seconds from the environment variable `name`: `default` when unset, unreadable or not in (0, most]."""
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        return default
    return value if 0 < value <= most else default


def send(urls: list[str], message: dict[str, Any], open_log: Callable[[], int], log: str, prefix: str = "") -> None:
    """Start a sender of `message` to `urls` (each once) with the log `open_log` opens as its output,
    and return. `log` names that log (for what was said there); `prefix` starts each line written
    there. Never raises: a notification must not fail the queue."""
    reap()
    urls = list(dict.fromkeys(urls))
    if not urls:
        return
    try:
        log_fd = open_log()
    except OSError:
        return  # no log to say anything in: nothing is sent either, rather than sent unaccounted
    try:
        if find_spec("apprise") is None:
            if log not in _said_missing:
                _said_missing.add(log)
                os.write(log_fd, f"{prefix}{notify_missing()}\n".encode())
            return
        _start(urls, message, log_fd, log, prefix)
    except Exception as exc:  # noqa: BLE001 - out of processes, a closed log...: said, and the queue goes on
        with suppress(OSError):
            os.write(log_fd, f"{prefix}notification not sent: {exc}\n".encode("utf-8", "replace"))
    finally:
        os.close(log_fd)


def _start(urls: list[str], message: dict[str, Any], log_fd: int, log: str, prefix: str) -> None:
    # Quiet about a destination whose failure this log has (or may be about to get: a sender to
    # it still under way), so that a destination that is down is said once, not at every event.
    under_way = {(where, url) for _proc, where, sent in _running for url in sent}
    quiet = [url for url in urls if (log, url) in _failed or (log, url) in under_way]
    fields = {k: v[:MAX_TEXT] if isinstance(v, str) else v for k, v in message["fields"].items()}
    trimmed = dict(message, fields=fields, body=message["body"][: 4 * MAX_TEXT])
    timeout = env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT, 600)
    order = {"urls": urls, "quiet": quiet, "message": trimmed, "timeout": timeout, "prefix": prefix}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # this gpuq, and Apprise
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuq.run.notify.sender"],
        stdin=subprocess.PIPE,
        stdout=log_fd,
        stderr=log_fd,
        env=env,
        start_new_session=True,  # its own process group: a signal to ours (Ctrl-C) does not cut a message short
        close_fds=True,
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(order).encode())  # a few KiB: the pipe takes it without waiting
    except OSError:
        pass  # it died at once: nothing to say more than it said
    finally:
        proc.stdin.close()
    _running.append((proc, log, urls))


def reap() -> None:
    for entry in list(_running):
        proc, log, urls = entry
        code = proc.poll()
        if code is None:
            continue
        _running.remove(entry)
        for n, url in enumerate(urls[:TRACKED]):
            if code > 0 and code & (1 << n):
                _failed.add((log, url))
