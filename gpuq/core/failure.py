"""Why a job failed, in one short line, read from the tail of its latest attempt's log and how it
ended. The first match of `reason`'s order wins, because several causes leave traces in one log and
the first listed explains the others (a kill explains what follows it; NCCL reports a CUDA error
again as its own; a SIGKILL gpuq did not send is only *likely* the OOM killer). An out-of-memory
error is the cause only when it is the job's last error (`_oom_ended_it`).
"""

from __future__ import annotations

import re
from typing import Optional

from gpuq.core.job import ATTEMPT_HEADER
from gpuq.core.timespec import format_duration

TAIL_BYTES = 64 * 1024
MAX_REASON = 160

OWN_LINE = "=== gpuq: "
OOM_KILLER_HINT = "likely the kernel's OOM killer: check `dmesg`/`journalctl -k`"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")

_TORCH_OOM = re.compile(r"CUDA out of memory\.? Tried to allocate (\d+(?:\.\d+)? ?(?:bytes|[KMGTP]iB))")
_CUDA_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation"
)
_XLA_OOM = re.compile(r"RESOURCE_EXHAUSTED: Out of memory while trying to allocate (\d+) bytes")
_HOST_OOM = re.compile(
    r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate (\d+) bytes"
)
_CUBLAS_OOM = re.compile(r"CUBLAS_STATUS_ALLOC_FAILED")
_ANY_OOM = (_CUDA_OOM, _XLA_OOM, _HOST_OOM, _CUBLAS_OOM)
# An exception that an out-of-memory error explains: one (torch.OutOfMemoryError) or a peer rank's
# failed collective once the rank that ran out of memory has died.
_OOM_OR_COLLECTIVE = re.compile(r"^[\w.]*(?:OutOfMemory|DistBackendError|DistNetworkError)|NCCL")
_CUDA_ERROR = re.compile(r"CUDA error: ([^\n]+?)\s*$")
_NCCL_WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(.*?OpType=(\w+).*?\) ran for (\d+) milliseconds"
)
_NCCL_CODE = re.compile(
    r"\b(nccl(?:UnhandledCuda|System|Internal|InvalidArgument|InvalidUsage|Remote)Error)\b:?\s*(.*)"
)
_NCCL_ERROR_IN = re.compile(r"NCCL error in: [^,]*, ([^(\n]+?)\s*(?:\(|,|$)")
_NCCL_WARN_TIMEOUT = re.compile(r"NCCL WARN (.*(?:[Tt]imeout|timed out).*)")
_DISK_FULL = re.compile(r"No space left on device")
_TRACEBACK = "Traceback (most recent call last)"
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?::.*)?")
_FRAME_CHARS = (" ", "\t", "│", "╭", "╰", "┃")  # indented frames, and rich's boxed tracebacks
_WRAPPERS = ("ChildFailedError", "CalledProcessError")
_SYNTAX = re.compile(r"(?:SyntaxError|IndentationError|TabError): .*")
_CANT_OPEN = re.compile(r".*can't open file .*")
_WHAT = re.compile(r"^\s*what\(\):\s*(.+)")
# A shell reports a child's death as `Killed` alone, or as bash's `script.sh: line 3:  4242 Killed  cmd`.
_SHELL_KILLED = re.compile(r"^\s*Killed\s*$|line \d+:\s+\d+ Killed\b")
_SHELL_SEGV = re.compile(
    r"^\s*Segmentation fault(?: \(core dumped\))?\s*$|line \d+:\s+\d+ Segmentation fault\b|"
    r"^Fatal Python error: Segmentation fault"
)
_SIGNAL_EXITS = {134: "SIGABRT", 137: "SIGKILL", 139: "SIGSEGV", -6: "SIGABRT", -9: "SIGKILL", -11: "SIGSEGV"}


