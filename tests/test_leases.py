"""The lease directory (gpuq/system/leases.py, lease_layout.md): leases taken, seen alive, released;
a killed holder's lease stale at once; files and directories other users could plant refused."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from conftest import wait_for

from gpuq.system import lease_io, leases
from gpuq.system.leases import LeaseDir, LeaseDirProblem

UUID = "GPU-aaaa-0"


@pytest.fixture
def lease_dir(tmp_path: Path) -> LeaseDir:
    return LeaseDir.open(tmp_path / "leases")


@contextlib.contextmanager
def child(script: str, *args: str) -> Iterator[subprocess.Popen]:
    """A real process running `script` (with leases imported), once it printed READY."""
    code = "import os, sys, time, fcntl\nfrom gpuq.system.leases import LeaseDir\n" + script
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def plant(lease_dir: LeaseDir, name: str, text: str) -> int:
    """A file in the directory with `text`, locked (alive) by a descriptor of this test's, returned."""
    path = os.path.join(lease_dir.path, name)
    Path(path).write_text(text)
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_lease_is_taken_seen_alive_and_released(lease_dir: LeaseDir) -> None:
    whole = lease_dir.take(UUID, 0, None, job=12, name="train", spool="/home/me/.gpuq")
    shared = lease_dir.take("GPU-bbbb-1", 1, 20480, job=None, name="jupyter", spool=None)
    found = lease_dir.live()
    assert [lease.file for lease in found] == [whole.lease.file, shared.lease.file]
    assert found == [whole.lease, shared.lease] and lease_dir.problems == []
    lease = found[0]
    assert (lease.gpu_uuid, lease.gpu_index, lease.whole, lease.job, lease.pid) == (UUID, 0, True, 12, os.getpid())
    assert lease.pid_start > 0 and abs(lease.since - time.time()) < 60
    assert found[1].mem_mib == 20480 and not found[1].whole
    me = os.geteuid()
    assert lease.who(me, leases.spool_ids("/home/me/.gpuq", None)) == "your job #12"  # seen from its own queue
    assert lease.who(me, leases.spool_ids("/home/me/q2", "0123456789abcdef")) == "your job #12 in another queue"
    assert lease.who(me) == "your job #12 in another queue"  # seen from no queue
    assert lease.who(me + 1) == f"{lease.user}'s job #12"
    assert found[1].who(me + 1) == f"{lease.user}'s `jupyter` (gpuq lease, pid {os.getpid()})"
    st = os.stat(os.path.join(lease_dir.path, lease.file))
    assert stat.S_IMODE(st.st_mode) == 0o644
    whole.release()
    whole.release()  # idempotent
    assert lease_dir.live() == [shared.lease]
    assert not os.path.exists(os.path.join(lease_dir.path, whole.lease.file))
    shared.release()
    assert lease_dir.live() == [] and [n for n in os.listdir(lease_dir.path) if n.endswith(".lease")] == []


def test_a_killed_holder_leaves_a_stale_lease_at_once(lease_dir: LeaseDir) -> None:
    """SIGKILL: the kernel drops the lock, the lease is stale at once and its (root or owner's)
    reader removes the file. The child's umask 077 still leaves its lease readable by all."""
    script = (
        "os.umask(0o077)\n"
        "held = LeaseDir.open(sys.argv[1]).take('GPU-aaaa-0', 0, None, job=3, name='t', spool='/s')\n"
        "print('READY', flush=True)\ntime.sleep(60)\n"
    )
    with child(script, lease_dir.path) as proc:
        (lease,) = lease_dir.live()
        assert lease.pid == proc.pid and lease.job == 3
        assert stat.S_IMODE(os.stat(os.path.join(lease_dir.path, lease.file)).st_mode) == 0o644
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert os.path.exists(os.path.join(lease_dir.path, lease.file))  # left behind by the killed holder
        assert lease_dir.live() == [] and lease_dir.problems == []
        assert not os.path.exists(os.path.join(lease_dir.path, lease.file))


