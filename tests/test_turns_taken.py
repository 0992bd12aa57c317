"""What another user's tickets and leases cannot do to a worker (lease_layout.md section 7): a file
with an impossible `since` stops no gpuq, a ticket whose holder never takes its turn keeps a free GPU
from the others for TURN_GRACE_SECONDS only, and a job that waits for host memory takes no GPU's turn.

The other user's files are written and held by a real process, as a 15-line script of theirs would:
a child that writes them (owned by another uid where the test runs as root), takes their flock and
waits to be killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import WAIT_FOR_GO, Env, wait_for
from test_gpu_worker import Gpus, fake_gpus
from test_turns import THEM, _lease, _ticket, needs_root

from gpuq.core.states import DONE
from gpuq.core.times import parse_iso
from gpuq.engine.schedule.gpuview import ticket_entry
from gpuq.engine.schedule.turns import TURN_GRACE_SECONDS, Patience, turn_reason
from gpuq.system.leases import LeaseDir, Ticket

# Writes each (name, JSON object) given, with its own pid as `pid`, owned by the uid given; locks them
# as a lease's holder does, says so, and holds them until it is killed.
HOLDER = """import fcntl, json, os, signal, sys
directory, uid, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for name, text in zip(files[::2], files[1::2]):
    record = dict(json.loads(text), pid=os.getpid())
    fd = os.open(os.path.join(directory, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, (json.dumps(record) + "\\n").encode())
    os.fchown(fd, uid, uid)
    fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
signal.pause()
"""


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        proc.send_signal(signal.SIGKILL)  # a stopped one too
        proc.wait()


def _hold(started: list[subprocess.Popen], directory: Path, uid: int, *files: tuple[str, dict]) -> subprocess.Popen:
    """A process holding these files in the lease directory (made first, 1777, as root or a user's gpuq makes it)."""
    LeaseDir.open(directory)
    argv = [sys.executable, "-c", HOLDER, str(directory), str(uid)]
    for name, record in files:
        argv += [name, json.dumps(record)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    started.append(proc)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


@pytest.mark.parametrize("since", [1e300, 10**400, 253402300800], ids=["1e300", "10**400", "year 10000"])
def test_a_ticket_and_a_lease_with_an_impossible_since_stop_no_gpuq(
    gq: Env, own_lease_dir: Path, holders: list[subprocess.Popen], since: Any
) -> None:
    """Held by a live process, they are files that do not parse: each said once, ignored, and the
    worker, status, gpus and lease --no-wait all go on (they printed a traceback, the worker died)."""
    Gpus(gq, fake_gpus(2))
    uid = THEM if os.geteuid() == 0 else os.geteuid()  # another user's, where the test can make one
    ticket = f"gpuq-ticket.{uid}.1.1.ticket"
    lease = f"gpuq-lease.GPU-fake-0.{uid}.1.2.lease"
    hostile = [(ticket, _ticket(uid=uid, since=since)), (lease, dict(_lease("GPU-fake-0", uid), since=since))]
    _hold(holders, own_lease_dir, uid, *hostile)
    worker = gq.start_worker("--watch")
    job = gq.add("--gpus", "1", "true")
    gq.wait_state(job, DONE)
    for command in (["status"], ["gpus"], ["gpus", "--json"], ["lease", "--no-wait", "--", "true"]):
        proc = gq.gpuq(*command, check=False)
        assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr, (command, proc.stderr)
    shown = gq.gpuq("gpus").stdout
    for name in (ticket, lease):
        assert f"{own_lease_dir / name} has a bad since: ignored" in shown, shown
    assert worker.poll() is None, gq.worker_output()
    out = gq.worker_output()
    assert out.count(f"ticket file {own_lease_dir / ticket} has a bad since: ignored") == 1, out
    assert "Traceback" not in out


@pytest.mark.parametrize("since", [1e300, 1e18, 253402300800, -1e300])
def test_a_time_no_platform_can_show_is_shown_safely(since: float) -> None:
    """Behind the reading boundary, formatting does not raise either: views say nothing, reasons `?`."""
    ticket = Ticket("t", "bob", THEM, 1, 30, None, 1, None, None, since, "h")
    assert ticket_entry(ticket, os.geteuid(), "/home/me/.gpuq")["since"] == ""
    assert turn_reason(ticket, 0).endswith("bob's job #30 has waited since ?")


@needs_root  # another user's lease
def test_a_job_that_waits_for_host_memory_takes_no_gpus_turn(
    gq: Env, own_lease_dir: Path, holders: list[subprocess.Popen]
) -> None:
    """Another user holds GPU 1; the second of two 3G jobs waits for the worker's 4G of host memory,
    not for a GPU: it posts no ticket, and GPU 0, free, is no one's turn."""
    Gpus(gq, fake_gpus(3))
    _hold(holders, own_lease_dir, THEM, (f"gpuq-lease.GPU-fake-1.{THEM}.1.1.lease", _lease("GPU-fake-1")))
    gq.script("wait.py", WAIT_FOR_GO)
    first = gq.add("--mem", "3G", "--gpus", "1", "wait.py")
    second = gq.add("--mem", "3G", "--gpus", "1", "true")
    gq.start_worker("--watch", "--mem", "4G")
    gq.wait_state(first, "running")

    def reason() -> str:
        return next(r for r in gq.status_json() if r["id"] == second)["waiting"] or ""

    wait_for(lambda: "waiting for host memory" in reason(), 15, what="the second job to wait for host memory")
    assert LeaseDir.open(own_lease_dir).tickets() == []
    (gq.work / "go").write_text("")
    gq.wait_state(second, DONE)


def _waits_for_its_turn(gq: Env, job: int) -> bool:
    row = next(r for r in gq.status_json() if r["id"] == job)
    return "waiting for its turn on GPU 0: " in (row["waiting"] or "")


@needs_root  # another user's ticket
def test_a_ticket_whose_holder_never_takes_its_turn_keeps_the_gpu_for_the_grace_period_only(
    gq: Env, own_lease_dir: Path, holders: list[subprocess.Popen], tmp_path: Path
) -> None:
    """A ticket `since: 0`, held by a live process that never takes the free GPU (it kept every other
    user off it for ever): a job and a `gpuq lease` wait for its turn, then start once the GPUs have
    been free for TURN_GRACE_SECONDS."""
    Gpus(gq, fake_gpus(2))
    _hold(holders, own_lease_dir, THEM, (f"gpuq-ticket.{THEM}.1.1.ticket", _ticket(since=0.0)))
    gq.start_worker("--watch")
    added = time.time()  # no clock of the worker's starts before its job is in line
    job = gq.add("--gpus", "1", "true")
    wait_for(lambda: _waits_for_its_turn(gq, job), 15, what="the job to wait for the ticket's turn")
    asked = time.time()
    lease = subprocess.Popen(
        [sys.executable, "-m", "gpuq", "lease", "--", "date", "+%s.%N"], cwd=tmp_path, env=gq.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    gq.wait_state(job, DONE, timeout=TURN_GRACE_SECONDS + 20)
    out, err = lease.communicate(timeout=TURN_GRACE_SECONDS + 20)
    assert lease.returncode == 0 and "waiting for its turn on GPU" in err, err
    assert (parse_iso(gq.job(job)["started_at"]) or 0) >= added + TURN_GRACE_SECONDS
    assert float(out) >= asked + TURN_GRACE_SECONDS, "the lease waited out the grace too"


@needs_root  # another user's ticket
def test_a_ticket_whose_holder_is_stopped_keeps_no_one_waiting(
    gq: Env, own_lease_dir: Path, holders: list[subprocess.Popen]
) -> None:
    """Its holder stopped (Ctrl-Z, SIGSTOP): the job starts at once, and `gpuq gpus` lists it no more."""
    Gpus(gq, fake_gpus(1))
    holder = _hold(holders, own_lease_dir, THEM, (f"gpuq-ticket.{THEM}.1.1.ticket", _ticket(since=0.0)))
    assert "job #7 (1 GPU) since" in gq.gpuq("gpus").stdout
    os.kill(holder.pid, signal.SIGSTOP)
    job = gq.add("--gpus", "1", "true")
    gq.start_worker("--watch")
    gq.wait_state(job, DONE, timeout=TURN_GRACE_SECONDS / 2)
    assert "waiting:" not in gq.gpuq("gpus").stdout


def _waiting(gpus: int) -> Ticket:
    return Ticket(f"t{gpus}.ticket", "them", THEM, 4242, 7, None, gpus, None, None, 0.0, "h")


def test_a_ticket_waiting_for_more_gpus_than_are_free_runs_no_clock_and_a_free_turn_not_taken_does() -> None:
    """Steps of the worker's look, `now` given: a two-GPU ticket while GPU a is leased waits for that
    lease, not for itself, however long; once both are free its 30 s run, then it is passed over."""
    patience, two, one = Patience(), _waiting(2), _waiting(1)

    def passed(ticket: Ticket, now: float, leased: tuple[str, ...]) -> bool:
        patience.look([ticket], leased, now, ("a", "b"))
        return patience.passed(ticket, "b")

    assert not passed(two, 0.0, ("a",)) and not passed(two, 1000.0, ("a",)), "b alone could not start it"
    assert not passed(two, 1001.0, ()) and not passed(two, 1001.0 + TURN_GRACE_SECONDS - 1, ())
    assert passed(two, 1001.0 + TURN_GRACE_SECONDS, ()) and passed(two, 2000.0, ("a",)), "passed over for good"
    assert not passed(one, 0.0, ()) and passed(one, TURN_GRACE_SECONDS, ()), "one free GPU was its turn"
