"""The worker's event: its queue ran empty (QUEUE_EMPTY), sent to the worker's `--notify URL`s
(or GPUQ_NOTIFY's, the config file's) once each time its last job ends and nothing waits that could
start without a person (a held job, or one whose dependency failed, does not count as waiting)."""

from __future__ import annotations

import time
from typing import Any

from gpuq.run.notify import message, send


class QueueWatch:
    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.had_work = False  # a job of this worker ran since the queue was last empty

    def after_step(self, result: Any) -> None:
        if result.busy or result.started:
            self.had_work = True
            return
        if not self.had_work or result.startable_later or result.claim_busy:
            return  # more may start, or a job is being moved (a retry): not empty yet
        self.had_work = False
        open_log = self.worker.spool.logs.open_worker_log
        prefix = f"[{time.strftime('%H:%M:%S')}] "
        send.send(self.worker.settings.notify_urls, message.queue_empty(), open_log, "worker", prefix)
