"""Seeing the others (issue 28): `gpuq gpus` and `gpuq status` show every live lease on each GPU,
whoever holds it, which processes hold memory without a lease, and a lease directory that cannot
be trusted as one line. Real lease files in a temporary GPUQ_LEASE_DIR, GPUs simulated by
GPUQ_FAKE_GPUS; another user's lease is written by a real process of user `nobody` (as root)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import WAIT_FOR_GO, Env, wait_for
from test_gpu_worker import Gpus, fake_gpus, row

from gpuq.cli import render
from gpuq.spool import Spool
from gpuq.system.leases import LeaseDir


def gpus_doc(processes: dict[int, list[tuple[int, int]]]) -> dict[str, Any]:
    """Two simulated GPUs; `processes`: GPU index -> (pid, MiB) listed on it."""
    gpus = []
    for index in (0, 1):
        procs = [{"pid": pid, "used_memory_mib": mib} for pid, mib in processes.get(index, [])]
        gpus.append(
            {
                "index": index,
                "name": "Fake H100",
                "uuid": f"GPU-fake-{index}",
                "memory_total_mib": 81559,
                "memory_used_mib": sum(p["used_memory_mib"] for p in procs),
                "processes": procs,
            }
        )
    return {"gpus": gpus}


@pytest.fixture
def leases(gq: Env) -> Iterator[Path]:
    """The lease directory of the test (under /tmp, which every user may traverse), for gq's commands."""
    base = Path(tempfile.mkdtemp(prefix="gpuq-lease-views-", dir="/tmp"))
    os.chmod(base, 0o755)
    gq.env["GPUQ_LEASE_DIR"] = str(base / "leases")
    try:
        yield base / "leases"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def hhmm(epoch: float) -> str:
    return time.strftime("%H:%M", time.localtime(epoch))


def test_gpus_shows_every_lease_and_the_memory_held_without_one(gq: Env, leases: Path) -> None:
    directory = LeaseDir.open(str(leases))
    notebook = directory.take("GPU-fake-0", 0, None, job=None, name="jupyter", spool=None)  # held by this process
    shared = directory.take("GPU-fake-1", 1, 20480, job=12, name="train", spool="/elsewhere/.gpuq")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # in the holder's tree
    try:
        Gpus(gq, gpus_doc({0: [(child.pid, 30720), (4242, 9300)]}))  # 4242: no such process, no lease
        text = gq.gpuq("gpus").stdout
        listed = json.loads(gq.gpuq("gpus", "--json").stdout)
    finally:
        child.kill()
        child.wait()
        notebook.release()
        shared.release()
    lines = text.splitlines()
    assert lines[1] == "  GPU 0  Fake H100  39.1/79.6 GiB  other: pid 4242 (not visible here) 9.1 GiB", text
    since = hhmm(notebook.lease.since)
    holder = f"your `jupyter` (gpuq lease, pid {os.getpid()})"
    assert lines[2] == f"    leased whole by {holder} since {since} (pid {child.pid} 30.0 GiB)"
    assert lines[3] == "  GPU 1  Fake H100  0.0/79.6 GiB"
    elsewhere = "in another queue"  # a job of another queue of yours: its #12 is not this queue's
    assert lines[4] == f"    20.0 GiB leased by your job #12 {elsewhere} since {hhmm(shared.lease.since)}"
    assert len(lines) == 5
    first, second = listed
    assert [(p["pid"], p["lease"]) for p in first["foreign"]] == [(child.pid, notebook.lease.file), (4242, None)]
    assert first["foreign_mib"] == 30720 + 9300  # others' memory, leased or not, as the queue's ETA counts it
    (lease,) = first["leases"]
    assert lease["whole"] and lease["mem_mib"] is None and lease["job"] is None and lease["name"] == "jupyter"
    assert (lease["pid"], lease["uid"], lease["file"]) == (os.getpid(), os.geteuid(), notebook.lease.file)
    assert [(x["mem_mib"], x["job"], x["this_queue"]) for x in second["leases"]] == [(20480, 12, False)]
    assert first["lease_problems"] == second["lease_problems"] == []


