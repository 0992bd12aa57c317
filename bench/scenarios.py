"""The seven measurements of issue 4. Each takes the systems to compare and returns plain dicts
of raw samples; run.py turns them into the report. gpuq and the peers take turns sample by
sample (the order rotates every round), so a slow moment of the machine hurts all alike."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from common import (
    BenchError,
    cpu_seconds,
    read_stamp,
    rss_bytes,
    stamp_command,
    timed_run,
    wait_for,
)
from systems import REPO, Gpuq, System, bare_python, forget_pending, settle

IDLE_PAUSE = 0.25  # seconds between dispatch samples, so that each job meets an idle worker


def rotated(items: list[Any], shift: int) -> list[Any]:
    shift %= max(1, len(items))
    return items[shift:] + items[:shift]


def started(systems: list[System]) -> list[System]:
    for system in systems:
        system.start()
    return systems


# ---- 1. dispatch latency ----------------------------------------------------------------------
def dispatch(systems: list[System], root: Path, samples: int) -> dict[str, dict[str, list[float]]]:
    """Idle resident worker, then `add`: when does the job's first instruction run?
    `queued`: from the moment the add command returned; `submitted`: from its start."""
    out = {s.name: {"queued": [], "submitted": []} for s in systems}
    for n in range(samples):
        for system in rotated(systems, n):
            stamp = root / f"dispatch-{system.name}-{n}"
            t_invoke = time.time()
            job_id = system.add(stamp_command(stamp))
            t_return = time.time()
            t_job = read_stamp(stamp)
            system.wait_done(job_id)
            out[system.name]["queued"].append(t_job - t_return)
            out[system.name]["submitted"].append(t_job - t_invoke)
            settle(IDLE_PAUSE)
    return out


# ---- 2. back-to-back gap ----------------------------------------------------------------------
def back_to_back(systems: list[System], root: Path, samples: int, a_seconds: float = 0.5) -> dict[str, list[float]]:
    """Job A ends (its last instruction writes the time) -> job B, queued while A ran, starts.
    A runs until `a_seconds` after B is queued (a gate file), however long queueing B took: on a
    loaded machine a fixed A could end first, and the gap measured would be another one."""
    out: dict[str, list[float]] = {s.name: [] for s in systems}
    for n in range(samples):
        for system in rotated(systems, n):
            a_end, b_start = root / f"b2b-{system.name}-{n}-a", root / f"b2b-{system.name}-{n}-b"
            gate = root / f"b2b-{system.name}-{n}-gate"
            system.add(stamp_command(a_end, before=f"while [ ! -e {gate} ]; do sleep 0.005; done; sleep {a_seconds}"))
            b_id = system.add(stamp_command(b_start))
            b_queued = time.time()
            gate.touch()
            gap = read_stamp(b_start) - read_stamp(a_end)
            if read_stamp(a_end) < b_queued:
                raise BenchError(f"{system.name}: job A ended before B was queued; raise a_seconds")
            system.wait_done(b_id)
            out[system.name].append(gap)
            settle(IDLE_PAUSE)
    return out


# ---- 3. throughput ----------------------------------------------------------------------------
def _block(system: System, gate: Path) -> str:
    """A first job that holds the queue until `gate` exists (polled inside the job)."""
    return system.add(["bash", "-c", f"while [ ! -e {gate} ]; do sleep 0.005; done"])


def _queue_many(system: System, cmd: list[str], count: int) -> str:
    if isinstance(system, Gpuq):
        return system.enqueue_many(cmd, count)
    last = ""
    for _ in range(count):
        last = system.add(cmd)
    return last


def throughput(make: Callable[[str, Path], System], names: list[str], root: Path, jobs: int, rounds: int) -> dict:
    """`jobs` trivial jobs (`true`) queued behind a blocker; the blocker is released and the
    clock runs until the last one finished. Every round uses fresh queues."""
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in rotated(names, r):
            system = make(name, root / f"tp-{name}-{r}")
            try:
                system.start()
                gate = system.root / "go"
                _block(system, gate)
                last = _queue_many(system, ["true"], jobs)
                settle(1.0)  # let the worker see (and parse) the queued jobs before the clock starts
                t0 = time.perf_counter()
                gate.touch()
                system.wait_all_done(last, jobs + 1)
                out[name].append(jobs / (time.perf_counter() - t0))
            finally:
                system.stop()
    return out


# ---- 4. CLI latency ---------------------------------------------------------------------------
def fill_finished(gpuq: Gpuq, total: int) -> None:
    """Grow gpuq's done/ to `total` finished jobs by publishing valid job files through gpuq's
    own library (a run per job would take minutes and measure something else)."""
    gpuq.lib(fill_finished_at, str(gpuq.home), str(gpuq.work), total)


def fill_finished_at(home: str, work: str, total: int, processes: int = 2) -> None:
    """fill_finished in the library of the gpuq that owns `home`. Two processes publish disjoint id
    ranges; each file is still written, fsynced and renamed by spool.jobs.publish, and then given
    what gpuq's own finishing path leaves for a job that lands in done/ (`_landed`: its row in the
    finished index's journal), so the first `status -a` of `scale` measures a spool as gpuq's
    ending leaves it."""
    import multiprocessing

    from gpuq.spool import Spool

    spool = Spool(Path(home))
    count = total - len(spool.jobs.names("done"))
    if count <= 0:
        return
    first = spool.ids.allocate(count)  # the whole range, reserved the way `gpuq add` takes one
    bounds = [first + count * n // processes for n in range(processes + 1)]
    ranges = [(home, work, lo, hi) for lo, hi in zip(bounds, bounds[1:])]
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        pool.starmap(_publish_finished, ranges)


def _publish_finished(home: str, work: str, first: int, stop: int) -> None:
    from datetime import datetime, timedelta

    from gpuq.core import schema
    from gpuq.spool import Spool

    spool = Spool(Path(home))
    landed = _landed(spool)
    for job_id in range(first, stop):
        job = schema.new_job(
            job_id=job_id,
            name=f"bench/train-{job_id}",
            cmd=[sys.executable, "train.py", "--lr", "3e-4", "--epochs", "3"],
            cwd=work,
            log=str(spool.layout.log_path(job_id)),
            shell_env=dict(os.environ),
        )
        end = datetime.now().astimezone()
        began = (end - timedelta(seconds=3600 + job_id % 600)).isoformat(timespec="milliseconds")
        ended = end.isoformat(timespec="milliseconds")
        job.update(started_at=began, finished_at=ended, exit_code=0, attempts=1, rev=2)
        job["history"] = [{"attempt": 1, "started_at": began, "finished_at": ended, "exit_code": 0, "outcome": "done"}]
        landed(spool.jobs.publish(job, "done"))


def _landed(spool: Any) -> Callable[[Any], None]:
    """gpuq's own function that its finishing path calls once a job's file is in a finished state
    (engine/lifecycle/ending.py's `landed`: the row noted in the index's journal); nothing for a
    gpuq without one."""
    try:
        from gpuq.engine.lifecycle.ending import landed
    except ImportError:
        return lambda ref: None
    return lambda ref: landed(spool, ref)


def fill_peer(system: System, total: int, have: int) -> None:
    """Peers' finished jobs are made the only way they can be: by running `true` jobs."""
    last = ""
    for _ in range(total - have):
        last = system.add(["true"])
    if last:
        system.wait_all_done(last, total)


