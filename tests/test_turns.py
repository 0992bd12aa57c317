"""Turns between the users of one machine: waiting tickets beside the leases, whose turn it is on a
GPU, the machine policy's caps, and tickets that cannot be trusted ignored as leases are.

The worker's step is driven here with a fake launcher (as in tests/test_worker_step.py), the other
user's ticket or lease planted as root (a file owned by another uid, locked by this process as its
holder would lock it). tests/test_turns_users.py runs two real Unix users' workers together."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Env, wait_for
from test_gpu_worker import Gpus, fake_gpus
from test_worker_step import _add, _begin, _end, _spool, _worker

from gpuq.core.states import DONE
from gpuq.engine.schedule import turns
from gpuq.engine.schedule.planner import OtherLeases, Planner
from gpuq.engine.schedule.scheduler import Wait
from gpuq.engine.schedule.turns import Turns, first_in_line
from gpuq.system import policy
from gpuq.system.leases import LeaseDir, Ticket

THEM = 65534  # another uid (nobody's): its files are planted by root
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's files needs root")


def _plant(directory: Path, name: str, record: Any, uid: int = THEM, lock: bool = True) -> int:
    """A file in the lease directory as another user's gpuq would leave it (locked by the returned
    descriptor while `lock`); `record` written as JSON, or as bytes."""
    path = directory / name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, record if isinstance(record, bytes) else (json.dumps(record) + "\n").encode())
    os.fchown(fd, uid, uid)
    if lock:
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _unplant(directory: Path, name: str, fd: int) -> None:
    os.unlink(directory / name)
    os.close(fd)


def _ticket(uid: int = THEM, since: float = 1.0, job: int = 7, uuids: Any = None) -> dict:
    return {
        "ticket_version": 1, "user": "them", "uid": uid, "pid": 4242, "job": job, "spool": "/home/them/.gpuq",
        "gpus": 1, "mem_mib": None, "gpu_uuids": uuids, "since": since, "host": "h",
    }  # fmt: skip


def _lease(uuid: str, uid: int = THEM) -> dict:
    return {
        "lease_version": 1, "gpu_uuid": uuid, "gpu_index": 0, "mem_mib": None, "user": "them", "uid": uid,
        "pid": 4242, "pid_start": 0, "job": 9, "name": "train", "spool": "/home/them/.gpuq", "since": 1.0, "host": "h",
    }  # fmt: skip


def _planner(spool: Any, count: int, said: list[str], monkeypatch: pytest.MonkeyPatch) -> Planner:
    """A planner looking at `count` simulated GPUs (GPU-fake-0...), which its supervisors lease too."""
    path = Path(spool.home).parent / "gpus.json"
    path.write_text(json.dumps(fake_gpus(count)))
    monkeypatch.setenv("GPUQ_FAKE_GPUS", str(path))
    home = str(spool.home)
    return Planner(leases=OtherLeases(home, said.append), turns=Turns(home, said.append))


@needs_root
def test_a_job_waiting_for_another_users_gpu_holds_a_ticket_and_waits_for_their_turn(
    tmp_path: Path, own_lease_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their lease on the one GPU: our job waits and posts a ticket. Their ticket, older than ours,
    then waits for the GPU too: once their lease ends it is their turn, not ours. Once their ticket
    has gone, ours starts; the ticket is kept while the job starts and released once it runs."""
    directory = LeaseDir.open(own_lease_dir)
    spool = _spool(tmp_path)
    job = _add(spool, tmp_path)
    said: list[str] = []
    worker, launcher, _said = _worker(spool, _planner(spool, 1, said, monkeypatch))
    lease_fd = _plant(own_lease_dir, "gpuq-lease.GPU-fake-0.65534.1.1.lease", _lease("GPU-fake-0"))
    assert worker.step(time.time()).started == []
    [ours] = directory.tickets()
    assert (ours.uid, ours.job, ours.gpus, ours.spool) == (os.geteuid(), job.id, 1, spool.lease_id.read())
    assert worker.step(time.time()).turn_wait

    theirs = _plant(own_lease_dir, "gpuq-ticket.65534.1.2.ticket", _ticket(since=ours.since - 60))
    _unplant(own_lease_dir, "gpuq-lease.GPU-fake-0.65534.1.1.lease", lease_fd)
    assert worker.step(time.time()).started == []
    reason = worker.waits[job.id].reason
    assert reason.startswith("waiting for its turn on GPU 0: ") and "job #7 has waited since" in reason, reason
    assert [t.job for t in directory.tickets()] == [7, job.id], "ours is kept while it waits"

    _unplant(own_lease_dir, "gpuq-ticket.65534.1.2.ticket", theirs)
    assert worker.step(time.time()).started == [job.id]
    assert [t.job for t in directory.tickets()] == [job.id], "kept while its supervisor starts it"
    run, process = _begin(spool, launcher.lines[0])
    worker.step(time.time())
    assert directory.tickets() == [], "running: its lease holds the GPU now"
    _end(run, process)
    assert directory.usage([os.geteuid()])[os.geteuid()] > 0, "its GPU-hours recorded beside the leases"