def reason(
    log_tail: bytes,
    exit_code: Optional[int],
    signal_name: Optional[str],
    *,
    killed_by_user: bool = False,
    time_limit: Optional[float] = None,
    host_memory: Optional[str] = None,
) -> Optional[str]:
    """One short line naming why the job failed, or None. `signal_name`: as the supervisor records
    it (`SIGKILL` or `KILL`); `time_limit` (seconds), `host_memory` ("32G"): the limit that ended it."""
    if time_limit is not None:
        return f"time limit of {format_duration(time_limit)} reached"
    if host_memory is not None:
        return f"host memory limit of {host_memory} reached"
    if killed_by_user:
        return "stopped by `gpuq kill`"
    lines = latest_attempt_lines(log_tail)
    signal = _signal(exit_code, signal_name)
    found = (
        _gpu_oom(lines)
        or _cuda_error(lines)
        or _nccl(lines)
        or _disk_full(lines)
        or _exception(lines)
        or _abort(lines, signal)
        or _sigkill(lines, signal)
        or _segfault(lines, signal)
    )
    return _trim(found) if found else None


def latest_attempt_lines(log_tail: bytes) -> list[str]:
    """The tail's lines as a terminal would show them, from the latest attempt, without gpuq's own."""
    text = log_tail[-TAIL_BYTES:].decode("utf-8", errors="replace")
    # gpuq writes its lines without first ending a job's unfinished line (a progress bar), so a
    # header or footer may share a line with the job's output: cut there, not at line starts.
    start = text.rfind(ATTEMPT_HEADER)
    if start >= 0:
        text = text[start:]
    lines = []
    for raw in text.split("\n"):
        drawings = [part for part in raw.split("\r") if part.strip()]
        line = _RANK_PREFIX.sub("", _ANSI.sub("", drawings[-1] if drawings else ""))
        if OWN_LINE in line:
            line = line[: line.index(OWN_LINE)]
            if not line.strip():
                continue
        lines.append(line)
    return lines


def _signal(exit_code: Optional[int], signal_name: Optional[str]) -> Optional[str]:
    """The signal that ended the job, from the recorded name or from a shell's 128+N exit code."""
    if signal_name:
        name = signal_name.upper()
        return name if name.startswith("SIG") else "SIG" + name
    return _SIGNAL_EXITS.get(exit_code or 0)  # 128+N from a shell, -N from Popen


def _last_match(lines: list[str], pattern: re.Pattern) -> Optional[re.Match]:
    for line in reversed(lines):
        match = pattern.search(line)
        if match:
            return match
    return None


def _gpu_oom(lines: list[str]) -> Optional[str]:
    found = _oom_text(lines)
    return found if found and _oom_ended_it(lines) else None


def _oom_text(lines: list[str]) -> Optional[str]:
    torch_oom = _last_match(lines, _TORCH_OOM)
    if torch_oom:
        return f"CUDA out of memory (tried to allocate {torch_oom.group(1)})"
    xla_oom = _last_match(lines, _XLA_OOM)
    if xla_oom:
        return f"GPU out of memory (XLA tried to allocate {_binary_size(int(xla_oom.group(1)))})"
    if _last_match(lines, _CUDA_OOM):
        return "CUDA out of memory"
    if _last_match(lines, _CUBLAS_OOM):
        return "CUDA out of memory (CUBLAS_STATUS_ALLOC_FAILED)"
    host_oom = _last_match(lines, _HOST_OOM)
    if host_oom:  # PyTorch's CPU allocator: the same mistake as a GPU OOM, made in RAM
        return f"out of CPU memory (tried to allocate {_binary_size(int(host_oom.group(1)))})"
    return None