def cli_latency(gpuqs: list[Gpuq], peers: list[System], sizes: list[int], reps: int) -> dict:
    """Wall time of add and status/list with N finished jobs, beside `python -c pass` (of the first
    gpuq's venv: the one under test)."""
    bare = bare_python()
    out: dict[int, dict[str, list[float]]] = {}
    for system in peers:
        system.start()
    peer_have = 0
    for size in sizes:
        for gpuq in gpuqs:
            fill_finished(gpuq, size)
        if size <= max(1000, sizes[0]):
            for system in peers:
                fill_peer(system, size, peer_have)
            peer_have, live_peers = size, peers
        else:
            live_peers = []  # peers keep 10,000 finished jobs only by running 10,000 jobs: skipped
        out[size] = _time_commands(gpuqs, live_peers, bare, reps)
    return out


def _time_commands(gpuqs: list[Gpuq], peers: list[System], bare: list[str], reps: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    first = gpuqs[0]
    for n in range(reps):
        tasks: list[tuple[str, Callable[[], float]]] = [
            ("python -c pass", lambda: timed_run(bare, first.env, first.work)[0]),
        ]
        for gpuq in gpuqs:
            tasks.append((f"{gpuq.name} add", lambda g=gpuq: _gpuq_add_and_forget(g)))
            tasks.append((f"{gpuq.name} status", lambda g=gpuq: timed_run(g.list_argv(), g.env, g.work)[0]))
        for system in peers:
            tasks.append((f"{system.name} add", lambda s=system: timed_run(s.add_argv(["true"]), s.env, s.work)[0]))
            list_name = " ".join(system.list_argv()[:1] + system.list_argv()[1:])
            tasks.append((list_name, lambda s=system: timed_run(s.list_argv(), s.env, s.work)[0]))
        for label, task in rotated(tasks, n):
            samples.setdefault(label, []).append(task())
    return samples


def _gpuq_add_and_forget(gpuq: Gpuq) -> float:
    """Time one `gpuq add`, then remove the new pending job (no worker runs here), so that the
    queue the next sample sees has not grown."""
    elapsed, out = timed_run(gpuq.add_argv(["true"]), gpuq.env, gpuq.work)
    gpuq.lib(forget_pending, str(gpuq.home), int(out.strip()))
    return elapsed


# ---- 5. idle cost -----------------------------------------------------------------------------
def _sample_window(groups: dict[str, Callable[[], list[int]]], seconds: float) -> dict[str, dict[str, float]]:
    """CPU seconds used by each group's processes during the window, and their peak summed RSS."""
    pids = {name: get() for name, get in groups.items()}
    cpu0 = {name: _cpu_sum(p) for name, p in pids.items()}
    peak = {name: 0 for name in groups}
    deadline = time.monotonic() + seconds
    while True:
        for name, p in pids.items():
            peak[name] = max(peak[name], _rss_sum(p))
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(1.0, left))  # sampling pace of the observer, not a wait for a condition
    return {
        name: {
            "cpu_s": _cpu_sum(p) - cpu0[name],
            "cpu_s_per_min": (_cpu_sum(p) - cpu0[name]) * 60 / seconds,
            "rss_mb": peak[name] / 2**20,
            "processes": len(p),
        }
        for name, p in pids.items()
    }