@needs_root
def test_alone_on_the_machine_nothing_changes_and_a_supervisor_hands_on(
    tmp_path: Path, own_lease_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No other user's ticket: jobs start at once, no ticket is posted, and a supervisor may hand
    its GPU on; another user's live ticket for that GPU stops the hand-on, a ticket for another
    GPU does not."""
    directory = LeaseDir.open(own_lease_dir)
    spool = _spool(tmp_path)
    first, _second = _add(spool, tmp_path), _add(spool, tmp_path)
    said: list[str] = []
    worker, _launcher, _ = _worker(spool, _planner(spool, 1, said, monkeypatch))
    result = worker.step(time.time())
    assert result.started == [first.id] and not result.turn_wait
    assert directory.tickets() == []
    assert turns.others_waiting(["GPU-fake-0"]) is None
    elsewhere = _plant(own_lease_dir, "gpuq-ticket.65534.1.3.ticket", _ticket(uuids=["GPU-fake-1"]))
    assert turns.others_waiting(["GPU-fake-0"]) is None, "it waits for another GPU"
    anywhere = _plant(own_lease_dir, "gpuq-ticket.65534.1.4.ticket", _ticket(since=2.0, job=8))
    waiting = turns.others_waiting(["GPU-fake-0"])
    assert waiting is not None and waiting.job == 8
    _unplant(own_lease_dir, "gpuq-ticket.65534.1.3.ticket", elsewhere)
    _unplant(own_lease_dir, "gpuq-ticket.65534.1.4.ticket", anywhere)


def test_ties_go_to_the_user_with_the_fewest_recent_gpu_hours_divided_by_their_weight() -> None:
    def ticket(uid: int, user: str, since: float) -> Ticket:
        return Ticket(f"t{uid}", user, uid, 1, uid, None, 1, None, None, since, "h")

    alice, bob = ticket(1, "alice", 100.0), ticket(2, "bob", 100.2)
    used = {1: 10.0, 2: 4.0}
    plain = policy.Policy()
    assert first_in_line([alice, bob], lambda uids: used, plain) is bob, "a tie: fewer recent GPU-hours"
    weighted = policy.Policy(users={"alice": policy.Limits(None, 5.0)})
    assert first_in_line([alice, bob], lambda uids: used, weighted) is alice, "10/5 < 4/1"
    late = ticket(2, "bob", 100.0 + turns.TIE_SECONDS + 1)
    assert first_in_line([alice, late], lambda uids: used, plain) is alice, "no tie: the longest waiting"


def test_usage_decays_with_its_half_life(own_lease_dir: Path) -> None:
    directory = LeaseDir.open(own_lease_dir)
    me, week = os.geteuid(), 7 * 86400.0
    directory.add_usage(8.0, now=1000.0)
    directory.add_usage(2.0, now=1000.0)
    assert directory.usage([me], now=1000.0)[me] == pytest.approx(10.0)
    assert directory.usage([me], now=1000.0 + week)[me] == pytest.approx(5.0)
    assert directory.usage([me], now=1000.0 + week, half_life=week / 2)[me] == pytest.approx(2.5)
    assert (own_lease_dir / f"gpuq-usage.{me}").stat().st_mode & 0o777 == 0o644


def _policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, mode: int = 0o644) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    path.chmod(mode)
    monkeypatch.setenv(policy.POLICY_ENV, str(path))
    return path


@needs_root
def test_a_cap_of_one_gpu_keeps_the_second_job_waiting_and_says_why(
    tmp_path: Path, own_lease_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _policy(tmp_path, monkeypatch, "[default]\nmax_gpus = 1\n")
    spool = _spool(tmp_path)
    first, second = _add(spool, tmp_path), _add(spool, tmp_path)
    too_big = _add(spool, tmp_path, gpu_request=2)
    said: list[str] = []
    worker, launcher, _ = _worker(spool, _planner(spool, 2, said, monkeypatch))
    assert worker.step(time.time()).started == [first.id]
    assert (
        worker.waits[second.id].reason
        == "waiting for one of your jobs to end: your limit of 1 GPU at once on this machine"
    )
    assert worker.step(time.time()).started == [], "the first, starting, counts against the cap"
    assert LeaseDir.open(own_lease_dir).tickets() == [], "a capped job takes no one's turn"
    run, process = _begin(spool, launcher.lines[0])
    assert worker.step(time.time()).started == []
    _end(run, process)
    assert worker.step(time.time()).started == [second.id]
    run, process = _begin(spool, launcher.lines[1])
    _end(run, process)
    assert worker.step(time.time()).started == []
    assert worker.waits[too_big.id] == Wait("asks for 2 GPUs, over your limit of 1 GPU at once on this machine", True)


@pytest.mark.parametrize(
    "problem, mode, text",
    [
        ("is writable by others than root (mode 0666)", 0o666, "[default]\nmax_gpus = 1\n"),
        ("default.max_gpus must be a whole number >= 0", 0o644, "[default]\nmax_gpus = 'one'\n"),
    ],
)
@needs_root
def test_a_policy_file_that_cannot_be_trusted_is_ignored_with_one_line(
    tmp_path: Path, own_lease_dir: Path, monkeypatch: pytest.MonkeyPatch, problem: str, mode: int, text: str
) -> None:
    path = _policy(tmp_path, monkeypatch, text, mode)
    spool = _spool(tmp_path)
    first, second = _add(spool, tmp_path), _add(spool, tmp_path)
    said: list[str] = []
    worker, _launcher, _ = _worker(spool, _planner(spool, 2, said, monkeypatch))
    assert worker.step(time.time()).started == [first.id, second.id]
    worker.step(time.time())
    assert [line for line in said if "policy" in line] == [
        f"policy file {path} {problem}: ignored, no caps or weights apply".replace(
            f"{path} default", f"{path}: default"
        )
    ]


def test_a_policy_file_not_owned_by_root_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _policy(tmp_path, monkeypatch, "[default]\nmax_gpus = 1\n")
    if os.geteuid() == 0:
        os.chown(path, THEM, THEM)
    said: list[str] = []
    assert policy.load(said.append) == policy.NONE
    assert said == [
        f"policy file {path} is owned by uid {os.stat(path).st_uid}, not root: ignored, no caps or weights apply"
    ]


@needs_root
def test_stale_forged_symlinked_or_broken_tickets_stop_nothing(gq: Env, tmp_path: Path, own_lease_dir: Path) -> None:
    """Each planted ticket, honoured, would be first in line for the GPU forever: the jobs run, and
    the worker says each file that is not a ticket once (a stale one, unlocked, says nothing)."""
    Gpus(gq, fake_gpus(1))
    LeaseDir.open(own_lease_dir)
    outside = tmp_path / "outside.ticket"
    held = [
        _plant(own_lease_dir, "gpuq-ticket.65534.1.1.ticket", _ticket(), lock=False),  # stale
        _plant(own_lease_dir, "gpuq-ticket.65534.1.2.ticket", _ticket(uid=0), uid=THEM),  # forged owner
        _plant(own_lease_dir, "gpuq-ticket.65534.1.3.ticket", b"{not json"),  # does not parse
        _plant(tmp_path, "outside.ticket", _ticket()),
    ]
    (own_lease_dir / "gpuq-ticket.65534.1.4.ticket").symlink_to(outside)
    ids = [gq.add("--gpus", "1", "true") for _ in range(3)]
    gq.start_worker()
    for job_id in ids:
        gq.wait_state(job_id, DONE)
    out = gq.worker_output()
    for name, why in [
        ("gpuq-ticket.65534.1.2.ticket", "names uid 0 but is owned by uid 65534"),
        ("gpuq-ticket.65534.1.3.ticket", "is not JSON"),
        ("gpuq-ticket.65534.1.4.ticket", "is a symbolic link"),
    ]:
        assert out.count(f"ticket file {own_lease_dir / name} {why}: ignored") == 1, out
    assert "gpuq-ticket.65534.1.1.ticket" not in out and "Traceback" not in out
    for fd in held:
        os.close(fd)


@needs_root
def test_gpus_and_status_show_who_waits_for_what(gq: Env, own_lease_dir: Path) -> None:
    """Another user's lease on the one GPU: our job waits with a ticket, and `gpuq gpus` and
    `gpuq status` say that it waits, and for which GPU."""
    Gpus(gq, fake_gpus(1))
    LeaseDir.open(own_lease_dir)
    fd = _plant(own_lease_dir, "gpuq-lease.GPU-fake-0.65534.1.1.lease", _lease("GPU-fake-0"))
    job_id = gq.add("--gpus", "1", "true")
    gq.start_worker()
    wait_for(lambda: LeaseDir.open(own_lease_dir).tickets(), 15, what="our job's ticket")
    line = f"waiting: your job #{job_id} (1 GPU) since"

    def saying(*command: str) -> Any:
        out = gq.gpuq(*command).stdout
        return out if line in out else None

    assert wait_for(lambda: saying("gpus"), 10, what="gpus to show it")
    assert wait_for(lambda: saying("status"), 10, what="status to show it")
    _unplant(own_lease_dir, "gpuq-lease.GPU-fake-0.65534.1.1.lease", fd)
    gq.wait_state(job_id, DONE)
    wait_for(lambda: not LeaseDir.open(own_lease_dir).tickets(), 10, what="its ticket released")


@needs_root
def test_a_draining_worker_holds_no_ticket(
    tmp_path: Path, own_lease_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpuq stop --drain`: the worker starts nothing more, so its job must not hold the GPU's turn."""
    directory = LeaseDir.open(own_lease_dir)
    spool = _spool(tmp_path)
    job = _add(spool, tmp_path)
    worker, _launcher, _ = _worker(spool, _planner(spool, 1, [], monkeypatch))
    fd = _plant(own_lease_dir, "gpuq-lease.GPU-fake-0.65534.1.1.lease", _lease("GPU-fake-0"))
    worker.step(time.time())
    assert [t.job for t in directory.tickets()] == [job.id]
    worker.draining = True
    worker.step(time.time())
    assert directory.tickets() == []
    _unplant(own_lease_dir, "gpuq-lease.GPU-fake-0.65534.1.1.lease", fd)
