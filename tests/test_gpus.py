"""gpuq.system.gpus: fake GPU files read afresh, strict validation, the exact JSON round-trip, the
real no-driver path of this machine, and the pid helpers on real processes."""

from __future__ import annotations

import ctypes.util
import json
import os
import pwd
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, wait_for

from gpuq.system import gpus
from gpuq.system.gpus import Gpu, GpuLook, GpuProcess


def fake_gpu(index: int, used: int = 0, processes: tuple = (), total: int = 81559) -> dict[str, Any]:
    return {
        "index": index,
        "name": "Fake H100",
        "uuid": f"GPU-fake-{index}",
        "memory_total_mib": total,
        "memory_used_mib": used,
        "processes": [{"pid": pid, "used_memory_mib": mib} for pid, mib in processes],
    }


def write_doc(path: Path, doc: Any) -> None:
    """Written whole and renamed into place, as a test changing GPUs under a worker should."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    os.replace(tmp, path)


@pytest.fixture
def fake_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "gpus.json"
    monkeypatch.setenv(gpus.FAKE_ENV, str(path))
    return path


# ------------------------------------------------------------------ fake files


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_fake_file_gives_its_gpus(fake_file: Path, count: int) -> None:
    doc = {"gpus": [fake_gpu(i, used=100 * i, processes=((1000 + i, 100 * i),) if i else ()) for i in range(count)]}
    write_doc(fake_file, doc)
    look = gpus.look()
    assert look.source == "fake" and look.problem is None
    assert [g.index for g in look.gpus] == list(range(count))
    assert [g.uuid for g in look.gpus] == [f"GPU-fake-{i}" for i in range(count)]
    assert look.gpus[-1].memory_used_mib == 100 * (count - 1)
    if count > 1:
        assert look.gpus[1].processes == (GpuProcess(1001, 100),)


def test_fake_file_is_read_afresh_at_every_look(fake_file: Path) -> None:
    write_doc(fake_file, {"gpus": [fake_gpu(0)]})
    first = gpus.look()
    write_doc(fake_file, {"gpus": [fake_gpu(0, used=9300, processes=((4242, 9300),)), fake_gpu(1)]})
    second = gpus.look()
    fake_file.write_text(json.dumps({"gpus": []}))  # a plain rewrite in place, no rename, is seen too
    third = gpus.look()
    assert [len(first.gpus), len(second.gpus), len(third.gpus)] == [1, 2, 0]
    assert second.gpus[0].processes == (GpuProcess(4242, 9300),)
    assert first.at <= second.at <= third.at
    assert third.problem is None and third.source == "fake"


BAD_DOCS = [
    ("{not json", "not JSON"),
    ("[]", "expected an object"),
    ({}, "missing gpus"),
    ({"gpus": {}}, "gpus: expected a list"),
    ({"gpus": [fake_gpu(0)], "extra": 1}, "unknown key extra"),
    ({"gpus": [dict(fake_gpu(0), memory_total=1)]}, "gpus[0]: unknown key memory_total"),
    ({"gpus": [{k: v for k, v in fake_gpu(0).items() if k != "uuid"}]}, "gpus[0]: missing uuid"),
    ({"gpus": [dict(fake_gpu(0), index=True)]}, "gpus[0].index"),
    ({"gpus": [dict(fake_gpu(0), index=-1)]}, "gpus[0].index"),
    ({"gpus": [dict(fake_gpu(0), memory_total_mib="80G")]}, "gpus[0].memory_total_mib"),
    ({"gpus": [dict(fake_gpu(0), memory_total_mib=0)]}, "gpus[0].memory_total_mib"),
    ({"gpus": [fake_gpu(0, used=90000)]}, "gpus[0].memory_used_mib: 90000 is more than"),
    ({"gpus": [dict(fake_gpu(0), name="")]}, "gpus[0].name"),
    ({"gpus": [fake_gpu(0), fake_gpu(0)]}, "index 0 appears twice"),
    ({"gpus": [fake_gpu(0), dict(fake_gpu(1), uuid="GPU-fake-0")]}, "uuid GPU-fake-0 appears twice"),
    ({"gpus": [dict(fake_gpu(0), processes=None)]}, "gpus[0].processes: expected a list"),
    ({"gpus": [fake_gpu(0, processes=((0, 5),))]}, "gpus[0].processes[0].pid"),
    ({"gpus": [fake_gpu(0, processes=((7, -5),))]}, "gpus[0].processes[0].used_memory_mib"),
    ({"gpus": [fake_gpu(0, processes=((7, 5), (7, 6)))]}, "pid 7 appears twice"),
    ({"gpus": [dict(fake_gpu(0), processes=[{"pid": 7}])]}, "gpus[0].processes[0]: missing used_memory_mib"),
    ({"gpus": [dict(fake_gpu(0), utilization_gpu=101)]}, "gpus[0].utilization_gpu: expected a whole number 0-100"),
    ({"gpus": [dict(fake_gpu(0), utilization_gpu="50%")]}, "gpus[0].utilization_gpu"),
    (
        {"gpus": [dict(fake_gpu(0), processes=[{"pid": 7, "used_memory_mib": 1, "utilization_gpu": -1}])]},
        "gpus[0].processes[0].utilization_gpu",
    ),
]


@pytest.mark.parametrize("doc,expected", BAD_DOCS, ids=[e for _, e in BAD_DOCS])
def test_malformed_file_gives_a_problem_not_an_exception(fake_file: Path, doc: Any, expected: str) -> None:
    write_doc(fake_file, doc)
    look = gpus.look()
    assert look.source == "fake" and look.gpus == ()
    assert look.problem is not None and "\n" not in look.problem
    assert str(fake_file) in look.problem and expected in look.problem


def test_missing_fake_file_gives_a_problem(fake_file: Path) -> None:
    look = gpus.look()
    assert (look.source, look.gpus) == ("fake", ())
    assert look.problem == f"{gpus.FAKE_ENV}={fake_file}: cannot read it: No such file or directory"


@pytest.mark.parametrize("doc,expected", [d for d in BAD_DOCS if not isinstance(d[0], str)])
def test_from_json_raises_value_error_with_one_line(doc: Any, expected: str) -> None:
    with pytest.raises(ValueError) as caught:
        gpus.from_json(doc)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


# ------------------------------------------------------------------ JSON round-trip


def test_json_round_trip_is_exact(fake_file: Path) -> None:
    doc = {
        "gpus": [
            fake_gpu(0, used=9300, processes=((4242, 9300),)),
            fake_gpu(1, used=20000, processes=((77, None), (78, 19000)), total=143771),
            dict(fake_gpu(2, processes=((79, 5),)), utilization_gpu=0),
        ]
    }
    doc["gpus"][2]["processes"][0]["utilization_gpu"] = 100
    write_doc(fake_file, doc)
    look = gpus.look()
    out = gpus.to_json(look)
    assert {k: out[k] for k in ("source", "problem", "at")} == {"source": "fake", "problem": None, "at": look.at}
    assert {"gpus": out["gpus"]} == doc  # key for key, value for value, order kept
    assert look.gpus[2].utilization_gpu == 0 and look.gpus[2].processes[0].utilization_gpu == 100
    assert look.gpus[0].utilization_gpu is None  # absent: not known, and not written back
    through_text = json.loads(json.dumps(out))
    assert gpus.from_json(through_text) == look.gpus  # what `gpuq gpus --json` prints reads back the same
    assert gpus.to_json(GpuLook(gpus.from_json(through_text), look.source, look.problem, look.at)) == out
    write_doc(fake_file, out)  # and serves as a fake file itself
    assert gpus.look().gpus == look.gpus


# ------------------------------------------------------------------ the real machine: no driver


def driver_here() -> bool:
    return os.path.exists("/dev/nvidiactl") or ctypes.util.find_library("nvidia-ml") is not None


@pytest.mark.skipif(driver_here(), reason="this machine has an NVIDIA driver; the no-driver path cannot be seen")
def test_no_driver_means_no_gpus_and_a_benign_problem() -> None:
    """A fresh process, so that NVML really is tried (and fails) here, as `gpuq run` would."""
    code = (
        "import json, sys; from gpuq.system import gpus; "
        "assert 'pynvml' not in sys.modules and 'psutil' not in sys.modules, 'imported too early'; "
        "a = gpus.look(); b = gpus.look(); print(json.dumps([gpus.to_json(a), gpus.to_json(b)]))"
    )
    env = {k: v for k, v in os.environ.items() if k != gpus.FAKE_ENV}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, second = json.loads(proc.stdout)
    for look in (first, second):
        assert look["gpus"] == [] and look["source"] == "none"
        assert look["problem"].startswith("no NVIDIA driver"), look["problem"]
    assert first["problem"] == second["problem"]


def test_placement_and_gpus_modules_import_nothing_heavy() -> None:
    code = (
        "import sys; import gpuq.engine.schedule.placement, gpuq.system.gpus; "
        "print(sorted(m for m in ('pynvml', 'psutil', 'watchdog') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ------------------------------------------------------------------ NVML through a stand-in binding
# No GPU here, so the NVML reading code runs against a small stand-in for the `pynvml` module (the
# binding only: no process, file or clock is faked). It checks what this code does with NVML's
# answers: devices that fail, duplicate pids, missing sizes, v2 memory figures and their fallback.


class NVMLError(Exception):
    def __init__(self, value: int = 999, text: str = "Unknown Error"):
        super().__init__(text)
        self.value = value


class FunctionNotFound(NVMLError):
    pass


def stand_in_nvml(devices: list[dict[str, Any]], has_v2: bool = True) -> types.ModuleType:
    mod = types.ModuleType("pynvml")
    mod.NVMLError = NVMLError
    mod.NVMLError_FunctionNotFound = FunctionNotFound
    mod.NVML_ERROR_LIBRARY_NOT_FOUND, mod.NVML_ERROR_DRIVER_NOT_LOADED = 12, 9
    mod.nvmlMemory_v2 = 0x02000028
    mod.nvmlInit = lambda: None
    mod.nvmlDeviceGetCount = lambda: len(devices)

    def handle(i: int) -> dict:
        if devices[i].get("lost"):
            raise NVMLError(15, "GPU is lost")
        return devices[i]

    def memory(h: dict, version: Any = None) -> Any:
        if version is not None and not has_v2:
            raise FunctionNotFound(13, "Function Not Found")
        if version is not None:
            return types.SimpleNamespace(total=h["total"], reserved=h["reserved"], used=h["used"], free=0)
        return types.SimpleNamespace(total=h["total"], used=h["used"] + h["reserved"], free=0)

    def processes(kind: str) -> Any:
        def listing(h: dict) -> list:
            if h.get("no_processes"):
                raise NVMLError(3, "Not Supported")
            return [types.SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in h.get(kind, [])]

        return listing

    mod.nvmlDeviceGetHandleByIndex = handle
    mod.nvmlDeviceGetName = lambda h: h["name"].encode()  # older bindings return bytes

    def uuid(h: dict) -> str:
        if h.get("weird"):
            raise RuntimeError("boom")  # not an NVMLError: a binding bug must not lose the other GPUs
        return h["uuid"]

    mod.nvmlDeviceGetUUID = uuid
    mod.nvmlDeviceGetMemoryInfo = memory
    mod.nvmlDeviceGetComputeRunningProcesses = processes("compute")
    mod.nvmlDeviceGetGraphicsRunningProcesses = processes("graphics")
    return mod


def nvml_look(monkeypatch: pytest.MonkeyPatch, binding: types.ModuleType) -> GpuLook:
    """A look through the stand-in binding, on a machine whose driver device exists."""
    monkeypatch.delenv(gpus.FAKE_ENV, raising=False)
    monkeypatch.setattr(gpus, "NVIDIA_CONTROL_DEVICE", "/dev/null")
    monkeypatch.setitem(sys.modules, "pynvml", binding)
    monkeypatch.setattr(gpus, "_pynvml", None)
    monkeypatch.setattr(gpus, "_nvml_absent", None)
    return gpus.look()


GIB = 1024**3
MIB = 1024**2


def device(n: int, **extra: Any) -> dict[str, Any]:
    base = {"name": f"NVIDIA H200 #{n}", "uuid": f"GPU-{n}", "total": 144 * GIB, "reserved": GIB // 2, "used": 0}
    return dict(base, **extra)


def test_nvml_reading_keeps_good_devices_when_one_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    binding = stand_in_nvml(
        [
            device(0, used=10 * GIB, compute=[(4242, 9 * GIB), (50, None)], graphics=[(4242, 9 * GIB), (60, MIB)]),
            device(1, lost=True),
            device(2, no_processes=True, used=3 * GIB),
            device(3, weird=True),
        ]
    )
    look = nvml_look(monkeypatch, binding)
    assert look.source == "nvml"
    assert [g.index for g in look.gpus] == [0, 2]
    first = look.gpus[0]
    assert first.name == "NVIDIA H200 #0" and first.uuid == "GPU-0"
    assert first.memory_total_mib == 144 * 1024 - 512  # the driver's reserve is not memory anyone can have
    assert first.memory_used_mib == 10 * 1024
    assert first.processes == (GpuProcess(50, None), GpuProcess(60, 1), GpuProcess(4242, 9 * 1024))
    assert look.gpus[1].processes == ()
    assert look.problem == (
        "GPU 1 unreadable (NVML: GPU is lost); GPU 2: no process list (NVML: Not Supported); "
        "GPU 3 unreadable (NVML: RuntimeError: boom)"
    )


def test_nvml_without_v2_memory_falls_back_to_v1(monkeypatch: pytest.MonkeyPatch) -> None:
    look = nvml_look(monkeypatch, stand_in_nvml([device(0, used=GIB)], has_v2=False))
    assert look.problem is None
    (gpu,) = look.gpus
    assert (gpu.memory_total_mib, gpu.memory_used_mib) == (144 * 1024, 1024 + 512)  # v1: the reserve is "used"


def test_nvml_init_failure_with_a_driver_present_is_a_problem_and_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    binding = stand_in_nvml([device(0)])
    attempts = []

    def failing_init() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise NVMLError(4, "Insufficient Permissions")

    binding.nvmlInit = failing_init
    first = nvml_look(monkeypatch, binding)
    assert (first.source, first.gpus, first.problem) == ("nvml", (), "NVML failed to start: Insufficient Permissions")
    second = gpus.look()
    assert second.problem is None and len(second.gpus) == 1 and len(attempts) == 2


def test_nvml_utilisation_per_gpu_and_process_where_the_driver_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    binding = stand_in_nvml([device(0, compute=[(4242, GIB), (50, GIB)]), device(1, compute=[(60, GIB)])])

    def rates(h: dict) -> Any:
        if h["uuid"] == "GPU-1":
            raise NVMLError(3, "Not Supported")  # a MIG slice, say: no figure, and no problem either
        return types.SimpleNamespace(gpu=87, memory=40)

    def per_process(h: dict, since: int) -> list:
        if h["uuid"] == "GPU-1":
            raise NVMLError(3, "Not Supported")
        return [types.SimpleNamespace(pid=4242, smUtil=80, memUtil=30, timeStamp=1)]

    binding.nvmlDeviceGetUtilizationRates = rates
    binding.nvmlDeviceGetProcessUtilization = per_process
    look = nvml_look(monkeypatch, binding)
    assert look.problem is None
    assert [g.utilization_gpu for g in look.gpus] == [87, None]
    assert look.gpus[0].processes == (GpuProcess(50, 1024, None), GpuProcess(4242, 1024, 80))
    assert look.gpus[1].processes == (GpuProcess(60, 1024, None),)


# ------------------------------------------------------------------ pids


def me() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def test_describe_pid_names_a_real_process_and_its_user() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        text = gpus.describe_pid(child.pid)
        name, user = text.split(", user ")
        assert name.startswith("python") and user == me()
    finally:
        child.kill()
        child.wait()
    assert gpus.describe_pid(child.pid) == "not visible here"  # reaped: gone


def test_tree_pids_finds_children_and_grandchildren(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time; "
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pidfile)!r} + '.tmp', 'w').write(str(g.pid)); "
        f"import os; os.replace({str(pidfile)!r} + '.tmp', {str(pidfile)!r}); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        grandchild = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), what="the grandchild's pid"))
        pids = gpus.tree_pids([child.pid])
        assert pids == {child.pid, grandchild}
        assert gpus.tree_pids([child.pid, other.pid]) == {child.pid, grandchild, other.pid}
    finally:
        os.killpg(child.pid, 9)
        child.wait()
        other.kill()
        other.wait()
    assert gpus.tree_pids([child.pid, other.pid]) == set()  # gone roots are nobody's


def test_mib_text() -> None:
    assert [gpus.mib_text(m) for m in (0, 512, 1023, 1024, 9300, 12595, 20480, 81559)] == [
        "0 MiB",
        "512 MiB",
        "1023 MiB",
        "1.0 GiB",
        "9.1 GiB",
        "12.3 GiB",
        "20.0 GiB",
        "79.6 GiB",
    ]


def test_gpu_records_are_frozen() -> None:
    gpu = Gpu(0, "x", "GPU-x", 10, 0, ())
    with pytest.raises(AttributeError):
        gpu.memory_used_mib = 5  # type: ignore[misc]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="nvidia-smi is here: the check would really run")
def test_gpu_check_skips_cleanly_without_nvidia_smi() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("SKIP: no nvidia-smi")