def _cpu_sum(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def _rss_sum(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += rss_bytes(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def idle_cost(
    make: Callable[[str, Path], System], names: list[str], root: Path, seconds: float, pending: int, pause: float
) -> dict:
    """One window, every queue measured at once: each system twice, with an empty queue and with
    `pending` jobs blocked behind a running one (`sleep`). `pause` lets them go idle first."""
    empty = [make(name, root / f"idle-empty-{name}") for name in names]
    blocked = [make(name, root / f"idle-blocked-{name}") for name in names]
    queued: dict[str, int] = {}
    try:
        started(empty + blocked)
        for system in blocked:
            blocker = system.add(["sleep", "3600"])
            if isinstance(system, Gpuq):
                wait_for(lambda s=system, b=blocker: s.state(b) == "running", 30, "the gpuq blocker to run")
            queued[system.name] = min(pending, system.max_queued or pending)
            _queue_many(system, ["true"], queued[system.name])
        settle(pause)  # the workers have seen the new files and are idle again
        groups: dict[str, Callable[[], list[int]]] = {}
        for system in empty:
            groups[f"empty:{system.name}"] = system.queue_pids
        for system in blocked:
            groups[f"blocked:{system.name}"] = system.queue_pids
            if isinstance(system, Gpuq):
                groups[f"blocked:{system.name} supervisor"] = system.supervisor_only_pids
        window = _sample_window(groups, seconds)
    finally:
        for system in empty + blocked:
            system.stop()
    out: dict[str, dict] = {"empty": {}, "blocked": {}}
    for key, value in window.items():
        phase, name = key.split(":", 1)
        out[phase][name] = dict(value, queued=0 if phase == "empty" else queued.get(name.split()[0], pending))
    return out


# ---- 6. log size ------------------------------------------------------------------------------
def _progress_job(sparse_bytes: int, ready: Path) -> list[str]:
    """A running job whose log ends in tqdm-style progress after `sparse_bytes` of (sparse) log;
    it touches `ready` once its log is complete, then sleeps."""
    grow = f"truncate -s {sparse_bytes} /dev/stdout; " if sparse_bytes else ""
    lines = "for i in $(seq 1 12); do printf '%d/100 [00:%02d<01:30, 1.10it/s]\\r' $i $i; echo \" loss 0.$i\"; done"
    return ["bash", "-c", f"{grow}{lines}; touch {ready}; exec sleep 3600"]


def log_size(root: Path, big_bytes: int, reps: int) -> dict[str, list[float]]:
    """`gpuq status` with one running job whose log is about 1 KB, beside one whose log is
    `big_bytes` (sparse, so it costs no disk time to make; its tail is real text)."""
    small, big = Gpuq(root / "log-1KB"), Gpuq(root / "log-big")
    out: dict[str, list[float]] = {"1 KB": [], "big": [], "sizes": []}
    try:
        for system, size in ((small, 0), (big, big_bytes)):
            system.start()
            ready = system.root / "log-ready"
            job_id = system.add(_progress_job(size, ready))
            wait_for(ready.exists, 60, "the job's log to be written")
            out["sizes"].append(float(os.path.getsize(system.spool.layout.log_path(int(job_id)))))
        for n in range(reps):
            for label, system in rotated([("1 KB", small), ("big", big)], n):
                out[label].append(timed_run(system.list_argv(), system.env, system.work)[0])
    finally:
        small.stop()
        big.stop()
    return out


# ---- 7. scale ---------------------------------------------------------------------------------
# The first `status -a` builds the index (cache/finished-jobs) from the journal of rows that gpuq's
# finishing path left (the files filled since the last index, as many as `total` when `scale` runs
# alone), reading only the files without a row; then, the cache removed, the first `status -a` of a
# spool without any journal (files dropped by hand, an older gpuq) reads every file. Later calls
# read the index.
FIRST_STATUS_ALL = "gpuq status -a, first run (the index built with the journal gpuq's ending leaves)"
FIRST_NO_JOURNAL = "gpuq status -a, first run without any journal (every file read)"


def scale(gpuq: Gpuq, total: int, reps: int) -> dict[str, list[float]]:
    fill_finished(gpuq, total)
    commands = {
        "gpuq status": gpuq.list_argv(),
        "gpuq status -a": [*gpuq.list_argv(), "-a"],
        "gpuq add": None,
        "python -c pass": bare_python(),
    }
    out: dict[str, list[float]] = {label: [] for label in commands}
    out[FIRST_STATUS_ALL] = [timed_run([*gpuq.list_argv(), "-a"], gpuq.env, gpuq.work)[0]]
    for name in ("finished-jobs", "finished-jobs.journal"):
        (gpuq.home / "cache" / name).unlink(missing_ok=True)
    out[FIRST_NO_JOURNAL] = [timed_run([*gpuq.list_argv(), "-a"], gpuq.env, gpuq.work)[0]]
    for n in range(reps):
        for label, argv in rotated(list(commands.items()), n):
            if argv is None:
                out[label].append(_gpuq_add_and_forget(gpuq))
            else:
                out[label].append(timed_run(argv, gpuq.env, gpuq.work)[0])
    return out


__all__ = ["dispatch", "back_to_back", "throughput", "cli_latency", "idle_cost", "log_size", "scale", "REPO"]
__all__ += ["FIRST_STATUS_ALL", "FIRST_NO_JOURNAL"]