def _oom_ended_it(lines: list[str]) -> bool:
    """Whether the last out-of-memory line is the job's last error: no traceback begun after it ends
    in another exception. Some trainers (fairseq) log an OOM they recover from and go on, so
    the job may die later of something else. A launcher's wrapper and a peer rank's collective
    error do not count: a rank's death by OOM is what causes them."""
    last_oom = max((i for i, line in enumerate(lines) if any(p.search(line) for p in _ANY_OOM)), default=-1)
    for index in range(last_oom + 1, len(lines)):
        if _TRACEBACK in lines[index]:
            exception = _exception_after(lines, index)
            if exception and not _is_wrapper(exception) and not _OOM_OR_COLLECTIVE.search(exception):
                return False
    return True


def _binary_size(count: int) -> str:
    size, unit = float(count), "bytes"
    for next_unit in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, next_unit
    return f"{count} bytes" if unit == "bytes" else f"{size:.2f} {unit}"


def _cuda_error(lines: list[str]) -> Optional[str]:
    match = _last_match(lines, _CUDA_ERROR)
    return f"CUDA error: {match.group(1)}" if match else None


def _nccl(lines: list[str]) -> Optional[str]:
    watchdog = _last_match(lines, _NCCL_WATCHDOG)
    if watchdog:
        ran_for = format_duration(int(watchdog.group(2)) / 1000)
        return f"NCCL error: {watchdog.group(1)} timed out after {ran_for} (collective watchdog)"
    code = _last_match(lines, _NCCL_CODE)
    if code:
        detail = code.group(2).strip()
        return f"NCCL error: {code.group(1)}" + (f" ({detail})" if detail else "")
    error_in = _last_match(lines, _NCCL_ERROR_IN)
    if error_in:
        return f"NCCL error: {error_in.group(1)}"
    warn = _last_match(lines, _NCCL_WARN_TIMEOUT)
    if warn:
        return f"NCCL error: {warn.group(1).strip()}"
    return None


def _disk_full(lines: list[str]) -> Optional[str]:
    return "disk full (No space left on device)" if _last_match(lines, _DISK_FULL) else None


def _exception(lines: list[str]) -> Optional[str]:
    headers = [index for index, line in enumerate(lines) if _TRACEBACK in line]
    found = [line for line in (_exception_after(lines, header) for header in reversed(headers)) if line]
    if found:
        # A launcher's wrapper says only that a child failed; the child's own traceback says why.
        return next((line for line in found if not _is_wrapper(line)), found[0])
    syntax = _last_match(lines, _SYNTAX)
    if syntax:
        return syntax.group(0)
    cant_open = _last_match(lines, _CANT_OPEN)
    return cant_open.group(0).strip() if cant_open else None


def _is_wrapper(exception_line: str) -> bool:
    return exception_line.split(":")[0].split(".")[-1] in _WRAPPERS


def _exception_after(lines: list[str], header: int) -> Optional[str]:
    """The exception line of the traceback at lines[header]: the first unindented line after its frames."""
    for line in lines[header + 1 : header + 2000]:
        if not line.strip() or line.startswith(_FRAME_CHARS):
            continue
        return line.strip() if _EXCEPTION_LINE.fullmatch(line.strip()) else None
    return None


def _abort(lines: list[str], signal: Optional[str]) -> Optional[str]:
    what = _last_match(lines, _WHAT)
    if what and (signal == "SIGABRT" or _last_match(lines, re.compile(r"terminate called after throwing"))):
        return f"aborted: {what.group(1).strip()}"
    return "aborted (SIGABRT)" if signal == "SIGABRT" else None


def _sigkill(lines: list[str], signal: Optional[str]) -> Optional[str]:
    if signal == "SIGKILL":
        return f"killed by SIGKILL ({OOM_KILLER_HINT})"
    if _last_match(lines, _SHELL_KILLED):
        return f"a child process was killed by SIGKILL ({OOM_KILLER_HINT})"
    return None


def _segfault(lines: list[str], signal: Optional[str]) -> Optional[str]:
    if signal == "SIGSEGV" or _last_match(lines, _SHELL_SEGV):
        return "segmentation fault"
    return None


def _trim(text: str) -> str:
    text = " ".join(text.split())  # one line, whatever the message held
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3].rstrip() + "..."
