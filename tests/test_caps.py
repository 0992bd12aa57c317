"""The machine policy's cap (turns.CapGate) as placement keeps it: a job that asks for more GPUs than
the cap holds no GPU for the jobs behind it, one that waits for its user's jobs is first in line, the
queue's ETA expects it when those jobs end, and a policy of nan or inf numbers is refused. The
planner alone on simulated GPUs, then real workers (tests/test_turns.py has the turns between users)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from conftest import WAIT_FOR_GO, Env, wait_for
from test_gpu_worker import Gpus, fake_gpus
from test_queue_eta import PACED
from test_turns import _policy, needs_root

from gpuq.core.job import Job
from gpuq.core.states import DONE, PENDING, RUNNING
from gpuq.engine.schedule.planner import OtherLeases, Planner
from gpuq.engine.schedule.scheduler import QueueState, Wait
from gpuq.engine.schedule.turns import Turns
from gpuq.engine.tracking import queue_eta
from gpuq.spool import Spool
from gpuq.system import policy
from gpuq.system.gpus import from_json, look

OVER = "asks for 2 GPUs, over your limit of 1 GPU at once on this machine"


def _limit(cap: int) -> str:
    return (
        f"waiting for one of your jobs to end: your limit of {cap} GPU{'s' if cap != 1 else ''} at once on this machine"
    )


def _plan(tmp_path: Path, gpus: int, *requests: tuple[int, Optional[int]]) -> Any:
    """What a worker's planner starts on `gpus` simulated GPUs with nothing running, of pending jobs
    #1, #2... asking for (GPUs, MiB on each or None: whole)."""
    shown = look()._replace(gpus=from_json(fake_gpus(gpus)), source="fake", problem=None)
    jobs = [
        Job({"id": n, "name": f"j{n}", "rev": 0, "priority": 0, "after": [], "after_any": [], "gpu_request": count,
             "gpu_mem_mib": mem})
        for n, (count, mem) in enumerate(requests, 1)
    ]  # fmt: skip
    home, said = str(tmp_path / "spool"), []  # type: tuple[str, list[str]]
    planner = Planner(look=lambda: shown, leases=OtherLeases(home, said.append), turns=Turns(home, said.append))
    plan = planner.plan(QueueState({job.id: PENDING for job in jobs}, jobs, [], time.time()), {})
    assert said == []
    return plan


@needs_root  # the policy file must be root's
def test_a_job_over_the_cap_holds_no_gpu_for_the_jobs_behind_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cap 1 on two GPUs: #1 asks for both and waits for good, holding nothing; #2 starts; #3 (a
    share) waits for the cap, not for GPUs #1 would have."""
    _policy(tmp_path, monkeypatch, "[default]\nmax_gpus = 1\n")
    plan = _plan(tmp_path, 2, (2, None), (1, None), (1, 5120))
    assert [(job.id, where.gpus) for job, where in plan.starts] == [(2, (0,))]
    assert plan.waits[1] == Wait(OVER, True)
    assert plan.waits[3] == Wait(_limit(1), False)


@needs_root
def test_the_cap_counts_gpus_held_not_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cap 1: two 5G shares on one GPU hold one GPU (the second waited for "one of your jobs to end");
    cap 2 on four GPUs: four 10G shares run, on at most two GPUs."""
    _policy(tmp_path, monkeypatch, "[default]\nmax_gpus = 1\n")
    plan = _plan(tmp_path, 2, (1, 5120), (1, 5120))
    assert [(job.id, where.gpus) for job, where in plan.starts] == [(1, (0,)), (2, (0,))] and plan.waits == {}
    _policy(tmp_path, monkeypatch, "[default]\nmax_gpus = 2\n")
    plan = _plan(tmp_path, 4, *[(1, 10240)] * 4)
    assert len(plan.starts) == 4 and len({g for _job, where in plan.starts for g in where.gpus}) <= 2


@needs_root
def test_a_job_the_cap_holds_back_is_first_in_line_and_smaller_ones_do_not_overtake_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cap 2 on four GPUs: #1 takes one; #2 (two) would pass the cap and waits; #3 (one) would fit
    under it but waits behind #2, else a stream of single-GPU jobs would keep #2 waiting for ever."""
    _policy(tmp_path, monkeypatch, "[default]\nmax_gpus = 2\n")
    plan = _plan(tmp_path, 4, (1, None), (2, None), (1, None))
    assert [job.id for job, _where in plan.starts] == [1]
    assert plan.waits[2] == Wait(_limit(2), False) and plan.waits[3] == Wait(_limit(2), False)


