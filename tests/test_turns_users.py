"""Turns between two real Unix users (made as tests/test_lease_users.py makes them), each with a
spool and a worker of their own, on simulated GPUs: both workers started together take turns on one
GPU, and a machine policy's cap of one GPU per user holds on two. The jobs stamp their own start and
end, from which the order of starts and any overlap are read."""

from __future__ import annotations

import json
import os
import signal

from conftest import wait_for
from test_lease_users import GPU_TOTAL_MIB, User, _finish, _most_at_once, users  # noqa: F401 - the fixture, used by name

from gpuq.system.leases import LeaseDir


def _starts(*pairs: tuple[User, list[int]]) -> list[str]:
    """Whose job started, in the order they started."""
    stamped = sorted((start, user.name) for user, ids in pairs for start, _end, _who in user.intervals(ids))
    return [name for _start, name in stamped]


def test_two_users_started_together_take_turns_on_one_gpu(users: tuple[User, User]) -> None:  # noqa: F811
    """10 short jobs each (a second: longer than a tie between two waiting users), one GPU: no user
    starts more than two jobs in a row while the other has one waiting, nothing overlaps, and each
    user's GPU-hours are kept beside the leases."""
    alice, bob = users
    ids = {alice: alice.add(10, 1.0), bob: bob.add(10, 1.0)}
    alice.start_worker()
    bob.start_worker()
    _finish(alice, bob, timeout=120)
    count, together = _most_at_once(alice.intervals(ids[alice]) + bob.intervals(ids[bob]))
    assert count == 1, f"on the GPU at once: {together}"
    order = _starts((alice, ids[alice]), (bob, ids[bob]))
    for i in range(len(order) - 2):
        three = order[i : i + 3]
        other_waits = any(name != three[0] for name in order[i + 3 :])
        assert not (len(set(three)) == 1 and other_waits), (
            f"{three[0]} started three in a row: {order}\n{alice.worker_output()}\n{bob.worker_output()}"
        )
    directory = LeaseDir.open(alice.dir.parent / "leases")
    used = directory.usage([alice.uid, bob.uid])
    assert used[alice.uid] > 0 and used[bob.uid] > 0, used
    assert directory.problems == []


def test_a_cap_of_one_gpu_per_user_on_two_gpus_runs_one_job_of_each_user_at_a_time(  # noqa: F811
    users: tuple[User, User],  # noqa: F811
) -> None:
    alice, bob = users
    base = alice.dir.parent
    gpus = [
        {"index": i, "name": "Fake H100", "uuid": f"GPU-fake-shared-{i}", "memory_total_mib": GPU_TOTAL_MIB,
         "memory_used_mib": 0, "processes": []}
        for i in range(2)
    ]  # fmt: skip
    (base / "gpus.json").write_text(json.dumps({"gpus": gpus}))
    policy = base / "policy.toml"
    policy.write_text("[default]\nmax_gpus = 1\n")
    policy.chmod(0o644)
    os.chown(policy, 0, 0)
    for user in (alice, bob):
        user.env["GPUQ_POLICY"] = str(policy)
    # 1.5 s each: the cap is said for about 6 s, which a look taking a second under load still sees
    ids = {alice: alice.add(4, 1.5), bob: bob.add(4, 1.5)}
    alice.start_worker()
    bob.start_worker()
    why = "waiting for one of your jobs to end: your limit of 1 GPU at once on this machine"
    wait_for(lambda: any(why in alice.waiting(j) for j in ids[alice]), 20, what="alice's job to say the cap")
    _finish(alice, bob, timeout=60)
    for user in (alice, bob):
        count, together = _most_at_once(user.intervals(ids[user]))
        assert count == 1, f"{user.name}'s jobs at once: {together}"
    assert "policy file" not in alice.worker_output() + bob.worker_output()


def test_a_stopped_workers_ticket_keeps_the_other_user_off_no_gpu(users: tuple[User, User]) -> None:  # noqa: F811
    """bob's job waits for alice's with a ticket, and bob stops his worker (Ctrl-Z): alice's next job
    starts when her first ends, instead of waiting for ever for bob's turn, which no stopped worker takes."""
    alice, bob = users
    [first] = alice.add(1, 0, go=True)
    alice.start_worker()
    wait_for(lambda: (alice.job(first).get("supervisor") or {}).get("pid"), 20, what="alice's job running")
    [waiting] = bob.add(1, 0.05)
    bob.start_worker()
    assert bob.worker is not None
    leases = LeaseDir.open(alice.dir.parent / "leases")
    wait_for(lambda: [t for t in leases.tickets() if t.uid == bob.uid], 20, what="bob's job's ticket")
    os.kill(bob.worker.pid, signal.SIGSTOP)
    try:
        [second] = alice.add(1, 0.05)
        (alice.dir / "go").touch()
        wait_for(lambda: (alice.dir / f"e.{second}").exists(), 20, what="alice's next job to run")
    finally:
        os.kill(bob.worker.pid, signal.SIGCONT)
    wait_for(lambda: (bob.dir / f"e.{waiting}").exists(), 20, what="bob's job to run once his worker goes on")
