#!/usr/bin/env python3
"""gpuq's GPU layer on a real NVIDIA machine: `python bench/gpu_check.py`.

1. discovery: `gpuq.system.gpus.look()` beside `nvidia-smi --query-gpu=...`, both printed in the
   simulated (GPUQ_FAKE_GPUS) format, compared field by field.
2. foreign: a separate process allocates GPU memory through the CUDA driver (ctypes on
   libcuda.so.1; no torch needed); look() must list its pid with about that much memory, and
   placement must keep a whole-GPU job off that GPU, naming the pid.
3. cli: drives `gpuq` in a temporary GPUQ_HOME: two one-GPU jobs on one GPU run one after the
   other, each sees exactly its one device (a CUDA probe inside the job), and a foreign process
   holding memory delays the next job, whose `status --json` names the pid.
4. lease: a lease of the GPU taken by this process (in a temporary GPUQ_LEASE_DIR) delays a
   second start there: `gpuq lease --no-wait` (when this gpuq has it) exits 75 naming the holder,
   and a job of a worker on that GPU waits, saying why, and starts only once the lease is released.
   `--lease-only` runs this part alone, on the GPUs look() gives, simulated ones (GPUQ_FAKE_GPUS)
   included, so that it can be tried on a machine without a GPU.

Without nvidia-smi or without a GPU it prints why and exits 0. Otherwise it prints PASS, FAIL or
SKIP per part and exits 1 if any part failed. Everything it starts is stopped by pid.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import BenchError, wait_for  # noqa: E402

from gpuq.engine.schedule.placement import Placement, Request, place  # noqa: E402
from gpuq.system import gpus  # noqa: E402

SMI_FIELDS = "index,name,uuid,memory.total,memory.used"


CheckFailed = BenchError  # one part failed; the message says what was expected and what was seen


def wait_until(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    return wait_for(cond, timeout, what, interval=0.2)  # each look may run nvidia-smi: not too often


# ---------------------------------------------------------------------------------------------
# The CUDA driver through ctypes: a "foreign" memory holder and a probe of the visible devices


def _cuda() -> Any:
    lib = ctypes.CDLL("libcuda.so.1")

    def check(result: int, call: str) -> None:
        if result != 0:
            text = ctypes.c_char_p()
            lib.cuGetErrorString(result, ctypes.byref(text))
            raise RuntimeError(f"{call} failed: {result} {(text.value or b'').decode()}")

    check(lib.cuInit(0), "cuInit")
    return lib, check


def hold_memory(ordinal: int, mib: int) -> None:
    """Child mode: allocate `mib` MiB on CUDA device `ordinal`, say 'ready', sleep until killed."""
    lib, check = _cuda()
    device = ctypes.c_int()
    check(lib.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
    context = ctypes.c_void_p()
    try:
        check(lib.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate_v2")
    except AttributeError:  # a driver that dropped the old entry point: the primary context will do
        check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        check(lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    pointer = ctypes.c_uint64()
    size = ctypes.c_size_t(mib * 1024 * 1024)
    check(lib.cuMemAlloc_v2(ctypes.byref(pointer), size), "cuMemAlloc_v2")
    check(lib.cuMemsetD8_v2(pointer, ctypes.c_ubyte(1), size), "cuMemsetD8_v2")  # touched, surely resident
    check(lib.cuCtxSynchronize(), "cuCtxSynchronize")
    print(f"ready {os.getpid()}", flush=True)
    time.sleep(600)


def probe() -> None:
    """Child mode (run inside a gpuq job): the CUDA devices this process can see, as JSON."""
    lib, check = _cuda()
    count = ctypes.c_int()
    check(lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    uuids = []
    for ordinal in range(count.value):
        device = ctypes.c_int()
        check(lib.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        raw = (ctypes.c_ubyte * 16)()
        get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
        check(get_uuid(raw, device), "cuDeviceGetUuid")
        uuids.append("GPU-" + str(uuidlib.UUID(bytes=bytes(raw))))
    print(json.dumps({"count": count.value, "uuids": uuids, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}))


def start_holder(index: int, mib: int) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID")  # CUDA ordinal = NVML index
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, __file__, "--hold", str(index), "--hold-mib", str(mib)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline() if proc.stdout else ""  # bounded: the child exits on any failure
    if not line.startswith("ready "):
        stop(proc)
        raise CheckFailed(f"the memory holder did not start (exit {proc.returncode}); see its stderr above")
    return proc, int(line.split()[1])


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# ---------------------------------------------------------------------------------------------
# Part 1: discovery


def smi_gpus() -> Optional[list[dict[str, Any]]]:
    """nvidia-smi's view in the simulated format (processes left empty), or None if it fails."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        return None
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
    reserved = smi_reserved()
    return [
        {
            "index": int(r[0]),
            "name": r[1],
            "uuid": r[2],
            "memory_total_mib": int(r[3]),
            "memory_used_mib": int(r[4]),
            "processes": [],
            "reserved_mib": reserved.get(int(r[0])),
        }
        for r in rows
    ]


