"""Small helpers shared by the benchmark: timing, statistics, process accounting, bounded waits.

Everything here measures real processes through /proc (Linux); nothing is simulated.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


class BenchError(RuntimeError):
    """A measurement could not be taken; the message says which and why."""


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.002) -> Any:
    """Poll `cond` until it is truthy; BenchError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def timed_run(
    argv: Sequence[str], env: dict[str, str], cwd: Path, check: bool = True, timeout: float = 120.0
) -> tuple[float, str]:
    """Wall seconds of one command run to completion, and its stdout."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"{' '.join(argv)} did not finish within {timeout:.0f}s") from None
    elapsed = time.perf_counter() - start
    if check and proc.returncode != 0:
        raise BenchError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return elapsed, proc.stdout


def _complete_stamp(path: Path) -> str:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ""
    return text if text.endswith("\n") else ""  # echo writes the line in one write()


def read_stamp(path: Path, timeout: float = 30.0) -> float:
    """The epoch seconds a job wrote with bash's $EPOCHREALTIME."""
    text = wait_for(lambda: _complete_stamp(path), timeout, f"job stamp {path.name}")
    return float(text.strip().replace(",", "."))


def stamp_command(path: Path, before: str = "") -> list[str]:
    """A job that records the time with a bash builtin (no fork before the clock is read):
    as its first instruction, or after `before` when that is given."""
    script = f'echo "$EPOCHREALTIME" > {path}'
    if before:
        script = f"{before}; {script}"
    return ["bash", "-c", script]


# ---- statistics -------------------------------------------------------------------------------
def median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def median_of(data: dict[str, Any], name: str, scale: float = 1000.0, key: Optional[str] = None) -> Optional[float]:
    """The median of `name`'s samples in a scenario's results (under `key`), in ms by default;
    None if it was not measured."""
    if name not in data:
        return None
    values = data[name][key] if key else data[name]
    return statistics.median(values) * scale


def p95(values: Sequence[float]) -> Optional[float]:
    """Nearest-rank 95th percentile (with 20 samples: the 19th smallest)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-95 * len(ordered) // 100))
    return ordered[rank - 1]


def ms(value: Optional[float]) -> str:
    """Seconds as the report's milliseconds."""
    return "n/a" if value is None else f"{value * 1000:.1f}"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table, and the blank line after it."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


# ---- process accounting -----------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (its own, not its children's)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * PAGE_BYTES


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def pids_with_env(name: str, value: str, comm: Optional[str] = None) -> list[int]:
    """Processes (ours) whose environment holds name=value: how a peer's server or its waiting
    job processes are found without trusting pid files."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if comm is not None and Path(f"/proc/{entry}/comm").read_text().strip() != comm:
                continue
            if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
        except OSError:
            continue
    return sorted(found)


def machine_info() -> dict[str, str]:
    import platform

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "machine": f"{os.cpu_count()} CPUs ({cpu}){mem}",
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }


def filesystem_of(path: Path) -> str:
    """The filesystem type the spools live on (fsync costs differ a lot between them)."""
    best, kind = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            mount = parts[1]
            if str(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, parts[2]
    except OSError:
        pass
    return kind