# A lease of another tool that follows lease_layout.md, by another user: written and locked by hand.
FOREIGN_LEASE = """import fcntl, json, os, pwd, sys, time
directory, uuid, spool = sys.argv[1], sys.argv[2], (sys.argv[3:] or ["/home/x/.gpuq"])[0]
uid, pid = os.geteuid(), os.getpid()
tmp, final = f"{directory}/.gpuq-tmp.{uid}.{pid}.1", f"{directory}/gpuq-lease.{uuid}.{uid}.{pid}.1.lease"
fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
lease = {"lease_version": 1, "gpu_uuid": uuid, "gpu_index": 0, "mem_mib": None, "user": pwd.getpwuid(uid).pw_name,
         "uid": uid, "pid": pid, "pid_start": 0, "job": 7, "name": "secret-project", "spool": spool,
         "since": time.time(), "host": os.uname().nodename}
os.write(fd, (json.dumps(lease) + "\\n").encode())
os.rename(tmp, final)
print("ready", flush=True)
sys.stdin.read()
"""


def as_nobody(*args: str) -> subprocess.Popen:
    """A Python process of user nobody (the interpreter must be one nobody may run)."""
    nobody = pwd.getpwnam("nobody")
    for python in (sys.executable, "/usr/bin/python3"):
        try:
            subprocess.run([python, "-c", "pass"], user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], check=True)
        except (OSError, subprocess.CalledProcessError):  # not theirs to run (a venv under /root)
            continue
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
        return subprocess.Popen([python, *args], user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], **pipes)
    pytest.skip("no Python interpreter that user nobody may run")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can start a process of another user")
def test_another_users_lease_names_their_job_but_not_its_name(gq: Env, leases: Path) -> None:
    LeaseDir.open(str(leases))  # made with mode 1777, as the first gpuq to need it does
    Gpus(gq, gpus_doc({}))
    other = as_nobody("-c", FOREIGN_LEASE, str(leases), "GPU-fake-0")
    try:
        assert other.stdout is not None and other.stdout.readline() == "ready\n"
        text = gq.gpuq("gpus").stdout
        (lease,) = json.loads(gq.gpuq("gpus", "--json").stdout)[0]["leases"]
    finally:
        other.kill()
        other.wait()
    assert text.splitlines()[2].startswith("    leased whole by nobody's job #7 since "), text
    assert "secret-project" not in text
    assert (lease["user"], lease["job"], lease["name"], lease["who"]) == ("nobody", 7, None, "nobody's job #7")
    assert lease["spool"] is None  # its path (a lease of an earlier gpuq names it) is theirs too
    after = json.loads(gq.gpuq("gpus", "--json").stdout)[0]["leases"]
    assert after == []  # its holder is gone: the lease went with it


@pytest.mark.parametrize("broken", ["not sticky", "a symbolic link"])
def test_a_lease_directory_that_cannot_be_trusted_is_one_line(gq: Env, leases: Path, broken: str) -> None:
    Gpus(gq, gpus_doc({}))
    if broken == "not sticky":
        leases.mkdir(mode=0o777)
        os.chmod(leases, 0o777)
    else:
        target = leases.parent / "elsewhere"
        target.mkdir()
        os.chmod(target, 0o1777)
        leases.symlink_to(target)
    for command in (("gpus",), ("status",)):
        proc = gq.gpuq(*command)
        said = [line for line in proc.stdout.splitlines() if broken in line]
        assert len(said) == 1 and said[0].startswith(f"  lease directory {leases} is {broken}"), proc.stdout
        assert "leases are off" in said[0] and proc.stderr == ""
    (gpu, _) = json.loads(gq.gpuq("gpus", "--json").stdout)
    assert gpu["leases"] == [] and len(gpu["lease_problems"]) == 1