def smi_reserved() -> dict[int, int]:
    """memory.reserved per index where this nvidia-smi knows the field (newer drivers)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,memory.reserved", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        return {}
    pairs = [line.split(",") for line in out.stdout.splitlines() if line.strip()]
    return {int(i): int(r) for i, r in pairs if r.strip().isdigit()}


def check_discovery(look: gpus.GpuLook, smi: list[dict[str, Any]]) -> list[str]:
    print("look():", json.dumps(gpus.to_json(look), indent=1))
    print("nvidia-smi:", json.dumps({"gpus": smi}, indent=1))
    notes = []
    seen = {g.index: g for g in look.gpus}
    for row in smi:
        gpu = seen.get(row["index"])
        if gpu is None:
            raise CheckFailed(f"nvidia-smi lists GPU {row['index']}, look() does not ({look.problem})")
        if (gpu.name, gpu.uuid) != (row["name"], row["uuid"]):
            raise CheckFailed(f"GPU {gpu.index}: look() {gpu.name}/{gpu.uuid}, nvidia-smi {row['name']}/{row['uuid']}")
        reserved = row["reserved_mib"]
        expected_total = row["memory_total_mib"] - (reserved or 0)
        slack = 2 if reserved is not None else 2048  # without the field: the reserve is unknown
        if abs(gpu.memory_total_mib - expected_total) > slack:
            raise CheckFailed(f"GPU {gpu.index}: total {gpu.memory_total_mib} MiB, expected about {expected_total}")
        if abs(gpu.memory_used_mib - row["memory_used_mib"]) > 256 + (0 if reserved is not None else 2048):
            raise CheckFailed(f"GPU {gpu.index}: used {gpu.memory_used_mib} MiB, nvidia-smi {row['memory_used_mib']}")
        notes.append(
            f"GPU {gpu.index} total {gpu.memory_total_mib} (smi {row['memory_total_mib']}, reserved {reserved})"
        )
    if len(look.gpus) != len(smi):
        raise CheckFailed(f"look() has {len(look.gpus)} GPUs, nvidia-smi {len(smi)}")
    return notes


# ---------------------------------------------------------------------------------------------
# Part 2: a foreign process


def check_foreign(index: int, mib: int) -> list[str]:
    holder, pid = start_holder(index, mib)
    try:
        what = (
            f"look() to list pid {pid} on GPU {index} (if NVML shows it under another pid, this container "
            "has a pid namespace of its own and gpuq cannot tell its jobs' processes from others' here)"
        )
        listed = wait_until(lambda: _listed(index, pid), 20, what)
        gpu, used = listed
        if used is None or not mib <= used <= mib + 2048:
            raise CheckFailed(f"pid {pid} listed with {used} MiB on GPU {index}; it allocated {mib} MiB")
        blocked = place(Request(), [gpu], describe=gpus.describe_pid)
        if isinstance(blocked, Placement) or f"pid {pid}" not in blocked.reason or "python" not in blocked.reason:
            raise CheckFailed(f"a whole-GPU job beside pid {pid}: {blocked}")
        own = place(Request(), [gpu], None, [], {pid})  # as if it were a gpuq job's process
        if f"pid {pid} (a gpuq job)" not in getattr(own, "reason", ""):
            raise CheckFailed(f"pid {pid} taken for a gpuq job's process: {own}")
        shared = place(Request(1, 1024), [gpu])
        notes = [f"pid {pid} listed with {used} MiB for {mib} MiB allocated", f"whole job: {blocked.reason}"]
        notes.append(f"a 1 GiB shared job beside it: {shared}")
    finally:
        stop(holder)
    wait_until(lambda: _listed(index, pid) is None, 20, f"pid {pid} to leave GPU {index}")
    return notes


def _listed(index: int, pid: int) -> Optional[tuple[gpus.Gpu, Optional[int]]]:
    look = gpus.look()
    for gpu in look.gpus:
        for proc in gpu.processes:
            if gpu.index == index and proc.pid == pid:
                return gpu, proc.used_memory_mib
    return None


# ---------------------------------------------------------------------------------------------
# Part 3: the CLI. It relies on (all part of gpuq since issue 11):
#   A1 `gpuq add --gpus N` queues a job asking for N whole GPUs;
#   A2 `gpuq run --watch --gpus 0` limits the worker to GPU 0 and places jobs with gpuq.engine.schedule.placement
#      over gpuq.system.gpus.look() (whole-GPU jobs one at a time per GPU);
#   A3 a job gets CUDA_VISIBLE_DEVICES naming its GPU (index, or UUID) and CUDA_DEVICE_ORDER=PCI_BUS_ID
#      when it is an index;
#   A4 `gpuq status --json -a` lists jobs with "id", "state" and "waiting" (a blocked job's reason);
#   A5 the worker looks at the GPUs again within ~10 s of a foreign process leaving.
# An older gpuq without them (`gpuq add --help` lists no --gpus) gets SKIP, or FAIL with --require-cli.

JOB = """#!/bin/sh
out="$1/job-$GPUQ_JOB_ID"
echo "$(date +%s.%N)" > "$out.start"
nvidia-smi -L > "$out.smi" 2>&1
"$2" "$3" --probe > "$out.probe" 2>&1
sleep 3
echo "$(date +%s.%N)" > "$out.end"
"""


def start_worker(index: int, env: dict[str, str], log: Any) -> subprocess.Popen:
    """A gpuq worker on GPU `index` alone, its output to `log`."""
    cmd = [sys.executable, "-m", "gpuq", "run", "--watch", "--gpus", str(index)]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_worker(worker: subprocess.Popen, env: dict[str, str], log: Any) -> None:
    """The worker stopped with its jobs killed (or, if it will not stop, killed), its log closed."""
    subprocess.run([sys.executable, "-m", "gpuq", "stop", "--kill-jobs"], env=env, capture_output=True)
    try:
        worker.wait(15)
    except subprocess.TimeoutExpired:
        stop(worker)
    log.close()


def cli_wired() -> bool:
    out = subprocess.run([sys.executable, "-m", "gpuq", "add", "--help"], capture_output=True, text=True, cwd=REPO)
    return "--gpus" in out.stdout


def check_cli(index: int, mib: int, uuid_of: dict[int, str]) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="gpuq-gpu-check-") as tmp:
        root = Path(tmp)
        env = dict(os.environ, GPUQ_HOME=str(root / "spool"), PYTHONPATH=str(REPO))

        def gpuq(*args: str) -> str:
            out = subprocess.run([sys.executable, "-m", "gpuq", *args], env=env, capture_output=True, text=True)
            if out.returncode != 0:
                raise CheckFailed(f"gpuq {' '.join(args)} exited {out.returncode}: {out.stderr.strip()[-300:]}")
            return out.stdout

        def jobs() -> dict[int, dict[str, Any]]:
            return {j["id"]: j for j in json.loads(gpuq("status", "--json", "-a"))}

        def done(*ids: int) -> bool:
            states = {i: jobs()[i]["state"] for i in ids}
            wrong = {i: s for i, s in states.items() if s not in ("pending", "running", "done")}
            if wrong:
                tail = (root / "worker.out").read_text(errors="replace")[-600:]  # the folder goes at the end
                raise CheckFailed(f"jobs ended badly: {wrong}; worker output ends: {tail!r}")
            return all(s == "done" for s in states.values())

        (root / "job.sh").write_text(JOB)
        add = ["add", "-q", "--gpus", "1", "--dir", str(root), "sh", str(root / "job.sh"), str(root)]
        add += [sys.executable, __file__]
        log = open(root / "worker.out", "wb")
        worker = start_worker(index, env, log)
        holder = None
        try:
            first, second = int(gpuq(*add)), int(gpuq(*add))
            wait_until(lambda: done(first, second), 120, "two jobs to finish")
            a = [float((root / f"job-{i}.{e}").read_text()) for i in (first, second) for e in ("start", "end")]
            if not (a[1] <= a[2] or a[3] <= a[0]):
                raise CheckFailed(f"jobs #{first} and #{second} ran at the same time on GPU {index}")
            for job in (first, second):
                seen = json.loads((root / f"job-{job}.probe").read_text())
                if seen["count"] != 1 or seen["uuids"] != [uuid_of[index]]:
                    raise CheckFailed(f"job #{job} saw {seen} instead of GPU {index} ({uuid_of[index]}) alone")
            holder, pid = start_holder(index, mib)
            third = int(gpuq(*add))
            wait_until(lambda: str(pid) in (jobs()[third].get("waiting") or ""), 30, f"job #{third} to wait for pid")
            waiting = jobs()[third]
            if waiting["state"] != "pending":
                raise CheckFailed(f"job #{third} is {waiting['state']} beside a foreign {mib} MiB")
            stop(holder)
            holder = None
            wait_until(lambda: done(third), 60, f"job #{third} to run once pid {pid} is gone")
            return [f"#{first}, #{second} one after another; #{third} waited: {waiting['waiting']}"]
        finally:
            if holder is not None:
                stop(holder)
            stop_worker(worker, env, log)


# ---------------------------------------------------------------------------------------------
# Part 4: leases (issue 28). It relies on: L1 gpuq.system.leases (LeaseDir.open, take, Held.release);
#   L2 a worker counts other parties' live leases and names the holder in the job's "waiting";
#   L3 `gpuq lease --no-wait` exits 75 naming the holders when no GPU is free (optional: SKIP note).

STAMP = "import sys, time; open(sys.argv[1], 'w').write(repr(time.time()))"
LEASE_BUSY = 75  # `gpuq lease --no-wait`: no GPU free now (EX_TEMPFAIL)


def check_lease(index: int, uuid: str, count: int) -> list[str]:
    from gpuq.system.leases import LeaseDir

    with tempfile.TemporaryDirectory(prefix="gpuq-gpu-check-lease-") as tmp:
        root = Path(tmp)
        env = dict(os.environ, GPUQ_HOME=str(root / "spool"), GPUQ_LEASE_DIR=str(root / "leases"))
        env["PYTHONPATH"] = str(REPO)
        held = LeaseDir.open(str(root / "leases")).take(uuid, index, None, job=None, name="gpu_check", spool=None)
        log = open(root / "worker.out", "wb")
        worker = start_worker(index, env, log)
        try:
            notes = [_lease_no_wait(env, count)]
            stamp = root / "started"
            job = int(_gpuq(env, "add", "-q", "--gpus", "1", sys.executable, "-c", STAMP, str(stamp)))
            reason = wait_until(lambda: _waiting_for(env, job, "gpu_check"), 30, f"job #{job} to wait for the lease")
            if stamp.exists():
                raise CheckFailed(f"job #{job} started on GPU {index} while this process leased it whole")
            released = time.time()
            held.release()
            wait_until(stamp.exists, 60, f"job #{job} to start once the lease is released")
            started = float(stamp.read_text())
            if started < released:
                raise CheckFailed(f"job #{job} started {released - started:.2f} s before the lease was released")
            return notes + [f"job #{job} waited ({reason}), started {started - released:.1f} s after the release"]
        finally:
            held.release()
            stop_worker(worker, env, log)


def _lease_no_wait(env: dict[str, str], count: int) -> str:
    """`gpuq lease --no-wait` for every GPU of the machine, one of which this process leases."""
    if (
        "--no-wait"
        not in subprocess.run(
            [sys.executable, "-m", "gpuq", "lease", "--help"], env=env, capture_output=True, text=True
        ).stdout
    ):
        return "SKIP `gpuq lease`: this gpuq has no `lease --no-wait`"
    cmd = [sys.executable, "-m", "gpuq", "lease", "--no-wait", "--gpus", str(count), "--", "true"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    said = (out.stdout + out.stderr).strip()
    if out.returncode != LEASE_BUSY or "gpu_check" not in said:
        raise CheckFailed(f"`gpuq lease --no-wait` beside our lease exited {out.returncode}: {said[-300:]!r}")
    return f"`gpuq lease --no-wait` exited {LEASE_BUSY}: {said.splitlines()[-1]}"


def _gpuq(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "gpuq", *args], env=env, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise CheckFailed(f"gpuq {' '.join(args)} exited {out.returncode}: {out.stderr.strip()[-300:]}")
    return out.stdout


def _waiting_for(env: dict[str, str], job: int, holder: str) -> Optional[str]:
    """The job's reason for waiting, once it names `holder`."""
    row = next(r for r in json.loads(_gpuq(env, "status", "--json")) if r["id"] == job)
    if row["state"] != "pending":
        raise CheckFailed(f"job #{job} is {row['state']} while the GPU is leased whole")
    return row["waiting"] if holder in (row["waiting"] or "") else None


