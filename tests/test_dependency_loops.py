"""Jobs that wait for themselves through other waiting jobs (a loop that came by hand-made job files
or `gpuq import`, not by `gpuq edit`, which refuses one): blocked, as a job after a missing one is,
so that `gpuq run` exits, `status` says blocked and `triage` says why."""

from __future__ import annotations

import json
import os

from conftest import Env

from gpuq.core.job import Job
from gpuq.engine.schedule.scheduler import QueueState, dependency_loops, waiting_reasons


def _pending(deps: dict[int, list[int]]) -> QueueState:
    jobs = [Job({"id": job_id, "after": after}) for job_id, after in deps.items()]
    return QueueState({job_id: "pending" for job_id in deps}, jobs)


def test_every_job_of_a_loop_and_after_one_is_blocked_in_any_order() -> None:
    # 1 -> 2 -> 1 and 1 -> 3 -> 2: 3 is on a loop the search may meet only through a finished job
    deps = {1: [2, 3], 2: [1], 3: [2], 4: [3], 5: [], 6: [5]}
    for order in ([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1], [3, 4, 1, 6, 2, 5]):
        reasons = waiting_reasons(_pending({i: deps[i] for i in order}))
        blocked = sorted(i for i, wait in reasons.items() if wait is not None and wait.forever)
        assert blocked == [1, 2, 3, 4], order
        assert reasons[5] is None and reasons[6] is not None and not reasons[6].forever
    reasons = waiting_reasons(_pending(deps))
    assert reasons[1] is not None and reasons[1].reason == "waits for itself (#1 after #2 after #1)"
    assert reasons[4] is not None and reasons[4].reason == "after #3 (blocked itself)"


def test_a_long_loop_is_found_without_deep_recursion() -> None:
    count = 5000  # a recursive search would pass Python's recursion limit
    deps = {i: [i % count + 1] for i in range(1, count + 1)}
    loops = dependency_loops(deps)
    assert sorted(loops) == list(range(1, count + 1))
    assert loops[1][:3] == [1, 2, 3] and loops[1][-2:] == [count, 1] and len(loops[1]) == count + 1


def _wait_for_by_hand(gq: Env, job_id: int, after: list[int]) -> None:
    """Change a canonical job file the way a person with an editor would: a new file in its place."""
    (path,) = (gq.home / "pending").glob(f"{job_id:06d}-*.json")
    data = dict(json.loads(path.read_text()), after=after)
    new = path.with_name(".by-hand")
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
    os.replace(new, path)


def test_jobs_waiting_for_each_other_are_blocked_and_run_exits(gq: Env) -> None:
    """Before: `gpuq run` waited for them for ever, and status and triage said a worker would start them."""
    first = gq.add("--", "true")
    second = gq.add("--after", str(first), "--", "true")
    third = gq.add("--after-any", str(first), "--", "true")
    free = gq.add("--", "true")
    _wait_for_by_hand(gq, first, [second])

    status = gq.gpuq("status").stdout
    assert f"blocked: waits for itself (#{first} after #{second} after #{first})" in status
    assert f"blocked: waits for itself (#{second} after #{first} after #{second})" in status
    assert f"blocked: after-any #{first} (blocked itself)" in status
    assert "nothing will start" not in status  # the free job will

    triage = json.loads(gq.gpuq("triage", str(first), "--json").stdout)
    assert triage["waiting_for"] == f"blocked: waits for itself (#{first} after #{second} after #{first})"
    assert [fix["command"] for fix in triage["fixes"]] == [f"gpuq edit {first} --set 'after=[]'"]
    behind = json.loads(gq.gpuq("triage", str(third), "--json").stdout)
    assert behind["waiting_for"] == f"blocked: after-any #{first} (blocked itself)"
    assert not any("run --daemon" in fix["command"] for fix in behind["fixes"])  # a worker would not start it

    run = gq.gpuq("run", timeout=30)  # exits once nothing more can start
    assert gq.state_of(free) == "done"
    assert [gq.state_of(i) for i in (first, second, third)] == ["pending"] * 3
    assert f"#{first} work/true: waits for itself (#{first} after #{second} after #{first})" in run.stdout
    assert "nothing will start: 3 pending jobs blocked" in gq.gpuq("status").stdout