def test_unsound_lease_files_are_skipped_with_a_line(lease_dir: LeaseDir, tmp_path: Path) -> None:
    good = lease_dir.take(UUID, 0, None, job=1, name="a", spool="/s")
    text = Path(lease_dir.path, good.lease.file).read_text()
    fds = [
        plant(lease_dir, "gpuq-lease.GPU-x.0.1.1.lease", "{not json"),
        plant(lease_dir, "gpuq-lease.GPU-x.0.1.2.lease", text.replace(f'"uid": {os.geteuid()}', '"uid": 4321')),
        plant(lease_dir, "gpuq-lease.GPU-x.0.1.3.lease", text.replace('"gpu_index": 0', '"gpu_index": "zero"')),
        plant(lease_dir, "gpuq-lease.GPU-x.0.1.4.lease", text.replace('"lease_version": 1', '"lease_version": 9')),
    ]
    outside = tmp_path / "elsewhere.lease"
    os.link(os.path.join(lease_dir.path, good.lease.file), outside)
    os.symlink(outside, os.path.join(lease_dir.path, "gpuq-lease.GPU-x.0.1.5.lease"))
    try:
        assert lease_dir.live() == [good.lease]
        problems = sorted(lease_dir.problems)
        assert len(problems) == 5, problems
        assert problems[0].endswith("gpuq-lease.GPU-x.0.1.1.lease is not JSON: ignored")
        assert problems[1].endswith(f"names uid 4321 but is owned by uid {os.geteuid()}: ignored")
        assert problems[2].endswith("has a bad gpu_index: ignored")
        assert problems[3].endswith("has lease_version 9, not 1: ignored")
        assert problems[4].endswith("gpuq-lease.GPU-x.0.1.5.lease is a symbolic link: ignored")
    finally:
        for fd in fds:
            os.close(fd)
        good.release()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_lease_file_owned_by_another_uid_than_it_names_is_skipped(lease_dir: LeaseDir) -> None:
    good = lease_dir.take(UUID, 0, None, job=1, name="a", spool="/s")
    os.chown(os.path.join(lease_dir.path, good.lease.file), 65534, -1)  # `nobody`: a forgery of ours
    assert lease_dir.live() == []
    assert lease_dir.problems[0].endswith(f"names uid {os.geteuid()} but is owned by uid 65534: ignored")
    good.release()


def test_the_placing_lock_serialises_and_is_not_followed_through_a_link(lease_dir: LeaseDir, tmp_path: Path) -> None:
    with lease_dir.placing(["GPU-b", "GPU-a", "GPU-a"]):
        other = LeaseDir.open(lease_dir.path)
        with pytest.raises(LeaseDirProblem, match=r"placing lock of GPU GPU-a .* held for more than 0.05 s"):
            with other.placing(["GPU-a"], timeout=0.05):
                pass
    with other.placing(["GPU-a"], timeout=0.05):  # free again once left
        pass
    target = tmp_path / "victim"
    os.symlink(target, os.path.join(lease_dir.path, "gpuq-lock.GPU-c"))
    with pytest.raises(LeaseDirProblem, match=r"gpuq-lock.GPU-c is a symbolic link; leases are off"):
        with lease_dir.placing(["GPU-c"]):
            pass
    assert not target.exists()


def test_a_lock_held_by_a_hostile_process_past_the_timeout(lease_dir: LeaseDir) -> None:
    script = (
        "from gpuq.system.lease_io import lock_file\n"
        "fd = lock_file(sys.argv[1], 'GPU-aaaa-0')\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('READY', flush=True)\ntime.sleep(60)\n"
    )
    with child(script, lease_dir.path):
        began = time.monotonic()
        with pytest.raises(LeaseDirProblem) as caught:
            with lease_dir.placing([UUID, "GPU-zzzz"], timeout=0.3):
                pass
        # It waited the timeout out (a lower bound no load can break) and then gave up: the holder
        # sleeps for a minute, so a wait for it would take that long (and end without the error).
        assert 0.3 <= time.monotonic() - began < 30
        assert "the placing lock of GPU GPU-aaaa-0 " in str(caught.value) and "more than 0.3 s" in str(caught.value)
        assert "(a stuck or hostile process?); leases are off, the GPU memory gate alone decides" in str(caught.value)
    with lease_dir.placing([UUID, "GPU-zzzz"], timeout=1):  # its holder gone: free at once
        pass


def test_a_missing_directory_is_created_sticky_and_open_to_all(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        LeaseDir.open(tmp_path / "made")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(tmp_path / "made").st_mode) == 0o1777