def test_a_lease_file_that_is_not_one_is_named_and_skipped(gq: Env, leases: Path) -> None:
    directory = LeaseDir.open(str(leases))
    Gpus(gq, gpus_doc({}))
    bad = leases / "gpuq-lease.GPU-fake-0.0.1.1.lease"
    bad.write_text("{not json")
    held = directory.take("GPU-fake-0", 0, 1024, job=None, name="probe", spool=None)
    with open(bad) as locked:  # held: a file nobody holds is stale, and skipped without a word
        fcntl.flock(locked, fcntl.LOCK_EX)
        try:
            lines = gq.gpuq("gpus").stdout.splitlines()
        finally:
            held.release()
    assert lines[2].startswith("    1.0 GiB leased by your `probe`")
    assert lines[-1] == f"  lease file {leases}/gpuq-lease.GPU-fake-0.0.1.1.lease is not JSON: ignored"


def test_looking_creates_no_lease_directory(gq: Env, leases: Path) -> None:
    """Whoever creates it owns it, and other users' gpuq refuse a directory a user owns: only a
    gpuq that takes a lease creates it, never one that only looks."""
    Gpus(gq, gpus_doc({}))
    listed = json.loads(gq.gpuq("gpus", "--json").stdout)
    assert "GPUs (fake" in gq.gpuq("status").stdout
    assert not leases.exists() and [gpu["leases"] for gpu in listed] == [[], []]


def test_status_shows_the_leases_its_worker_saw(gq: Env, leases: Path) -> None:
    directory = LeaseDir.open(str(leases))
    Gpus(gq, gpus_doc({}))
    held = directory.take("GPU-fake-1", 1, None, job=None, name="notebook", spool=None)
    try:
        worker = gq.start_worker("--watch")  # it looks at the GPUs when it starts, leases with them
        view = gq.home / "workers" / f"gpus-{worker.pid}.json"
        shown = json.loads(wait_for(lambda: view.exists() and view.read_text(), 10, what="the worker's view"))
        assert [len(gpu["leases"]) for gpu in shown["gpus"]] == [0, 1]
        text = gq.gpuq("status").stdout
    finally:
        held.release()
    assert f"    leased whole by your `notebook` (gpuq lease, pid {os.getpid()}) since " in text, text


def test_eta_names_the_leases_that_hold_a_job_back_as_status_does(gq: Env, leases: Path) -> None:
    """Another party's leases (another user's gpuq, here another spool's) are no processes that are
    not gpuq's: `gpuq eta` says whose they are in the words of the job's reason in `status`."""
    directory = LeaseDir.open(str(leases))
    Gpus(gq, gpus_doc({}))
    whole = directory.take("GPU-fake-0", 0, None, job=1, name="train", spool="/home/alice/.gpuq")
    shared = directory.take("GPU-fake-1", 1, 20480, job=2, name="train", spool="/home/alice/.gpuq")
    try:
        gq.script("job.py", "print('ran')\n")
        job_id = gq.add("--gpu-mem", "70G", "job.py")
        gq.start_worker("--watch")
        reason = wait_for(lambda: row(gq, job_id)["waiting"] or "", 15, what="the worker's reason")
        said = gq.gpuq("eta", str(job_id)).stdout
    finally:
        whole.release()
        shared.release()
    theirs = "in another queue"  # not this queue's #1 and #2
    leased = f"GPU 0: leased whole by your job #1 {theirs} since {hhmm(whole.lease.since)}"
    leased += f"; GPU 1: 20.0 GiB leased by your job #2 {theirs} since {hhmm(shared.lease.since)}"
    assert reason == f"waiting for {leased}", reason
    assert f"(pending): start unknown: {leased} (no telling when they free it)" in said, said
    assert "not gpuq's" not in said