def _cap_of_one_on_two_gpus(gq: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two simulated GPUs, and a machine policy capping each user at one, for the test's workers."""
    Gpus(gq, fake_gpus(2))
    gq.env[policy.POLICY_ENV] = str(_policy(tmp_path, monkeypatch, "[default]\nmax_gpus = 1\n"))


@needs_root
def test_a_worker_runs_the_jobs_behind_one_over_the_cap(
    gq: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tester's queue: cap 1 on two GPUs, #1 asks for both, #2 a whole GPU, #3 a share: #2 and
    #3 run, and the worker, left with #1 alone, says it waits for good."""
    _cap_of_one_on_two_gpus(gq, tmp_path, monkeypatch)
    cap = gq.env.pop(policy.POLICY_ENV)
    two = gq.add("--gpus", "2", "true")  # queued before the cap was set: `add` refuses it under the cap
    gq.env[policy.POLICY_ENV] = cap
    one, small = gq.add("true"), gq.add("--gpu-mem", "5G", "true")
    gq.start_worker()
    gq.wait_state(one, DONE)
    gq.wait_state(small, DONE)
    gq.workers[0].wait(timeout=15)  # nothing more can start: a worker without --watch ends
    assert f"#1 work/true: {OVER}" in gq.worker_output() and gq.state_of(two) == PENDING


@needs_root
def test_a_job_over_the_cap_is_refused_by_add_and_shown_blocked_without_a_worker(
    gq: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cap 1 on two GPUs, no worker: `add --gpus 2` is refused (exit 2, nothing queued), as a job
    larger than the machine is. One queued before the cap was set is blocked by it, as `status`,
    `eta` and `triage` say, and triage's fix lowers its GPUs (they said only that no worker ran,
    and triage offered to start one, which then said the cap)."""
    _cap_of_one_on_two_gpus(gq, tmp_path, monkeypatch)
    refused = gq.gpuq("add", "--gpus", "2", "true", check=False)
    assert refused.returncode == 2 and refused.stderr.startswith(f"gpuq add: {OVER}, set by the machine's policy")
    assert gq.files("pending") == []
    cap = gq.env.pop(policy.POLICY_ENV)
    job = gq.add("--gpus", "2", "true")
    gq.env[policy.POLICY_ENV] = cap
    [row] = gq.status_json()
    assert row["waiting"] == OVER and row["starts_in_seconds"] is None
    assert gq.gpuq("eta").stdout == f"#{job} work/true (pending): will not start by itself: {OVER}\n"
    triage = json.loads(gq.gpuq("triage", "--json", str(job)).stdout)
    assert triage["waiting_for"] == f"blocked: {OVER}"
    assert [fix["command"] for fix in triage["fixes"]] == [f"gpuq edit {job} --set gpus=1"]
    gq.gpuq("edit", str(job), "--set", "gpus=1")
    gq.start_worker()
    gq.wait_state(job, DONE)


def test_the_queue_eta_keeps_the_cap() -> None:
    """Cap 1: a job behind the running one starts when it ends, the next one when that one ends
    (unknown: no earlier run). With no cap, both start at once on the free GPUs."""
    running = Job({"id": 1, "gpus": [0], "slot": "0"})
    b, c = (Job({"id": n, "cmd": ["b"], "cwd": "/w", "after": [], "gpu_request": 1}) for n in (2, 3))
    slots = ["0", "1", "2", queue_eta.CPU_LANE]
    plan = queue_eta.plan_queue([(running, 4.0)], [(b, None), (c, None)], slots, {}, cap=1)
    assert plan[2].starts_in == 4.0 and plan[3].starts_in is None
    free = queue_eta.plan_queue([(running, 4.0)], [(b, None), (c, None)], slots, {})
    assert free[2].starts_in == 0.0 and free[3].starts_in == 0.0
    unknown = queue_eta.plan_queue([(running, None)], [(b, None)], slots, {}, cap=1)
    assert unknown[2].starts_in is None and unknown[2].method.startswith("start unknown")


def test_the_queue_eta_counts_gpus_held_not_jobs() -> None:
    """Cap 2, two shares running on GPU 0: they hold one GPU, so a whole-GPU job takes GPU 1 now, as
    placement starts it (the ETA counted two GPUs held and expected it once both shares ended)."""
    shares = [Job({"id": n, "gpus": [0], "slot": "0", "gpu_mem_mib": 5120}) for n in (1, 2)]
    whole = Job({"id": 3, "cmd": ["w"], "cwd": "/w", "after": [], "gpu_request": 1})
    slots = ["0", "1", queue_eta.CPU_LANE]
    plan = queue_eta.plan_queue([(shares[0], 10.0), (shares[1], 20.0)], [(whole, None)], slots, {}, cap=2)
    assert plan[3].starts_in == 0.0, plan[3].method
    one = queue_eta.plan_queue([(shares[0], 10.0), (shares[1], 20.0)], [(whole, None)], slots, {}, cap=1)
    assert one[3].starts_in == 20.0  # cap 1: GPU 0 is held until both shares have ended


def test_the_cap_for_the_eta_is_the_workers_less_the_users_leases_elsewhere() -> None:
    def view(cap: Any, spool: str, uid: int = os.geteuid()) -> dict:
        return {"max_gpus": cap, "gpus": [{"index": 0, "leases": [{"uid": uid, "spool": spool}]}]}

    assert queue_eta.gpu_cap(view(2, "/home/me/.gpuq"), "/home/me/.gpuq") == 2  # its own jobs: running/
    assert queue_eta.gpu_cap(view(2, "/elsewhere"), "/home/me/.gpuq") == 1
    assert queue_eta.gpu_cap(view(2, "/elsewhere", uid=os.geteuid() + 1), "/home/me/.gpuq") == 2
    assert queue_eta.gpu_cap(view(None, "/elsewhere"), "/home/me/.gpuq") is None
    assert queue_eta.gpu_cap(None, "/home/me/.gpuq") is None


@needs_root
def test_status_expects_a_job_the_cap_holds_back_when_the_users_job_ends(
    gq: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cap 1 on two GPUs, A running with an ETA, B waiting for it: B starts when A ends, not now."""
    _cap_of_one_on_two_gpus(gq, tmp_path, monkeypatch)
    gq.script("paced.py", PACED)
    a, b = gq.add("paced.py", "60"), gq.add("paced.py", "2")
    gq.start_worker("--watch")

    def estimated() -> Any:
        rows = {r["id"]: r for r in gq.status_json()}
        known = rows[a]["state"] == "running" and rows[a]["eta_seconds"] is not None
        return known and rows[b]["starts_in_seconds"] is not None and rows

    rows = wait_for(estimated, 20, interval=0.2, what="an ETA for A and a start for B")
    assert rows[b]["waiting"] == _limit(1)
    assert rows[b]["starts_in_seconds"] == pytest.approx(rows[a]["eta_seconds"], abs=0.11), rows[b]["eta_method"]
    (gq.work / "stop").write_text("")
    gq.wait_state(b, DONE, timeout=60)


@needs_root
def test_add_takes_a_job_over_a_cap_root_has_removed_since_the_worker_looked(
    gq: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle `run --watch` worker's GPU view keeps the cap it saw: `add` read it there, and kept
    refusing the job for hours after root had removed the cap; it reads the file as it is now."""
    _cap_of_one_on_two_gpus(gq, tmp_path, monkeypatch)
    sp = Spool(gq.home).ensure()
    gq.start_worker("--watch")
    wait_for(lambda: [v.get("max_gpus") for v in sp.workers.gpu_views()] == [1], what="the worker's view of the cap")
    assert gq.gpuq("add", "--gpus", "2", "true", check=False).returncode == 2
    Path(gq.env[policy.POLICY_ENV]).write_text("[default]\n")  # root lifts the cap
    job = gq.add("--gpus", "2", "true")
    gq.wait_state(job, DONE)


@needs_root
def test_a_policy_file_made_writable_by_others_stops_counting_at_once_and_every_view_says_so(
    gq: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`chmod 666` changes neither the file's mtime nor its size, by which a worker kept its policy:
    it went on enforcing the cap that `gpuq lease` said was ignored, and `gpus` and `status` said nothing."""
    _cap_of_one_on_two_gpus(gq, tmp_path, monkeypatch)
    gq.script("wait.py", WAIT_FOR_GO)
    first, second = gq.add("wait.py"), gq.add("wait.py")
    gq.start_worker("--watch")

    def waiting() -> str:
        return next(row for row in gq.status_json() if row["id"] == second)["waiting"] or ""

    wait_for(lambda: waiting() == _limit(1), what="the second job to wait for the cap")
    path = Path(gq.env[policy.POLICY_ENV])
    path.chmod(0o666)
    gq.wait_state(second, RUNNING)
    line = f"policy file {path} is writable by others than root (mode 0666): ignored, no caps or weights apply"
    assert gq.worker_output().count(line) == 1, gq.worker_output()
    for command in ("gpus", "status"):
        shown = gq.gpuq(command).stdout
        assert shown.count(line) == 1, shown
    (gq.work / "go").touch()
    gq.wait_state(first, DONE)
    gq.wait_state(second, DONE)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("half_life_days = nan\n", "half_life_days must be a finite number of days above 0"),
        ("half_life_days = inf\n", "half_life_days must be a finite number of days above 0"),
        ("[default]\nweight = nan\n", "default.weight must be a finite number above 0"),
        ("[users.alice]\nweight = inf\n", "users.alice.weight must be a finite number above 0"),
    ],
)
def test_nan_and_inf_are_refused(text: str, problem: str) -> None:
    with pytest.raises(ValueError) as refused:
        policy.parse(text.encode())
    assert str(refused.value) == problem
