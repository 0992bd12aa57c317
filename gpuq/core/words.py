"""Counts, job ids, notification URLs and sizes as a sentence says them: "1 step", "3 steps",
"#3, #4", "#12-#15", "after #1, after-any #2", "json://127.0.0.1:8080", "9.1 GiB", "leased whole
by bob's job #12 since 09:14", "asks for 2 GPUs, over your limit of 1 GPU at once on this machine"."""

from __future__ import annotations

import re
import time
from typing import Any, Iterable, Optional, Sequence

from gpuq.core.states import PREEMPT_ACTIONS, TIME_LIMIT
from gpuq.core.times import clock, duration

# Escape sequences of a terminal (colours, cursor moves, titles) and the other control characters
# but tab and line breaks: text a page or a screen shows never carries them (curses refuses a NUL).
TERMINAL_CODES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
)


def shown(text: str) -> str:
    """`text` as a page or a screen may show it: terminal escape sequences and control characters dropped."""
    return TERMINAL_CODES.sub("", text)


def utf8(value: Any) -> Any:
    """`value` (text, or dicts and lists of it) with each lone surrogate (an undecodable byte of a job's
    argument or file name) written `\\udcXX`, as `status --json` escapes it: a UTF-8 writer (the MCP
    SDK's, a web response's) fails on one."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {utf8(key): utf8(item) for key, item in value.items()}
    return [utf8(item) for item in value] if isinstance(value, (list, tuple)) else value


def plural(count: int, word: str, many: Optional[str] = None) -> str:
    """`1 step`, `0 steps`, `3 steps`; `many` for a word whose plural is not word + "s"."""
    return f"{count} {word if count == 1 else many or word + 's'}"


def ids_text(ids: Iterable[int]) -> str:
    """`#3`, `#3, #5`, `#12-#15` (a run of three or more consecutive ids, as a sweep's are)."""
    runs: list[list[int]] = []
    for job_id in sorted(set(ids)):
        if runs and job_id == runs[-1][-1] + 1:
            runs[-1].append(job_id)
        else:
            runs.append([job_id])
    parts = []
    for run in runs:
        parts += [f"#{run[0]}-#{run[-1]}"] if len(run) > 2 else [f"#{i}" for i in run]
    return ", ".join(parts)


def dependencies_text(after: list[int], after_any: list[int]) -> str:
    """`after #1, #2, after-any #3`: what a job waits for, `--after-any` said apart from `--after`
    (which starts only after a success); '' for none."""
    after_text = ["after " + ", ".join(f"#{d}" for d in after)] if after else []
    any_text = ["after-any " + ", ".join(f"#{d}" for d in after_any)] if after_any else []
    return ", ".join(after_text + any_text)


def url_text(url: str) -> str:
    """`json://127.0.0.1:8080` for `json://user:pass@127.0.0.1:8080/hook?token=x`: a URL's scheme
    and host, the host only where it is a network name (`ntfy://TOPIC`, `tgram://BOT_TOKEN/...`:
    it may be the secret), since the rest of a URL (user, password, token, path) often is."""
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0].split("?", 1)[0].rsplit("@", 1)[-1]
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    network = "." in name or name == "localhost" or name.startswith("[")
    return f"{scheme}://{host if network else '...'}"


def size_text(mib: int) -> str:
    """`40G`, as --gpu-mem and --mem are typed."""
    if mib < 1024:
        return f"{mib}M"
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib / 1024:.1f}G"


def mib_text(mib: int) -> str:
    """'512 MiB' below a GiB, else GiB with one decimal ('9.1 GiB' for 9300 MiB)."""
    if mib < 1024:
        return f"{mib} MiB"
    return f"{mib / 1024:.1f} GiB"


def memory_too_small(need: int, count: int, totals: Sequence[tuple[int, int]]) -> Optional[str]:
    """Why `count` GPUs with `need` MiB each are never found among the (index, MiB) `totals`, naming
    the GPU whose memory bounds it, the smallest of the `count` largest (triage offers that size);
    None where they are (or where there are fewer GPUs than that: said otherwise)."""
    if len(totals) < count:
        return None
    index, total = sorted(totals, key=lambda t: (-t[1], t[0]))[count - 1]
    each = "a GPU; the largest" if count == 1 else f"each of {count} GPUs; the smallest of the {count} largest"
    return f"needs {mib_text(need)} on {each} here is GPU {index} with {mib_text(total)}" if total < need else None


def stopping_text(action: str, since: Optional[float], now: float) -> str:
    """'preempting since 14:02:07 (12s)', 'stopping since ...': a running job someone asked to end
    (`action`: its control request; its supervisor's at its time limit), while it saves and exits
    within its grace period."""
    verb = "preempting" if action in PREEMPT_ACTIONS else "stopping"  # kill, cancel
    verb += " at its time limit" if action == TIME_LIMIT else ""
    if since is None:
        return verb
    return f"{verb} since {clock(since)} ({duration(max(0.0, now - since))})"


def lease_text(who: str, mem_mib: Optional[int], since: float, using_mib: int = 0) -> str:
    """'leased whole by bob's job #12 since 09:14', '20.0 GiB leased by alice's job #3 since 09:02':
    a GPU lease as a reason says it, in `gpuq status` and `gpuq eta` alike (`who`: whose it is, as
    system/leases.py's `Lease.who` tells the viewer; `mem_mib` None: whole). A holder's processes
    using more than its lease (`using_mib`) count for what they use, and the reason says so: ', using
    60.0 GiB' (a 30 GiB lease alone would read as if a 30 GiB job fitted beside it)."""
    at = time.strftime("%H:%M", time.localtime(since))
    if mem_mib is None:
        return f"leased whole by {who} since {at}"
    beyond = f", using {mib_text(using_mib)}" if using_mib > mem_mib else ""
    return f"{mib_text(mem_mib)} leased by {who} since {at}{beyond}"


OVER_CAP = ", over your limit of "  # what a job asking for more GPUs than its user's cap waits for


def cap_text(cap: int, asked: int) -> str:
    """Why a GPU job waits for its user's cap in the machine's policy (engine/schedule/turns.py), in
    the worker's words and in `status`'s and `add`'s without a worker: over it by itself, or over
    it with the GPUs the user's other jobs hold."""
    at_once = f"{plural(cap, 'GPU')} at once on this machine"
    if asked > cap:
        return f"asks for {plural(asked, 'GPU')}{OVER_CAP}{at_once}"
    return f"waiting for one of your jobs to end: your limit of {at_once}"


def stopped_text(pids: list[int]) -> str:
    """What stopped workers (Ctrl-Z, SIGSTOP) mean for the queue, and how to continue them."""
    one = len(pids) == 1
    return (
        f"{'it starts' if one else 'they start'} no job until {'it is' if one else 'they are'} continued: "
        f"`kill -CONT {' '.join(map(str, pids))}` (or `fg` in {'its' if one else 'their'} terminal)"
    )


# how an adopted job is said where running jobs outlive a worker (`gpuq stop`, the worker's last line)
ADOPTED_END = "adopted, no supervisor: recorded done once its process is gone"