def test_a_job_of_another_queue_of_yours_says_so(gq: Env, leases: Path, tmp_path: Path) -> None:
    """Two queues of one user (two GPUQ_HOME) on one GPU, each with its worker: the job of the second
    waits for the first's job #1, which `status` of the second called "your job #1", as if it were
    its own #1 (itself). It says it is another queue's; the first's own job is said as before."""
    Gpus(gq, fake_gpus(1))
    (tmp_path / "work-b").mkdir()
    other = Env(tmp_path / "spool-b", tmp_path / "work-b")
    other.env.update(GPUQ_FAKE_GPUS=gq.env["GPUQ_FAKE_GPUS"], GPUQ_LEASE_DIR=gq.env["GPUQ_LEASE_DIR"])
    try:
        gq.script("hold.py", WAIT_FOR_GO)
        first = gq.add("--gpus", "1", "hold.py")
        gq.start_worker("--watch")
        wait_for(lambda: gq.job(first).get("pid"), 15, what="the first queue's job running")
        second = other.add("--gpus", "1", "true")
        other.start_worker("--watch")
        assert (first, second) == (1, 1)
        reason = wait_for(lambda: row(other, second)["waiting"] or "", 15, what="the second queue's reason")
        held = "leased whole by your job #1 in another queue since"
        assert reason.startswith(f"waiting for GPU 0: {held}"), reason
        assert f"    {held} " in other.gpuq("status").stdout
        own = gq.gpuq("status").stdout
        assert "  GPU 0  Fake H100  0.0/79.6 GiB  jobs #1" in own and "another queue" not in own, own
        (gq.work / "go").touch()
        other.wait_state(second, "done", 30)
        wait_for(lambda: "starting job #1 " in other.worker_output(), 10, what="the second queue's start said")
        assert other.worker_output().count("starting job #1 ") == 1, other.worker_output()
    finally:
        other.cleanup()


def test_a_spool_reached_through_a_link_knows_its_own_jobs_lease(gq: Env, leases: Path, tmp_path: Path) -> None:
    """The worker's GPUQ_HOME goes through a symbolic link (a home directory that is a link), `gpuq gpus`
    and `status` are given the real path: the running job's lease was "your job #1 (work/hold) in queue
    <the path through the link>", another queue's. By either path it is this queue's job #1."""
    Gpus(gq, fake_gpus(1))
    (tmp_path / "link").symlink_to(tmp_path)
    real = dict(gq.env)
    gq.env["GPUQ_HOME"] = str(tmp_path / "link" / "spool")
    gq.script("hold.py", WAIT_FOR_GO)
    job_id = gq.add("--gpus", "1", "hold.py")
    gq.start_worker("--watch")
    wait_for(lambda: gq.job(job_id).get("pid"), 15, what="the job running")
    for env in (real, gq.env):
        for command in ("gpus", "status"):
            shown = gq.gpuq(command, env=env).stdout
            assert "  GPU 0  Fake H100  0.0/79.6 GiB  jobs #1\n" in shown and "leased" not in shown, shown
        (lease,) = json.loads(gq.gpuq("gpus", "--json", env=env).stdout)[0]["leases"]
        assert (lease["job"], lease["who"], lease["this_queue"]) == (job_id, "your job #1", True)
    (gq.work / "go").touch()
    gq.wait_state(job_id, "done", 30)


