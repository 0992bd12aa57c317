"""`gpuq run`'s entry of the command table (cli/commands.py holds the others): its options are
the worker's settings, read from the text given and kept as text, to forward to a --daemon."""

from __future__ import annotations

import gpuq.cli.options as options
from gpuq.cli.options import APPEND, FLAG, HIDDEN, Command, Opt
from gpuq.core.timespec import parse_duration, parse_memory_mib, parse_size_bytes


def gpu_labels(text: str, flag: str) -> list[str]:
    labels = [label.strip() for label in text.split(",") if label.strip()]
    if not labels:
        raise ValueError(f"{flag} needs a list such as 0 or 0,1")
    return labels


def grace_seconds(text: str, flag: str) -> float:
    try:
        grace = float(text)
    except ValueError:
        grace = -1.0
    if not 0 <= grace <= 3600:
        raise ValueError(f"{flag}: expected seconds from 0 to 3600, got {text!r}")
    return grace


def cpu_total(text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{flag}: expected a number of CPUs (1 or more), got {text!r}")
    return int(text)


RUN = Command(
    "run",
    handler="cmd_worker:cmd_run",
    help="start a worker",
    description="Run queued jobs, one at a time per slot.",
    options=(
        Opt("--watch", kind=FLAG, group="mode", help="stay up and wait for new jobs"),
        Opt("--daemon", kind=FLAG, group="mode", help="start a resident background worker and return"),
        Opt(
            "--gpus",
            metavar="LIST",
            setting="gpus",
            read=gpu_labels,
            help="use only these GPUs (e.g. 0,2; default: every GPU found). Workers with disjoint --gpus "
            "can share a spool. Without GPUs: one slot per listed label",
        ),
        Opt(
            "--foreign-mem-threshold",
            metavar="SIZE",
            setting="foreign_threshold_mib",
            read=parse_memory_mib,
            help="memory that processes outside gpuq may hold on a GPU before a whole-GPU job waits for it "
            "(default 1G)",
        ),
        Opt(
            "--recover",
            kind=FLAG,
            setting="recover",
            help="first put interrupted jobs back in the queue (after a reboot), each from its newest checkpoint",
        ),
        Opt(
            "--notify",
            kind=FLAG,
            setting="notify",
            help="a desktop notification whenever a job ends; --notify URL: every job's events sent to URL "
            "(see `add --notify`; default: GPUQ_NOTIFY, else notify in ~/.config/gpuq/config.toml)",
        ),
        Opt(options.NOTIFY_URL, kind=APPEND, setting="notify_urls", read=options.notify_urls, help=HIDDEN),
        Opt(
            "--max-log-size",
            metavar="SIZE",
            setting="max_log_bytes",
            read=parse_size_bytes,
            help="cap every job's log (a job's own cap comes first)",
        ),
        Opt(
            "--default-time",
            metavar="LIMIT",
            setting="default_time",
            read=parse_duration,
            help="the time limit of jobs without their own --time (4h, 90m; a bare number is minutes)",
        ),
        Opt(
            "--kill-grace",
            metavar="SECONDS",
            setting="kill_grace",
            read=grace_seconds,
            help="when a job ends, what is left of its process group gets SIGTERM, then SIGKILL after this "
            "(default 10)",
        ),
        # what jobs may reserve of the machine in all (issue 31; engine/schedule/hostroom.py)
        Opt(
            "--mem",
            metavar="SIZE",
            setting="host_mem_mib",
            read=parse_memory_mib,
            help="host memory jobs may reserve in all with `add --mem` "
            "(default: the machine's, less GPUQ_HOST_MEM_MARGIN)",
        ),
        Opt(
            "--cpus",
            metavar="N",
            setting="host_cpus",
            read=cpu_total,
            help="CPUs jobs may reserve in all with `add --cpus` (default: those the worker may run on)",
        ),
        Opt(
            "--on-finish",
            metavar="CMD",
            setting="on_finish",
            help="a shell command run whenever a job ends (see `add --on-finish`)",
        ),
        Opt("--ready-fd", convert=int, help=HIDDEN),  # the background worker tells its starter it holds its locks
    ),
)
