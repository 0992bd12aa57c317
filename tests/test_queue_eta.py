"""When the queue's ETA says pending jobs start (engine/tracking/queue_eta.py), against what the
worker then does: real jobs on simulated GPUs (GPUQ_FAKE_GPUS), a real worker."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Env, wait_for
from test_gpu_worker import Gpus, fake_gpus

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