def test_a_lease_file_holds_neither_its_jobs_name_nor_its_spools_path(gq: Env, leases: Path, tmp_path: Path) -> None:
    """Every user may read a lease file, and `gpuq gpus` shows them another user's job by its id only:
    the file held the job's name and the spool's path all the same. It holds neither, and the job's
    own queue, and another of its user's, still tell whose it is."""
    Gpus(gq, fake_gpus(1))
    gq.script("hold.py", WAIT_FOR_GO)
    job_id = gq.add("--gpus", "1", "--name", "secret-project", "hold.py")
    gq.start_worker("--watch")
    wait_for(lambda: gq.job(job_id).get("pid"), 15, what="the job running")
    (path,) = leases.glob("gpuq-lease.*")
    written = json.loads(path.read_text())
    assert "secret-project" not in path.read_text() and str(tmp_path) not in path.read_text(), written
    assert (written["job"], written["name"], written["uid"]) == (job_id, "", os.geteuid())
    own = gq.gpuq("gpus").stdout
    assert "  GPU 0  Fake H100  0.0/79.6 GiB  jobs #1\n" in own and "leased" not in own, own
    elsewhere = gq.gpuq("gpus", env=dict(gq.env, GPUQ_HOME=str(tmp_path / "spool-b"))).stdout
    assert f"    leased whole by your job #{job_id} in another queue since " in elsewhere, elsewhere
    (gq.work / "go").touch()
    gq.wait_state(job_id, "done", 30)


def test_a_lease_names_its_queue_by_an_id_no_guess_of_its_path_confirms(gq: Env, leases: Path) -> None:
    """A lease named its queue by the first 16 hex digits of the SHA-256 of the queue's real path:
    another user could hash a guessed path (`/home/bob/.gpuq`) and compare. It is a random id made
    once in the spool (`lease-id`, 0600), the same for the queue's later jobs."""
    Gpus(gq, fake_gpus(1))
    gq.script("hold.py", WAIT_FOR_GO)
    first = gq.add("--gpus", "1", "hold.py")
    gq.start_worker("--watch")
    wait_for(lambda: gq.job(first).get("pid"), 15, what="the job running")
    (path,) = leases.glob("gpuq-lease.*")
    named = json.loads(path.read_text())["spool"]
    assert named != hashlib.sha256(os.path.realpath(gq.home).encode()).hexdigest()[:16], "the hash of its path"
    id_file, home = gq.home / "lease-id", gq.home.stat()
    assert (id_file.read_text(), id_file.stat().st_mode & 0o777) == (f"{named} {home.st_dev}:{home.st_ino}\n", 0o600)
    (gq.work / "go").touch()
    gq.wait_state(first, "done", 30)
    (gq.work / "go").unlink()
    second = gq.add("--gpus", "1", "hold.py")
    wait_for(lambda: gq.job(second).get("pid"), 15, what="the next job running")
    (path,) = leases.glob("gpuq-lease.*")
    assert json.loads(path.read_text())["spool"] == named
    shown = gq.gpuq("gpus").stdout
    assert f"  GPU 0  Fake H100  0.0/79.6 GiB  jobs #{second}\n" in shown and "leased" not in shown, shown
    (gq.work / "go").touch()
    gq.wait_state(second, "done", 30)


def test_a_copy_of_a_spool_does_not_take_the_originals_jobs_for_its_own(gq: Env, leases: Path, tmp_path: Path) -> None:
    """A spool copied with its `lease-id` (`cp -a`, a backup restored beside it) named its leases as the
    original did: the copy's worker took the original's running job for its own and planned its job
    onto that job's GPU, its supervisor refused the start, and the job stayed pending for ever with no
    reason. The copy makes an id of its own: its job waits for the original's, then starts."""
    Gpus(gq, fake_gpus(1))
    gq.script("hold.py", WAIT_FOR_GO)
    first = gq.add("--gpus", "1", "hold.py")
    gq.start_worker("--watch")
    wait_for(lambda: gq.job(first).get("pid"), 15, what="the original's job running")
    shutil.copytree(gq.home, tmp_path / "spool-b", symlinks=True)
    for name in os.listdir(tmp_path / "spool-b" / "running"):  # the original's job runs there, not here
        os.unlink(tmp_path / "spool-b" / "running" / name)
    (tmp_path / "work-b").mkdir()
    copy = Env(tmp_path / "spool-b", tmp_path / "work-b")
    copy.env.update(GPUQ_FAKE_GPUS=gq.env["GPUQ_FAKE_GPUS"], GPUQ_LEASE_DIR=gq.env["GPUQ_LEASE_DIR"])
    try:
        second = copy.add("--gpus", "1", "true")
        copy.start_worker("--watch")
        reason = wait_for(lambda: row(copy, second)["waiting"] or "", 15, what="the copy's reason")
        assert reason.startswith("waiting for GPU 0: leased whole by your job #1 in another queue since"), reason
        (lease,) = json.loads(copy.gpuq("gpus", "--json").stdout)[0]["leases"]
        assert (lease["job"], lease["this_queue"]) == (first, False)
        (gq.work / "go").touch()
        copy.wait_state(second, "done", 30)
        assert (copy.home / "lease-id").read_text().split()[0] != (gq.home / "lease-id").read_text().split()[0]
    finally:
        copy.cleanup()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can start a process of another user")
