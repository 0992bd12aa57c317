"""The machine's GPUs: what each one is, how much memory it has and uses, and which processes hold it,
from NVML or from the JSON file GPUQ_FAKE_GPUS names (spool_layout.md, section 12), read afresh at
every look so that a test can change the GPUs while a worker runs."""

from __future__ import annotations

import json
import os
import time
from contextlib import suppress
from typing import Any, Iterable, NamedTuple, Optional

from gpuq.core.words import mib_text  # noqa: F401 (gpus.mib_text, where GPU sizes are said)
from gpuq.system.gpu_presence import FAKE_ENV, NVIDIA_CONTROL_DEVICE, WSL_GPU_DEVICE
from gpuq.system.procs import load_psutil

MIB = 1024 * 1024

GPU_KEYS = ("index", "name", "uuid", "memory_total_mib", "memory_used_mib", "processes")
OPTIONAL_GPU_KEYS = ("compute_mode", "utilization_gpu")
# NVML's compute modes by their numbers (nvmlComputeMode_t); the names are those of `nvidia-smi -c`.
DEFAULT_MODE = "default"
EXCLUSIVE_PROCESS = "exclusive_process"
COMPUTE_MODES = (DEFAULT_MODE, "exclusive_thread", "prohibited", EXCLUSIVE_PROCESS)
# One compute context at a time: a second job on it would fail to start (exclusive_thread is
# NVML's deprecated older form of the same).
EXCLUSIVE_MODES = ("exclusive_thread", EXCLUSIVE_PROCESS)
PROCESS_KEYS = ("pid", "used_memory_mib")
TOP_KEYS = ("gpus", "source", "problem", "at")  # the last three: what to_json adds about the look


class GpuProcess(NamedTuple):
    pid: int
    used_memory_mib: Optional[int]  # None: NVML could not tell
    utilization_gpu: Optional[int] = None  # 0-100, None: not known


class Gpu(NamedTuple):
    index: int  # type: ignore[assignment]  # the GPU's, named as NVML names it (tuple.index is hidden)
    name: str
    uuid: str
    memory_total_mib: int
    memory_used_mib: int
    processes: tuple[GpuProcess, ...]
    compute_mode: str = DEFAULT_MODE  # one of COMPUTE_MODES
    utilization_gpu: Optional[int] = None  # 0-100, None: not known

    @property
    def exclusive(self) -> bool:
        """Whether the GPU takes one process at a time (placement never shares it)."""
        return self.compute_mode in EXCLUSIVE_MODES


class GpuLook(NamedTuple):
    gpus: tuple[Gpu, ...]
    source: str  # "fake", "nvml" or "none"
    problem: Optional[str]  # one line: why there are no GPUs, or what part of the look failed
    at: float  # time.time() of the look


def to_json(look: GpuLook) -> dict[str, Any]:
    """The look as JSON; from_json ignores `source`, `problem` and `at` (it reads `gpuq gpus --json`)."""
    gpus = [dict(_known(gpu), processes=[_known(p) for p in gpu.processes]) for gpu in look.gpus]
    return {"gpus": gpus, "source": look.source, "problem": look.problem, "at": look.at}


def _known(row: Any) -> dict[str, Any]:
    """A Gpu's or GpuProcess's fields, less an unknown utilization and a default compute mode
    (optional in the format: files without them stay as they were)."""
    left_out = (("utilization_gpu", None), ("compute_mode", DEFAULT_MODE))
    return {key: value for key, value in row._asdict().items() if (key, value) not in left_out}


def from_json(obj: Any) -> tuple[Gpu, ...]:
    """The GPUs of a document, in order; ValueError naming the field (`gpus[1].memory_total_mib: ...`)."""
    if not isinstance(obj, dict):
        raise ValueError(f'expected an object {{"gpus": [...]}}, got {_kind(obj)}')
    _exact_keys(obj, ("gpus",), TOP_KEYS, "the document")
    if not isinstance(obj["gpus"], list):
        raise ValueError(f"gpus: expected a list, got {_kind(obj['gpus'])}")
    gpus = tuple(_gpu_from_json(item, f"gpus[{n}]") for n, item in enumerate(obj["gpus"]))
    _no_duplicates([g.index for g in gpus], "gpus: index {} appears twice")
    _no_duplicates([g.uuid for g in gpus], "gpus: uuid {} appears twice")
    return gpus


