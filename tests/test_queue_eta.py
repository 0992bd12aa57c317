"""When the queue's ETA says pending jobs start (engine/tracking/queue_eta.py), against what the
worker then does: real jobs on simulated GPUs (GPUQ_FAKE_GPUS), a real worker."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Env, wait_for
from test_gpu_worker import Gpus, fake_gpus
from test_turns import _plant, _ticket, _unplant, needs_root

from gpuq.core.job import Job
from gpuq.core.states import DONE
from gpuq.core.times import iso_of
from gpuq.engine.tracking import eta, queue_eta
from gpuq.system.leases import LeaseDir

# A job of N steps at its own pace of half a second each, printing HF-like progress; it stops
# early once the file `stop` exists (the test's way to end it, not a wait of the test's).
PACED = """import os, sys, time
steps = int(sys.argv[1])
for step in range(1, steps + 1):
    time.sleep(0.5)
    print(f'Step {step}/{steps}', flush=True)
    if os.path.exists('stop'):
        break
"""


def test_a_dependent_starts_when_its_own_dependency_ends_not_the_first_to_end(gq: Env) -> None:
    """A (about 30 s) and B (about 8 s) run on the two GPUs; C waits for A, D for B. D starts
    when B ends: `status --json` must say so while both run, and the worker must do it while A
    still runs. (The queue's ETA gave D the first GPU to free after C took B's, i.e. A's end.)"""
    Gpus(gq, fake_gpus(2))
    gq.script("paced.py", PACED)
    a, b = gq.add("paced.py", "60"), gq.add("paced.py", "16")
    c = gq.add("--after", str(a), "paced.py", "2")
    d = gq.add("--after", str(b), "paced.py", "2")
    gq.start_worker("--watch")

    def estimated() -> Any:
        rows = {r["id"]: r for r in gq.status_json()}
        known = all(rows[j]["eta_seconds"] is not None for j in (a, b)) and rows[a]["state"] == "running"
        return known and all(rows[j]["starts_in_seconds"] is not None for j in (c, d)) and rows

    rows = wait_for(estimated, 20, interval=0.2, what="ETAs for A and B and start times for C and D")
    assert rows[b]["eta_seconds"] < rows[a]["eta_seconds"]  # B ends first
    assert rows[d]["starts_in_seconds"] == pytest.approx(rows[b]["eta_seconds"], abs=0.11), rows[d]["eta_method"]
    assert rows[c]["starts_in_seconds"] == pytest.approx(rows[a]["eta_seconds"], abs=0.11), rows[c]["eta_method"]
    assert gq.state_of(c) == "pending"
    # and the worker does start D once B has ended, while A (and so C) still waits
    gq.wait_state(d, "running", timeout=60)
    assert gq.state_of(b) == "done" and gq.state_of(a) == "running" and gq.state_of(c) == "pending"
    (gq.work / "stop").write_text("")
    gq.wait_state(c, "done", timeout=60)


def _ticket_entry(file: str, uid: int, job: int, since: float, spool: str = "/home/them/.gpuq") -> dict:
    """A ticket as a GPU view lists it under each GPU it wants (engine/schedule/gpuview.py)."""
    return {"file": file, "who": f"them's job #{job}", "uid": uid, "job": job, "gpus": 1, "mem_mib": None,
            "since": iso_of(since), "spool": spool}  # fmt: skip


def test_the_queue_eta_gives_another_users_turn_its_gpu_first() -> None:
    """Their ticket waits for any one GPU while ours run until 4 s and 10 s: their job takes GPU 0 at
    4 s for as long as no one here knows, so B starts at 10 s and C once B ends (the ETA said 4 s and
    10 s). On one GPU, B's start is unknown, saying whose turn comes first. Our own ticket (B's),
    older than theirs, goes first: B at 4 s, their turn when B ends, C at 10 s."""
    them = os.geteuid() + 1
    theirs = _ticket_entry("gpuq-ticket.t", them, 29, since=100.0)
    view = [{"index": i, "tickets": [theirs]} for i in (0, 1)]
    b, c = (Job({"id": n, "cmd": [f"job{n}"], "cwd": "/w", "after": [], "gpu_request": 1}) for n in (2, 3))
    durations = {eta.command_key(b): [5.0], eta.command_key(c): [5.0]}
    running = [(Job({"id": 1, "gpus": [0], "slot": "0"}), 4.0), (Job({"id": 9, "gpus": [1], "slot": "1"}), 10.0)]
    slots = ["0", "1", queue_eta.CPU_LANE]
    plan = queue_eta.plan_queue(
        running, [(b, None), (c, None)], slots, durations, turns=queue_eta.others_turns(view, "/spool")
    )
    assert (plan[2].starts_in, plan[3].starts_in) == (10.0, 15.0), (plan[2].method, plan[3].method)

    one = queue_eta.plan_queue(
        running[:1], [(b, None)], ["0", queue_eta.CPU_LANE], durations,
        turns=queue_eta.others_turns(view[:1], "/spool"),
    )  # fmt: skip
    assert one[2].starts_in is None
    assert one[2].method.startswith("start unknown: GPU 0: them's job #29 takes its turn first"), one[2].method

    ours = _ticket_entry("gpuq-ticket.o", os.geteuid(), 2, since=50.0, spool="/spool")
    view = [{"index": i, "tickets": [theirs, ours]} for i in (0, 1)]
    plan = queue_eta.plan_queue(
        running, [(b, None), (c, None)], slots, durations, turns=queue_eta.others_turns(view, "/spool")
    )
    assert (plan[2].starts_in, plan[3].starts_in) == (4.0, 10.0), (plan[2].method, plan[3].method)


@needs_root
def test_status_expects_no_start_before_another_users_turn(gq: Env, own_lease_dir: Path) -> None:
    """One GPU, our A running with an ETA, another user's ticket waiting for the GPU (their worker,
    planted here): B, next in our queue, starts only after their whole job, whose length no one here
    knows: its start is unknown, and says why, while A runs and once B waits for their turn (status
    said A's end, then `starts ~0s`). Once their ticket goes, B runs."""
    Gpus(gq, fake_gpus(1))
    LeaseDir.open(own_lease_dir)
    gq.script("paced.py", PACED)
    a, b = gq.add("paced.py", "12"), gq.add("paced.py", "2")
    gq.start_worker("--watch")
    wait_for(lambda: {r["id"]: r for r in gq.status_json()}[a]["eta_seconds"] is not None, 20, what="A's ETA")
    ticket = "gpuq-ticket.65534.1.1.ticket"
    fd = _plant(own_lease_dir, ticket, _ticket(since=time.time() - 60, job=29))
    turn = "start unknown: GPU 0: "

    def b_row(reason: str) -> Any:
        row = {r["id"]: r for r in gq.status_json()}[b]
        return reason in (row["waiting"] or "") and turn in row["eta_method"] and row

    row = wait_for(lambda: b_row("waiting for a free GPU"), 15, interval=0.2, what="B's start to wait for their turn")
    assert row["starts_in_seconds"] is None and "job #29 takes its turn first" in row["eta_method"], row
    row = wait_for(lambda: b_row("waiting for its turn on GPU 0"), 30, what="B to wait for their turn once A ends")
    assert row["starts_in_seconds"] is None and gq.state_of(a) == DONE
    assert f"#{b} work/paced (pending): {turn}" in gq.gpuq("eta", str(b)).stdout
    _unplant(own_lease_dir, ticket, fd)
    gq.wait_state(b, DONE, timeout=30)