def test_another_users_lease_naming_this_queues_id_is_theirs(gq: Env, leases: Path) -> None:
    """Every user may read a lease, so another can write one that carries this queue's id: it is still
    theirs, and holds this queue's job back until it ends."""
    LeaseDir.open(str(leases))
    Gpus(gq, fake_gpus(1))
    mine = Spool(gq.home).ensure().lease_id.get()
    assert mine is not None
    other = as_nobody("-c", FOREIGN_LEASE, str(leases), "GPU-fake-0", mine)
    try:
        assert other.stdout is not None and other.stdout.readline() == "ready\n"
        job_id = gq.add("--gpus", "1", "true")
        gq.start_worker("--watch")
        reason = wait_for(lambda: row(gq, job_id)["waiting"] or "", 15, what="the job's reason")
        assert reason.startswith("waiting for GPU 0: leased whole by nobody's job #7 since"), reason
        leased = json.loads(gq.gpuq("gpus", "--json").stdout)[0]["leases"]
        assert [(lease["who"], lease["this_queue"]) for lease in leased] == [("nobody's job #7", False)]
    finally:
        other.kill()
        other.wait()
    gq.wait_state(job_id, "done", 30)


# A process that makes the spool's lease id once told to (the file `go`), and prints it.
MAKE_ID = """import os, sys
from gpuq.spool import Spool
made = Spool(sys.argv[1]).lease_id
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    pass
print(made.get(), flush=True)
"""


def test_processes_replacing_a_lease_id_that_is_none_settle_on_one(gq: Env, tmp_path: Path) -> None:
    """A `lease-id` that holds no id is made anew; several jobs starting at once each wrote one of
    their own, and the first one's lease then named another queue than the spool's id."""
    Spool(gq.home).ensure()
    (gq.home / "lease-id").write_text("not an id\n")
    go = tmp_path / "go"
    pipes = {"stdout": subprocess.PIPE, "text": True, "env": gq.env}
    makers = [subprocess.Popen([sys.executable, "-c", MAKE_ID, str(gq.home), str(go)], **pipes) for _ in range(6)]
    try:
        for maker in makers:
            assert maker.stdout is not None and maker.stdout.readline() == "ready\n"
        go.touch()
        made = {maker.communicate(timeout=30)[0].strip() for maker in makers}
    finally:
        for maker in makers:
            maker.kill()
            maker.wait()
    assert made == {Spool(gq.home).lease_id.read()}, made