def _gpu_from_json(item: Any, where: str) -> Gpu:
    _exact_keys(item, GPU_KEYS, GPU_KEYS + OPTIONAL_GPU_KEYS, where)
    total = _whole(item["memory_total_mib"], f"{where}.memory_total_mib", minimum=1)
    used = _whole(item["memory_used_mib"], f"{where}.memory_used_mib", minimum=0)
    if used > total:
        raise ValueError(f"{where}.memory_used_mib: {used} is more than memory_total_mib {total}")
    if not isinstance(item["processes"], list):
        raise ValueError(f"{where}.processes: expected a list, got {_kind(item['processes'])}")
    processes = tuple(_process_from_json(p, f"{where}.processes[{n}]") for n, p in enumerate(item["processes"]))
    _no_duplicates([p.pid for p in processes], where + ".processes: pid {} appears twice")
    return Gpu(
        index=_whole(item["index"], f"{where}.index", minimum=0),
        name=_text(item["name"], f"{where}.name"),
        uuid=_text(item["uuid"], f"{where}.uuid"),
        memory_total_mib=total,
        memory_used_mib=used,
        processes=processes,
        compute_mode=_compute_mode(item.get("compute_mode", DEFAULT_MODE), f"{where}.compute_mode"),
        utilization_gpu=_percent(item, where),
    )


def _percent(item: dict, where: str) -> Optional[int]:
    value = item.get("utilization_gpu")
    if value is not None and _whole(value, f"{where}.utilization_gpu", minimum=0) > 100:
        raise ValueError(f"{where}.utilization_gpu: expected a whole number 0-100, got {value}")
    return value


def _compute_mode(value: Any, where: str) -> str:
    if value not in COMPUTE_MODES:
        raise ValueError(f"{where}: expected one of {', '.join(COMPUTE_MODES)}, got {json.dumps(value)}")
    return value


def _process_from_json(item: Any, where: str) -> GpuProcess:
    _exact_keys(item, PROCESS_KEYS, PROCESS_KEYS + ("utilization_gpu",), where)
    used = item["used_memory_mib"]
    return GpuProcess(
        pid=_whole(item["pid"], f"{where}.pid", minimum=1),
        used_memory_mib=None if used is None else _whole(used, f"{where}.used_memory_mib", minimum=0),
        utilization_gpu=_percent(item, where),
    )


def _exact_keys(obj: Any, required: tuple[str, ...], allowed: tuple[str, ...], where: str) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object, got {_kind(obj)}")
    missing = [k for k in required if k not in obj]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:  # strict: a typo such as "memory_total" must not pass as a GPU without memory
        raise ValueError(f"{where}: unknown key {', '.join(unknown)} (allowed: {', '.join(allowed)})")


def _whole(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}: expected a whole number >= {minimum}, got {json.dumps(value)}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: expected a non-empty string, got {json.dumps(value)}")
    return value


def _no_duplicates(values: list[Any], message: str) -> None:
    twice = [value for n, value in enumerate(values) if value in values[:n]]
    if twice:
        raise ValueError(message.format(twice[0]))


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number"
    )


def look() -> GpuLook:
    """The GPUs now. Never raises: what went wrong is in `problem` (no driver: no GPUs, source "none":
    the CPU-only case, not an error)."""
    path = os.environ.get(FAKE_ENV)
    if not path:
        return _look_nvml()
    at = time.time()
    try:
        with open(path, encoding="utf-8") as fh:
            document = json.load(fh)
        return GpuLook(from_json(document), "fake", None, at)
    except OSError as exc:
        problem = f"cannot read it: {exc.strerror or exc}"
    except json.JSONDecodeError as exc:  # before ValueError, which it is a kind of
        problem = f"not JSON: {exc}"
    except ValueError as exc:
        problem = str(exc)
    return GpuLook((), "fake", f"{FAKE_ENV}={path}: {problem}", at)


# NVML is started once per process (nvmlInit is slow), and a missing driver remembered. No lock:
# NVML counts its nvmlInit calls and the binding loads under its own lock, so two threads looking
# at once (the web view's, `top`'s) only start it twice.
_pynvml: Any = None  # the NVML binding, once NVML started
_nvml_absent: Optional[str] = None  # set once we know there is no NVIDIA driver here


def _look_nvml() -> GpuLook:
    at = time.time()
    failure = _start_nvml()
    if failure is not None:
        return GpuLook((), failure[0], failure[1], at)
    pynvml = _pynvml
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:
        return GpuLook((), "nvml", f"NVML cannot count the GPUs: {_error_text(pynvml, exc)}", at)
    problems: list[str] = []
    read = [_read_device(pynvml, index, problems) for index in range(count)]
    return GpuLook(tuple(gpu for gpu in read if gpu is not None), "nvml", "; ".join(problems) or None, at)