def test_directories_others_could_tamper_with_are_refused(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(LeaseDirProblem) as caught:
        LeaseDir.open(loose)
    assert str(caught.value) == (
        f"lease directory {loose} is not sticky (mode 0777): other users could remove your leases; "
        "leases are off, the GPU memory gate alone decides"
    )
    real = tmp_path / "real"
    LeaseDir.open(real)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(LeaseDirProblem, match=r"is a symbolic link \(to .*real\); gpuq does not follow it"):
        LeaseDir.open(link)


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory of another user needs root to make")
def test_a_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    LeaseDir.open(theirs)
    os.chown(theirs, 65534, -1)
    with pytest.raises(LeaseDirProblem, match=r"is owned by (nobody|uid 65534), not by root or you"):
        LeaseDir.open(theirs)


def test_the_default_directory_is_dev_shm_itself(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Not a directory of gpuq's own: whoever made it would own it, and every other user's gpuq
    would refuse it. /dev/shm is root's and sticky, so every user's gpuq accepts it. Only looked at:
    a test never writes into the machine's real /dev/shm."""
    monkeypatch.setenv(leases.LEASE_DIR_ENV, str(tmp_path))
    assert leases.default_dir() == str(tmp_path)
    monkeypatch.delenv(leases.LEASE_DIR_ENV)
    default = leases.default_dir()
    if sys.platform.startswith("linux"):
        assert default == os.path.realpath("/dev/shm") == "/dev/shm"
    else:
        assert default == os.path.realpath("/tmp")
    assert os.lstat(default).st_uid == 0 and lease_io.directory_problem(default) is None


def test_other_programs_files_are_never_read_reported_or_removed(lease_dir: LeaseDir) -> None:
    """The directory may be /dev/shm, full of other programs' files (PyTorch's among them): a lease,
    a placing lock and a temporary are gpuq's by their names' prefixes, and nothing else is touched,
    not even a file that looks like a lease, or an old temporary that looks like one of ours."""
    good = lease_dir.take(UUID, 0, None, job=1, name="a", spool="/s")
    text = Path(lease_dir.path, good.lease.file).read_text()
    held = plant(lease_dir, "foo.lease", text)  # alive, and a sound lease, but not by gpuq's name
    files = {name: Path(lease_dir.path, name) for name in ("foo.lease", ".tmp.0.1.1", "torch_42_1", ".gpuq-tmp.0.1.1")}
    for name in (".tmp.0.1.1", "torch_42_1", ".gpuq-tmp.0.1.1"):
        files[name].write_text("x")
        os.utime(files[name], (time.time() - 3600,) * 2)  # old and unlocked: a dead writer's, were it gpuq's
    Path(lease_dir.path, "dir.lease").mkdir()
    try:
        assert lease_dir.live() == [good.lease] and lease_dir.problems == []
    finally:
        os.close(held)
        good.release()
    assert not files.pop(".gpuq-tmp.0.1.1").exists()  # gpuq's own dead writer's file: cleaned up
    assert all(path.exists() for path in files.values()) and Path(lease_dir.path, "dir.lease").is_dir()
    assert lease_dir.live() == [] and lease_dir.problems == []  # foo.lease, unlocked now: still not ours to remove
    assert files["foo.lease"].exists()


def open_on(path: str) -> int:
    """How many descriptors of this process are open on the file `path` names now."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == path
        except OSError:  # the listing's own descriptor, closed since
            pass
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads which file a descriptor is open on in /proc")
def test_a_placing_lock_file_made_anew_while_waited_for_is_locked_anew(lease_dir: LeaseDir) -> None:
    """The lock file is removed and made anew (by its owner, or root) while a party waits for it:
    the old file's lock, once free, keeps out nobody who opens the new file, so the waiter lets it
    go and waits for the new file's holder."""
    path = os.path.join(lease_dir.path, f"gpuq-lock.{UUID}")
    first, second = lease_dir.placing([UUID]), lease_dir.placing([UUID])
    entered, leave = threading.Event(), threading.Event()

    def waiter() -> None:
        with lease_dir.placing([UUID], timeout=10):
            entered.set()
            leave.wait(10)

    first.__enter__()
    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        wait_for(lambda: open_on(path) == 2, 5, what="the waiter to open the lock file")
        os.unlink(path)
        second.__enter__()  # makes the lock file anew, and locks it
        first.__exit__(None, None, None)  # the old file's lock is free
        wait_for(lambda: entered.is_set() or open_on(path) == 2, 5, what="the waiter to open the new lock file")
        assert not entered.is_set(), "entered on the old file's lock while the new one is held"
        second.__exit__(None, None, None)
        wait_for(entered.is_set, 5, what="the waiter to enter once the new file's lock is free")
    finally:
        leave.set()
        first.__exit__(None, None, None)
        second.__exit__(None, None, None)
        thread.join(10)


def test_say_once() -> None:
    said: list[str] = []
    for line in ("lease directory /x is not sticky", "another", "lease directory /x is not sticky"):
        leases.say_once(line + " (test_say_once)", said.append)
    assert said == ["lease directory /x is not sticky (test_say_once)", "another (test_say_once)"]