def test_a_lease_an_earlier_gpuq_wrote_is_still_read(gq: Env, leases: Path, tmp_path: Path) -> None:
    """A lease of the gpuq before, which named the spool by its path (here through a link) and the job
    by its name, is still this queue's job and another queue's for another spool; the name is not shown."""
    LeaseDir.open(str(leases))
    Gpus(gq, gpus_doc({}))
    (tmp_path / "link").symlink_to(tmp_path)
    path = leases / f"gpuq-lease.GPU-fake-0.{os.geteuid()}.{os.getpid()}.1.lease"
    old = {
        "lease_version": 1, "gpu_uuid": "GPU-fake-0", "gpu_index": 0, "mem_mib": None, "user": "me",
        "uid": os.geteuid(), "pid": os.getpid(), "pid_start": 0, "job": 7, "name": "secret-project",
        "spool": str(tmp_path / "link" / "spool"), "since": time.time(), "host": os.uname().nodename,
    }  # fmt: skip
    path.write_text(json.dumps(old) + "\n")
    with open(path) as locked:  # alive while held
        fcntl.flock(locked, fcntl.LOCK_EX)
        own = gq.gpuq("gpus").stdout
        (lease,) = json.loads(gq.gpuq("gpus", "--json").stdout)[0]["leases"]
        elsewhere = gq.gpuq("gpus", env=dict(gq.env, GPUQ_HOME=str(tmp_path / "spool-b"))).stdout
    assert "    leased whole by your job #7 since " in own and "secret-project" not in own, own
    assert (lease["job"], lease["name"], lease["this_queue"]) == (7, None, True)
    assert "    leased whole by your job #7 in another queue since " in elsewhere, elsewhere


def test_lines_leave_out_this_spools_own_jobs_and_most_problems() -> None:
    """The leases of this spool's jobs are the `jobs #N` already shown; others' are not."""
    lease = {"who": "your job #3 (a)", "whole": True, "since": None, "spool": "/me/.gpuq", "job": 3, "file": "f"}
    gpu = {"index": 0, "name": "G", "memory_used_mib": 0, "memory_total_mib": 1024, "jobs": [3], "foreign": []}
    others = [dict(lease, spool="/you/.gpuq", who="your job #3 (b)")]
    view = {"at": 0, "source": "fake", "gpus": [dict(gpu, leases=[lease, *others])], "lease_problems": list("abcde")}
    lines = render.gpu_lines(view, now=0, home="/me/.gpuq")
    assert lines[1:] == [
        "  GPU 0  G  0.0/1.0 GiB  jobs #3",
        f"    leased whole by your job #3 (b) since {hhmm(0)}",
        "  a",
        "  b",
        "  c",
        "  and 2 more lease problems (`gpuq gpus --json`)",
    ]


def test_the_queues_eta_counts_other_parties_leases_as_held() -> None:
    """A job a lease holds back does not `start ~0s`: others' leases hold their memory in the plan."""
    from gpuq.engine.tracking.queue_eta import outside_memory

    def lease(spool: str, whole: bool, mem: Any = None) -> dict[str, Any]:
        return {"file": f"{spool}.lease", "spool": spool, "whole": whole, "mem_mib": mem}

    using = [{"pid": 7, "used_memory_mib": 3000, "lease": "/bob.lease"}, {"pid": 8, "used_memory_mib": 500}]
    gpus = [
        {"index": 0, "memory_total_mib": 81559, "foreign_mib": 3500, "foreign": using, "leases": [lease("/bob", True)]},
        {
            "index": 1,
            "memory_total_mib": 81559,
            "foreign_mib": 3500,
            "foreign": using,
            "leases": [lease("/bob", False, 20480)],
        },
        {"index": 2, "memory_total_mib": 81559, "foreign_mib": 0, "foreign": [], "leases": [lease("/me", True)]},
    ]
    found = outside_memory(gpus, "/me")
    assert {slot: (o.held, o.total) for slot, o in found.items()} == {
        "0": (81559, 81559),
        "1": (3500 + 20480 - 3000, 81559),
        "2": (0, 81559),
    }
    assert found["1"].unleased == 500 and found["2"].leases == ()  # this spool's own lease: its running jobs
    # a holder using more than its lease: the reason `eta` gives says what it uses
    over = [dict(gpus[1], leases=[lease("/bob", False, 2048)])]
    assert outside_memory(over, "/me")["1"].leases[0].endswith(f" leased by None since {hhmm(0)}, using 2.9 GiB")
