"""`python -m gpuq.run.notify.sender`: sends one message through Apprise (send.py starts it, in a
session of its own, and does not wait). It reads on stdin a JSON object: `urls`, `quiet` (URLs
whose failure its log already holds), `message` (`title`, `body`, `type`, `fields`), `timeout` (s
per destination), `prefix` (of its lines). Each destination is sent from a child process of its
own, killed with whatever it started when its time is up; one line per failed destination goes to
stdout (the log), naming the URL by its scheme and host only: the rest of a URL (user, password,
token, path) is often the secret. Exit status: bit N set when destination N (below 7) failed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from contextlib import suppress
from typing import Any, Optional

from gpuq.core.words import url_text  # import-free, as this process needs

FAILED, UNKNOWN = 1, 2  # a child's exit status: not delivered; a URL Apprise does not know
WHY = {FAILED: "not delivered", UNKNOWN: "not a URL Apprise knows"}
TRACKED = 7  # as send.TRACKED (not imported: this process imports nothing of gpuq it does not need)


def main() -> int:
    order = json.loads(sys.stdin.buffer.read())
    urls, quiet, prefix = order["urls"], set(order["quiet"]), order["prefix"]
    try:
        import apprise  # here, to say in one line when it is missing
    except ImportError:
        from gpuq.system.extras import notify_missing  # only to say what to install

        _say(prefix, notify_missing() or "notifications to URLs need Apprise, which cannot be imported")
        return (1 << min(len(urls), TRACKED)) - 1
    logging.disable(logging.CRITICAL)  # Apprise's own lines would name the URL with its secrets
    kids = {}
    for n, url in enumerate(urls):
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            os._exit(_deliver(apprise, url, order["message"]))
        with suppress(OSError):  # it has already (or has exited)
            os.setpgid(pid, pid)  # also here: the child may not have run yet when its time is up
        kids[pid] = n
    outcomes = _wait(kids, time.monotonic() + float(order["timeout"]))
    status = 0
    for n, code in sorted(outcomes.items()):
        if code == 0:
            continue
        status |= (1 << n) if n < TRACKED else 0
        if urls[n] not in quiet:
            why = WHY.get(code or 0, f"no answer within {order['timeout']:g}s" if code is None else "not delivered")
            _say(prefix, f"notification not sent to {url_text(urls[n])}: {why}")
    return status


def _deliver(apprise: Any, url: str, message: dict[str, Any]) -> int:
    try:
        box = apprise.Apprise()
        if not box.add(url):
            return UNKNOWN
        for service in box:
            extras = getattr(service, "payload_extras", None)
            if isinstance(extras, dict):  # json://, form://, xml://: the fields as such
                extras.setdefault("gpuq", message["fields"])
        kind = getattr(apprise.NotifyType, str(message["type"]).upper(), apprise.NotifyType.INFO)
        return 0 if box.notify(body=message["body"], title=message["title"], notify_type=kind) else FAILED
    except Exception:  # noqa: BLE001 - whatever went wrong, it was not delivered
        return FAILED


def _wait(kids: dict[int, int], deadline: float) -> dict[int, Optional[int]]:
    """Each destination's outcome: its child's exit status, None if it was still at it at `deadline`
    (then its process group is killed)."""
    outcomes: dict[int, Optional[int]] = {}
    while kids and time.monotonic() < deadline:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.02)
        elif pid in kids:
            outcomes[kids.pop(pid)] = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else FAILED
    for pid, n in kids.items():
        with suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        outcomes[n] = None
    return outcomes


def _say(prefix: str, line: str) -> None:
    with suppress(OSError):
        os.write(1, f"{prefix}{line}\n".encode("utf-8", "replace"))


if __name__ == "__main__":
    sys.exit(main())