def _start_nvml() -> Optional[tuple[str, str]]:
    """None once NVML is up, else (source, problem) for a look without GPUs."""
    global _pynvml, _nvml_absent
    if _pynvml is not None:
        return None
    if _nvml_absent is not None:
        return "none", _nvml_absent
    driver_loaded = os.path.exists(NVIDIA_CONTROL_DEVICE)
    if not driver_loaded and not os.path.exists(WSL_GPU_DEVICE):
        # no driver device at all: not worth importing NVML's binding (`gpuq status` pays for it)
        _nvml_absent = f"no NVIDIA driver (no {NVIDIA_CONTROL_DEVICE})"
        return "none", _nvml_absent
    try:
        import pynvml  # NVML's binding, only where a driver is there
    except ImportError:
        if driver_loaded:  # GPUs we cannot see: refuse rather than start jobs onto them blindly
            return "nvml", "an NVIDIA driver is loaded but the NVML binding is missing (pip install nvidia-ml-py)"
        _nvml_absent = "no NVIDIA driver (and no NVML binding: pip install nvidia-ml-py)"
        return "none", _nvml_absent
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        missing = (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if getattr(exc, "value", None) in missing and not driver_loaded:
            _nvml_absent = f"no NVIDIA driver (NVML: {exc})"
            return "none", _nvml_absent
        # A driver that is there but fails (permissions, a GPU fallen off the bus...): tried again
        # at the next look, and meanwhile GPU jobs wait with this as their reason.
        return "nvml", f"NVML failed to start: {exc}"
    _pynvml = pynvml
    return None


def _read_device(pynvml: Any, index: int, problems: list[str]) -> Optional[Gpu]:
    """One device, or None (and a line in `problems`) if NVML cannot read it: the others stay."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = _as_text(pynvml.nvmlDeviceGetName(handle))
        uuid = _as_text(pynvml.nvmlDeviceGetUUID(handle))
        total, used = _memory(pynvml, handle)
    except Exception as exc:  # NVMLError mostly; anything else must not lose the other GPUs either
        problems.append(f"GPU {index} unreadable (NVML: {_error_text(pynvml, exc)})")
        return None
    try:
        processes = _processes(pynvml, handle)
    except Exception as exc:
        # Kept with no processes: all its used memory then counts as held by someone unknown.
        problems.append(f"GPU {index}: no process list (NVML: {_error_text(pynvml, exc)})")
        processes = ()
    number = _nvml_or_none(lambda: pynvml.nvmlDeviceGetComputeMode(handle))  # None: shared, as default
    mode = COMPUTE_MODES[number] if isinstance(number, int) and 0 <= number < len(COMPUTE_MODES) else DEFAULT_MODE
    busy = _nvml_or_none(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    # each process's SM share over NVML's recent samples, where the driver keeps them
    samples = _nvml_or_none(lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, 0)) or ()
    share = {s.pid: min(int(s.smUtil), 100) for s in samples}
    processes = tuple(p._replace(utilization_gpu=share.get(p.pid)) for p in processes)
    return Gpu(index, name, uuid, total, used, processes, compute_mode=mode, utilization_gpu=busy)


def _nvml_or_none(read: Any) -> Any:
    """A figure that only informs: None where NVML cannot give it, never an error that stops a look."""
    try:
        return read()
    except Exception:  # NVMLError_NotSupported mostly (MIG slices, some drivers)
        return None


def _memory(pynvml: Any, handle: Any) -> tuple[int, int]:
    """(total, used) in MiB, total - used allocatable now. NVML v2's `reserved` (the driver's share)
    is left out of the total, so an idle GPU shows no memory held by someone unknown; a driver
    without v2 (before about R510) counts it as used."""
    names = ("NVMLError_FunctionNotFound", "NVMLError_ArgumentVersionMismatch", "NVMLError_NotSupported")
    no_v2 = tuple(getattr(pynvml, n) for n in names if hasattr(pynvml, n)) + (AttributeError, TypeError)
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        total = (info.total - info.reserved) // MIB
    except no_v2:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)  # AttributeError, TypeError: a binding without v2
        total = info.total // MIB
    return total, min(info.used // MIB, total)


def _processes(pynvml: Any, handle: Any) -> tuple[GpuProcess, ...]:
    """Compute and graphics processes, one entry per pid (a process can be in both lists; NVML
    then gives the same per-process figure twice, so the larger known one is kept)."""
    by_pid: dict[int, Optional[int]] = {}
    for kind in ("Compute", "Graphics"):
        for info in _process_list(pynvml, handle, kind):
            used = info.usedGpuMemory
            mib = None if used is None else used // MIB
            known = by_pid.get(info.pid)
            by_pid[info.pid] = mib if known is None else (known if mib is None else max(known, mib))
    return tuple(GpuProcess(pid, by_pid[pid]) for pid in sorted(by_pid))


def _process_list(pynvml: Any, handle: Any, kind: str) -> list:
    """The unversioned call follows the binding's struct version; a driver older than the binding
    lacks that symbol, and the _v2 call is the one it has."""
    newest = getattr(pynvml, f"nvmlDeviceGet{kind}RunningProcesses")
    try:
        return newest(handle)
    except pynvml.NVMLError_FunctionNotFound:
        pass
    except Exception as exc:  # NVMLLibraryMismatchError is no NVMLError subclass
        if type(exc).__name__ != "NVMLLibraryMismatchError":
            raise
    return getattr(pynvml, f"nvmlDeviceGet{kind}RunningProcesses_v2")(handle)


def _error_text(pynvml: Any, exc: Exception) -> str:
    return str(exc) if isinstance(exc, pynvml.NVMLError) else f"{type(exc).__name__}: {exc}"


def _as_text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def describe_pid(pid: int) -> str:
    """'python, user alice'; 'not visible here' when gone or in another pid namespace (NVML sees it)."""
    psutil = load_psutil()
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return f"{proc.name()}, user {proc.username()}"
    except psutil.Error:
        return "not visible here"


def tree_pids(roots: Iterable[int]) -> set[int]:
    """The roots that exist now and their descendants (a root gone is left out: its pid may be reused)."""
    psutil = load_psutil()
    pids: set[int] = set()
    for root in roots:
        with suppress(psutil.Error):
            children = psutil.Process(root).children(recursive=True)
            pids.add(root)
            pids.update(child.pid for child in children)
    return pids


def used_by(pid: int) -> tuple[Optional[list[int]], list[int], str]:
    """The GPUs (indices) a process of ours may use, those it is known to use, and how that was told;
    (None, [], "") without GPUs. It may use those its CUDA_VISIBLE_DEVICES names, as it was started,
    or every GPU when that is unset or names one gpuq cannot tell; it is known to use only those it
    names, and, either way, those where it or a child holds memory."""
    gpus = look().gpus
    if not gpus:
        return None, [], ""
    psutil = load_psutil()
    try:
        env: Optional[dict[str, str]] = psutil.Process(pid).environ()
    except psutil.Error:
        env = None
    value = None if env is None else env.get("CUDA_VISIBLE_DEVICES")
    named = _visible(value, gpus, (env or {}).get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID")
    known = set(named or ())
    if named is not None:
        why = f"its CUDA_VISIBLE_DEVICES={value}" if value else "its CUDA_VISIBLE_DEVICES is empty"
    else:
        named = [gpu.index for gpu in gpus]
        told = "cannot be read" if env is None else "is not set" if value is None else f"({value}) is not one gpuq maps"
        why = f"every GPU: its CUDA_VISIBLE_DEVICES {told}"
    tree = tree_pids([pid])
    memory = {gpu.index for gpu in gpus for proc in gpu.processes if proc.pid in tree}
    holding = sorted(memory - set(named))
    if holding:
        why += f"; it holds memory on GPU {','.join(map(str, holding))}"
    return sorted({*named, *holding}), sorted(known | memory), why


def _visible(value: Optional[str], gpus: tuple[Gpu, ...], pci_order: bool) -> Optional[list[int]]:
    """The GPUs CUDA_VISIBLE_DEVICES names, read as CUDA reads it: indices or (prefixes of) UUIDs,
    up to the first that names no GPU (`-1`, `""`: none). None where gpuq cannot tell: unset, a MIG
    instance, or indices in CUDA's default order (fastest first) among GPUs of several models."""
    if value is None:
        return None
    named: list[int] = []
    for word in (w.strip() for w in value.split(",")):
        if word.lstrip("-").isdigit():
            found = [gpu.index for gpu in gpus if gpu.index == int(word)]
            if found and not pci_order and len({gpu.name for gpu in gpus}) > 1:
                return None
        elif word.startswith("GPU-") or not word:
            found = [gpu.index for gpu in gpus if word and gpu.uuid.startswith(word)]
        else:
            return None
        if len(found) != 1:
            break
        named.append(found[0])
    return named