# ---------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0, help="NVML index of the GPU to use (default 0)")
    parser.add_argument("--foreign-mib", type=int, default=2048, help="what the foreign process allocates")
    parser.add_argument("--require-cli", action="store_true", help="fail, not skip, when part 3 is not wired")
    parser.add_argument("--lease-only", action="store_true", help="part 4 alone, on simulated GPUs too")
    parser.add_argument("--hold", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--hold-mib", type=int, default=2048, help=argparse.SUPPRESS)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold is not None:
        hold_memory(args.hold, args.hold_mib)
        return 0
    if args.probe:
        probe()
        return 0

    if args.lease_only:
        return lease_only(args.device)
    os.environ.pop(gpus.FAKE_ENV, None)  # this check is about the real GPUs
    if shutil.which("nvidia-smi") is None:
        print("SKIP: no nvidia-smi on this machine (no NVIDIA driver): nothing to check")
        return 0
    smi = smi_gpus()
    if not smi:
        print("SKIP: nvidia-smi finds no GPU here (or cannot talk to the driver): nothing to check")
        return 0
    look = gpus.look()
    results: list[tuple[str, str, list[str]]] = []

    def part(name: str, run: Callable[[], list[str]]) -> None:
        try:
            results.append((name, "PASS", run()))
        except CheckFailed as exc:
            results.append((name, "FAIL", [str(exc)]))
        except Exception as exc:  # a broken check is a failure too, not a crash without a summary
            results.append((name, "FAIL", [f"{type(exc).__name__}: {exc}"]))

    part("discovery", lambda: check_discovery(look, smi))
    part("foreign", lambda: check_foreign(args.device, args.foreign_mib))
    if cli_wired():
        part("cli", lambda: check_cli(args.device, args.foreign_mib, {g.index: g.uuid for g in look.gpus}))
    elif args.require_cli:
        results.append(("cli", "FAIL", ["`gpuq add --help` has no --gpus: the worker does not use the GPU layer"]))
    else:
        results.append(("cli", "SKIP", ["this gpuq's `add` has no --gpus (pass --require-cli to fail instead)"]))

    part("lease", lambda: check_lease(args.device, uuid_of(look, args.device), len(look.gpus)))
    return summary(results)


def lease_only(index: int) -> int:
    """Part 4 alone, on whatever GPUs look() gives (simulated ones included)."""
    look = gpus.look()
    if not look.gpus:
        print(f"SKIP: no GPUs ({look.problem}): set GPUQ_FAKE_GPUS to try the lease part without one")
        return 0
    try:
        results = [("lease", "PASS", check_lease(index, uuid_of(look, index), len(look.gpus)))]
    except CheckFailed as exc:
        results = [("lease", "FAIL", [str(exc)])]
    return summary(results)


def uuid_of(look: gpus.GpuLook, index: int) -> str:
    found = [g.uuid for g in look.gpus if g.index == index]
    if not found:
        raise CheckFailed(f"no GPU {index} here ({len(look.gpus)} GPUs)")
    return found[0]


def summary(results: list[tuple[str, str, list[str]]]) -> int:
    print("\nsummary")
    for name, verdict, notes in results:
        print(f"{verdict:4} {name}: {'; '.join(notes)}")
    failed = [name for name, verdict, _ in results if verdict == "FAIL"]
    print("FAIL" if failed else "PASS", f"({len(failed)} part(s) failed)" if failed else "")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
