"""Hostile and broken input (issue 7): a spool that runs commands must not be a back door.

Everything here uses real files, real permissions and real gpuq processes in a temporary spool.
Tests that need root (chown to another uid, mounting a tmpfs) skip where they cannot arrange it.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from conftest import Env, wait_for

from gpuq.core import schema
from gpuq.engine.lifecycle import intake
from gpuq.run.launcher import Launcher
from gpuq.run.worker import Worker
from gpuq.spool import MAX_JOB_BYTES, JobRef, Spool

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
STRANGER_UID = 4242  # any uid that is not ours


# ---- helpers ----------------------------------------------------------------------------------
@pytest.fixture
def spool(gq: Any) -> Any:
    """The test's spool, created as gpuq creates it; the umask gpuq sets is undone afterwards."""
    old = os.umask(0o022)
    os.umask(old)
    try:
        yield Spool(gq.home).ensure()
    finally:
        os.umask(old)


def run_gpuq(gq: Any, *args: str, preexec: Optional[Callable[[], None]] = None, env: Optional[dict] = None):
    return subprocess.run(
        [sys.executable, "-m", "gpuq", *args],
        cwd=gq.work,
        env=env or gq.env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=preexec,
    )


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Refused the way the project promises: exit 1, one line on stderr, no traceback."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def drop(home: Path, name: str, data: bytes, mode: int = 0o600) -> Path:
    """A file dropped into pending/ by hand (or by a program)."""
    # Written beside the spool and renamed in with its final mode: a worker watching pending/ must
    # never see it with the umask's mode (a 0666 file taken in as 0600 before the chmod).
    staging = home.parent / "staging"
    staging.mkdir(exist_ok=True)
    fd = os.open(staging / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    os.write(fd, data)
    os.close(fd)
    os.chmod(staging / name, mode)  # whatever the umask, the mode asked for
    path = home / "pending" / name
    os.rename(staging / name, path)
    return path


def take_in(spool: Spool, name: str) -> str:
    """One intake of a dropped file, as the worker does it, once the quiet period is over."""
    return intake.take_in(spool, name, time.time() + 60)


def reason(home: Path, name: str) -> str:
    return (home / "rejected" / f"{name}.reason").read_text().strip()


def canonical_jobs(home: Path, state: str = "pending") -> list[str]:
    return sorted(n for n in os.listdir(home / state) if n[:6].isdigit())


def is_in(gq: Any, job_id: int, state: str) -> bool:
    """Whether a job file is in `state` (it may briefly be in two states while it moves)."""
    return any(n.startswith(f"{job_id:06d}-") for n in gq.files(state))


def valid_job(job_id: int, **changes: Any) -> dict[str, Any]:
    job = schema.new_job(job_id=job_id, name="ok", cmd=["true"], cwd="/", log="/dev/null")
    job.update(changes)
    return job


def write_canonical(home: Path, job: dict[str, Any], name: str) -> Path:
    """A complete job file put straight into pending/ under a job file name, as a program might."""
    return drop(home, name, json.dumps(job).encode())


# ---- the spool directory itself ---------------------------------------------------------------
def test_spool_is_private_whatever_the_callers_umask(gq: Any) -> None:
    proc = run_gpuq(gq, "add", "-q", "true", preexec=lambda: os.umask(0o002))
    assert proc.returncode == 0, proc.stderr
    for path in [gq.home, *gq.home.iterdir()]:
        if path.is_dir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    (job_file,) = canonical_jobs(gq.home)
    assert stat.S_IMODE((gq.home / "pending" / job_file).stat().st_mode) == 0o600


def _world_writable_home(gq: Any) -> tuple[dict, str]:
    os.chmod(gq.home, 0o777)
    return gq.env, f"chmod 700 {gq.home}"


def _group_writable_pending(gq: Any) -> tuple[dict, str]:
    os.chmod(gq.home / "pending", 0o770)
    return gq.env, "writable by group or others"


def _symlinked_home(gq: Any) -> tuple[dict, str]:
    link = gq.work / "spool-link"
    link.symlink_to(gq.home)
    return dict(gq.env, GPUQ_HOME=str(link)), f"GPUQ_HOME={os.path.realpath(gq.home)}"


def _symlinked_state_dir(gq: Any) -> tuple[dict, str]:
    elsewhere = gq.work / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (gq.home / "done").rmdir()
    (gq.home / "done").symlink_to(elsewhere)
    return gq.env, f"rm {gq.home / 'done'}"


def _file_instead_of_state_dir(gq: Any) -> tuple[dict, str]:
    (gq.home / "failed").rmdir()
    (gq.home / "failed").write_text("")
    return gq.env, "is not a directory"


@pytest.mark.parametrize(
    "sabotage",
    [_world_writable_home, _group_writable_pending, _symlinked_home, _symlinked_state_dir, _file_instead_of_state_dir],
)
def test_worker_refuses_an_unsafe_spool(gq: Any, sabotage: Callable) -> None:
    marker = gq.work / "ran"
    job_id = gq.add("touch", str(marker))
    env, hint = sabotage(gq)
    proc = run_gpuq(gq, "run", env=env)
    assert_clean_error(proc, hint)
    assert not marker.exists()  # the job did not run
    assert any(n.startswith(f"{job_id:06d}-") for n in os.listdir(gq.home / "pending"))
    assert_clean_error(run_gpuq(gq, "add", "true", env=env), hint)  # nor is anything added


@pytest.mark.skipif(not IS_ROOT, reason="giving a directory to another uid needs root")
def test_worker_refuses_a_spool_owned_by_someone_else(gq: Any) -> None:
    job_id = gq.add("true")
    os.chown(gq.home, STRANGER_UID, -1)
    try:
        assert_clean_error(run_gpuq(gq, "run"), f"owned by uid {STRANGER_UID}", f"chown {os.geteuid()}")
        os.chown(gq.home, 0, -1)
        os.chown(gq.home / "running", STRANGER_UID, -1)
        assert_clean_error(run_gpuq(gq, "run"), "running is owned by uid")
    finally:
        os.chown(gq.home / "running", 0, -1)
    gq.gpuq("run")
    assert gq.state_of(job_id) == "done"  # once repaired, the spool works as before


# ---- job files that must be refused -----------------------------------------------------------
GOOD_DROP = b'{"cmd": ["true"]}'


def _symlink_to_real_job(home: Path, work: Path) -> tuple[str, str]:
    target = work / "target.json"
    target.write_bytes(GOOD_DROP)
    (home / "pending" / "link.json").symlink_to(target)
    return "link.json", "symbolic link"


def _hard_link(home: Path, work: Path) -> tuple[str, str]:
    original = work / "original.json"
    original.write_bytes(GOOD_DROP)
    os.chmod(original, 0o600)
    os.link(original, home / "pending" / "hard.json")
    return "hard.json", "2 hard links"


def _group_writable(home: Path, work: Path) -> tuple[str, str]:
    drop(home, "gw.json", GOOD_DROP, mode=0o620)
    return "gw.json", "writable by group or others"


def _world_writable(home: Path, work: Path) -> tuple[str, str]:
    drop(home, "ww.json", GOOD_DROP, mode=0o602)
    return "ww.json", "writable by group or others"


def _huge(home: Path, work: Path) -> tuple[str, str]:
    body = json.dumps({"cmd": ["true"], "env": {"BIG": "x" * (MAX_JOB_BYTES + 10)}}).encode()
    drop(home, "huge.json", body)
    return "huge.json", f"the limit is {MAX_JOB_BYTES}"


def _fifo(home: Path, work: Path) -> tuple[str, str]:
    os.mkfifo(home / "pending" / "fifo.json", 0o600)  # opening it blocking would hang the worker
    return "fifo.json", "not a regular file"


def _directory(home: Path, work: Path) -> tuple[str, str]:
    (home / "pending" / "dir.json").mkdir(mode=0o700)
    return "dir.json", "not a regular file"


def _socket(home: Path, work: Path) -> tuple[str, str]:
    path = home / "pending" / "sock.json"
    if len(os.fsencode(path)) > 100:
        pytest.skip("temporary path too long for a unix socket")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    return "sock.json", "cannot be opened"


def _foreign_owner(home: Path, work: Path) -> tuple[str, str]:
    if not IS_ROOT:
        pytest.skip("giving a file to another uid needs root")
    os.chown(drop(home, "theirs.json", GOOD_DROP), STRANGER_UID, -1)
    return "theirs.json", f"owned by uid {STRANGER_UID}"


@pytest.mark.parametrize(
    "make",
    [
        _symlink_to_real_job,
        _hard_link,
        _group_writable,
        _world_writable,
        _huge,
        _fifo,
        _directory,
        _socket,
        _foreign_owner,
    ],
)
def test_unsafe_job_file_is_rejected_with_its_reason(gq: Any, spool: Spool, make: Callable) -> None:
    name, why = make(gq.home, gq.work)
    outcome = take_in(spool, name)
    assert outcome.startswith("rejected: ") and why in outcome, outcome
    assert why in reason(gq.home, name)
    assert not os.path.lexists(gq.home / "pending" / name)
    assert os.path.lexists(gq.home / "rejected" / name)
    assert canonical_jobs(gq.home) == []  # no job was made from it


def test_symlink_is_moved_never_followed(gq: Any, spool: Spool) -> None:
    target = gq.work / "precious.json"
    target.write_bytes(GOOD_DROP)
    before = target.stat()
    (gq.home / "pending" / "evil.json").symlink_to(target)
    assert take_in(spool, "evil.json").startswith("rejected: ")
    moved = gq.home / "rejected" / "evil.json"
    assert moved.is_symlink() and os.readlink(moved) == str(target)
    after = target.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def test_canonical_job_file_is_checked_the_same_way(gq: Any, spool: Spool) -> None:
    """A file already named like a job (NNNNNN-name.json) gets the same checks when loaded."""
    outside = gq.work / "job.json"
    outside.write_text(json.dumps(valid_job(77)))
    (gq.home / "pending" / "000077-x.json").symlink_to(outside)
    with pytest.raises(schema.InvalidJob, match="symbolic link"):
        spool.jobs.load(JobRef(77, "pending", "000077-x.json"))
    drop(gq.home, "000078-x.json", json.dumps(valid_job(78)).encode(), mode=0o660)
    with pytest.raises(schema.InvalidJob, match="writable by group"):
        spool.jobs.load(JobRef(78, "pending", "000078-x.json"))


# ---- values inside a job file never become paths ----------------------------------------------
def files_outside_spool(gq: Any) -> set[str]:
    root = gq.home.parent
    found = set()
    for dirpath, _dirs, names in os.walk(root):
        if Path(dirpath).is_relative_to(gq.home):
            continue
        found.update(os.path.join(dirpath, n) for n in names)
    return found


def test_dotdot_in_a_dropped_name_stays_inside_the_spool(gq: Any, spool: Spool) -> None:
    before = files_outside_spool(gq)
    drop(gq.home, "a.json", json.dumps({"cmd": ["echo", "hi"], "name": "../../../escape"}).encode())
    drop(gq.home, "b.json", json.dumps({"cmd": ["echo", "hi"], "name": "../done/000001-a"}).encode())
    assert take_in(spool, "a.json") == "job #1"
    assert take_in(spool, "b.json") == "job #2"
    names = canonical_jobs(gq.home)
    assert [n[:7] for n in names] == ["000001-", "000002-"] and not any("/" in n or ".." in n for n in names)
    assert gq.job(1)["name"] == "../../../escape"  # shown as given, never used as a path
    gq.gpuq("run")
    assert gq.state_of(1) == gq.state_of(2) == "done"
    assert gq.log(1).splitlines().count("hi") == 1 and gq.log(2).splitlines().count("hi") == 1
    assert files_outside_spool(gq) == before
    assert gq.job(1)["id"] == 1  # job #2's name did not overwrite job #1's file
    assert len(canonical_jobs(gq.home, "done")) == 2


def test_id_and_log_cannot_be_set_in_a_dropped_file(gq: Any, spool: Spool) -> None:
    body = {"cmd": ["true"], "id": "../../x", "log": str(gq.work / "outside.log")}
    drop(gq.home, "c.json", json.dumps(body).encode())
    outcome = take_in(spool, "c.json")
    assert "unknown fields 'id', 'log'" in outcome


def test_log_and_name_inside_a_canonical_file_are_not_paths(gq: Any, spool: Spool) -> None:
    """A complete, well-formed job file written by hand: its `log` and `name` are ignored as paths;
    the supervisor writes to the spool's own log for the id in the file name."""
    outside_log = gq.work / "outside.log"
    job = valid_job(5, name="../../../../tmp/x", log=str(outside_log), cmd=["echo", "from job 5"])
    write_canonical(gq.home, job, name="000005-hand.json")
    before = files_outside_spool(gq)
    gq.gpuq("run")
    assert gq.state_of(5) == "done"
    assert not outside_log.exists()
    assert "from job 5" in gq.log(5)
    assert files_outside_spool(gq) == before
    (done,) = canonical_jobs(gq.home, "done")
    assert done.startswith("000005-") and "/" not in done


def test_id_inside_a_canonical_file_must_match_its_name(gq: Any, spool: Spool) -> None:
    victim = gq.add("true")
    gq.gpuq("run")
    victim_file = gq.home / "done" / canonical_jobs(gq.home, "done")[0]
    before = victim_file.read_bytes()
    evil = write_canonical(gq.home, valid_job(victim, cmd=["false"]), name="000099-evil.json")  # says id 1
    os.utime(evil, (time.time() - 60, time.time() - 60))  # long finished: no quiet period to wait out
    with pytest.raises(schema.InvalidJob, match="file name says id 99 but the file says 1"):
        spool.jobs.load(JobRef(99, "pending", "000099-evil.json"))
    gq.gpuq("run")
    assert (gq.home / "rejected" / "000099-evil.json").exists()
    assert "file name says id 99" in reason(gq.home, "000099-evil.json")
    assert victim_file.read_bytes() == before


# ---- file names -------------------------------------------------------------------------------
def test_awkward_file_names_are_rejected_and_the_worker_survives_them(gq: Any) -> None:
    Spool(gq.home).ensure()
    long_name = "n" * 230 + ".json"
    drop(gq.home, long_name, GOOD_DROP)
    drop(gq.home, "line\nbreak.json", GOOD_DROP)
    drop(gq.home, os.fsdecode(b"bad\xff\xfename.json"), GOOD_DROP)
    drop(gq.home, "with space.json", GOOD_DROP)
    drop(gq.home, "notes.txt", b"not a job")  # not a job file: left alone
    env = dict(gq.env, PYTHONIOENCODING="utf-8:strict")  # the strictest output a worker can have
    job_id = gq.add("true")
    proc = run_gpuq(gq, "run", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert gq.state_of(job_id) == "done"
    rejected = os.listdir(gq.home / "rejected")
    assert len([n for n in rejected if n.endswith(".reason")]) == 4, rejected
    assert any(
        n.startswith("nnnn") and "longer than 200" in reason(gq.home, n[:-7]) for n in rejected if n.endswith(".reason")
    )
    assert "line\\nbreak.json: rejected" in proc.stdout  # escaped: no forged log line
    assert not any(line.startswith("break.json") for line in proc.stdout.splitlines())
    assert "bad\\udcff\\udcfename.json: rejected" in proc.stdout
    assert os.listdir(gq.home / "pending") == ["notes.txt"]


# ---- schema: clear reasons --------------------------------------------------------------------
DROPPED_CASES = [
    (b'{"cmd": []}', "'cmd' is empty"),
    (b'{"cmd": "   "}', "'cmd' is empty"),
    (b'{"cmd": [1, 2]}', "'cmd' must be a list of strings"),
    (b'{"cmd": 5}', "'cmd' must be a list of strings"),
    (b'{"cmd": ["true"], "env": {"A": 1}}', "'env' value for 'A' must be a string, not int"),
    (b'{"cmd": ["true"], "env": ["A=1"]}', "'env' must be an object of strings"),
    (b'{"cmd": ["true"], "after": [99]}', "no such job #99"),
    (b'{"cmd": ["true"], "after": "1"}', "'after' must be a list of positive job ids"),
    (b'{"cmd": ["true"], "retries": "3"}', "'retries' must be an integer"),
    (b'{"cmd": ["true"], "priority": 1.5}', "'priority' must be an integer"),
    (b'{"cmd": ["true"], "cwd": "relative/dir"}', "'cwd' must be an absolute path"),
    (b'{"cmd": ["true"], "cwd": "/no/such/dir"}', "cwd does not exist"),
    (b'{"cmd": ["true"], "name": "a\\u0000b"}', "'name' must be printable: it holds a control character"),
    (b'{"cmd": ["true"], "name": "x\\u001b[31mred"}', "'name' must be printable: it holds a control character"),
    (b'{"cmd": ["true"], "name": "' + b"n" * 201 + b'"}', "'name' must be at most 200 characters, not 201"),
    (b'{"cmd": ["true"], "bogus": 1}', "unknown field 'bogus'"),
    (b'{"cmd": ["echo", "\\ud800"]}', "'cmd' has text that cannot be passed to a program"),
    (b'{"cmd": ["true"], "env": {"A": "\\ud800"}}', "'env' variable 'A' has text that cannot be passed"),
    (b'{"cmd": ["true"], "name": "\\ud800"}', "'name' must be printable: it holds a lone surrogate"),
    (b'{"cmd": ["true"], "schema_version": 1}', "looks like a gpuq job file"),
    (b'{"cmd": ["a"], "cmd": ["b"]}', "duplicate key 'cmd'"),
    (b'\xff\xfe{"cmd": ["true"]}', "not valid UTF-8 (byte 0)"),
    (b'{"cmd": ["true"]', "not valid JSON"),
    (b"[1, 2]", "must hold a JSON object, not list"),
    (b'{"cmd": ["true"], "priority": NaN}', "NaN is not a JSON number"),
    (b'{"cmd": ["true"], "priority": 1' + b"0" * 5000 + b"}", "too many digits"),
    (b"[" * 100000, "nested too deeply"),
    (b"", "not valid JSON"),
]


@pytest.mark.parametrize("body,why", DROPPED_CASES, ids=[why for _b, why in DROPPED_CASES])
def test_dropped_file_rejected_with_a_clear_reason(gq: Any, spool: Spool, body: bytes, why: str) -> None:
    drop(gq.home, "job.json", body)
    outcome = take_in(spool, "job.json")
    assert outcome == f"rejected: {reason(gq.home, 'job.json')}"
    assert why in outcome, outcome


CANONICAL_CASES = [
    ({"schema_version": 2}, "unknown schema_version 2"),
    ({"schema_version": True}, "unknown schema_version True"),
    ({"schema_version": 1.0}, "unknown schema_version 1.0"),
    ({"after": [7]}, "a job cannot wait for itself"),
    ({"after_any": [7]}, "a job cannot wait for itself"),
    ({"cmd": []}, "field 'cmd' must be a non-empty list"),
    ({"cmd": [""]}, "field 'cmd' must be a non-empty list"),
    ({"cmd": ["a\x00b"]}, "field 'cmd' must be a non-empty list"),
    ({"cmd": "true"}, "field 'cmd' must be"),
    ({"cmd": ["echo", "\ud800"]}, "field 'cmd' must be a non-empty list"),
    ({"cwd": "/tmp/\ud800"}, "field 'cwd' must be an absolute path"),
    ({"env": {"A": "\udfff"}}, "'env' variable 'A' has text that cannot be passed"),
    ({"env": {"A": 1}}, "'env' value for 'A' must be a string, not int"),
    ({"shell_env": {"A": None}}, "'shell_env' value for 'A' must be a string, not NoneType"),
    ({"env": {"A=B": "1"}}, "'env' has an invalid variable name 'A=B'"),
    ({"env": {"": "1"}}, "'env' has an invalid variable name ''"),
    ({"shell_env": {"A": "1", "B": "x\x00y"}}, "'shell_env' has an invalid variable name 'B'"),
    ({"env": {"A": "é", "B": "\ud800"}}, "'env' variable 'B' has text that cannot be passed"),
    ({"pid": 0}, "field 'pid' must be null or a process id"),
    ({"pid": 2**40}, "field 'pid' must be null or a process id"),
    ({"pid": "12"}, "field 'pid' must be null or a process id, not \"12\""),
    ({"started_at": "yesterday"}, "field 'started_at' must be null or an ISO 8601 time"),
    ({"priority": "high"}, "field 'priority' must be an integer"),
    ({"history": "none"}, "field 'history' must be a list of objects"),
    ({"id": 8}, "file name says id 7 but the file says 8"),
    ({"id": -7}, "field 'id' must be an integer from 1"),
    ({"rev": "0"}, "field 'rev' must be an integer"),
]


@pytest.mark.parametrize("change,why", CANONICAL_CASES, ids=[why for _c, why in CANONICAL_CASES])
def test_canonical_file_rejected_with_a_clear_reason(gq: Any, spool: Spool, change: dict, why: str) -> None:
    job = valid_job(7, **change)
    drop(gq.home, "000007-x.json", json.dumps(job).encode())
    with pytest.raises(schema.InvalidJob) as info:
        spool.jobs.load(JobRef(7, "pending", "000007-x.json"))
    assert why in str(info.value)


def test_missing_field_is_named(gq: Any, spool: Spool) -> None:
    job = valid_job(7)
    del job["cmd"]
    drop(gq.home, "000007-x.json", json.dumps(job).encode())
    with pytest.raises(schema.InvalidJob, match="missing field 'cmd'"):
        spool.jobs.load(JobRef(7, "pending", "000007-x.json"))


# ---- resource exhaustion ----------------------------------------------------------------------
def assert_nothing_half_written(home: Path) -> None:
    assert os.listdir(home / "pending") == []  # dot-files included
    assert os.listdir(home / "tmp") == []


def test_full_disk_while_adding_gives_a_clear_error_and_no_partial_file(gq: Any) -> None:
    """RLIMIT_FSIZE makes the kernel refuse to grow a file past the limit (EFBIG), exactly where a
    full disk refuses with ENOSPC: in the middle of writing the job file."""
    gq.gpuq("status")

    def small_files_only() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))

    proc = run_gpuq(gq, "add", "true", preexec=small_files_only)
    assert_clean_error(proc, "cannot write to the spool", "free some space")
    assert_nothing_half_written(gq.home)
    job_id = gq.add("true")  # once there is room again, everything works
    gq.gpuq("run")
    assert gq.state_of(job_id) == "done"


@pytest.mark.skipif(not IS_ROOT or not sys.platform.startswith("linux"), reason="mounting a tmpfs needs root")
def test_really_full_disk_while_adding(gq: Any, tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mount)]).returncode:
        pytest.skip("cannot mount a tmpfs here (no CAP_SYS_ADMIN?)")
    try:
        home = mount / "spool"
        env = dict(gq.env, GPUQ_HOME=str(home))
        assert run_gpuq(gq, "status", env=env).returncode == 0
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:  # fill the disk to the last block
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        proc = run_gpuq(gq, "add", "true", env=env)
        assert_clean_error(proc, "No space left on device", "free some space")
        assert_nothing_half_written(home)
    finally:
        subprocess.run(["umount", "-l", str(mount)])


def test_a_thousand_bad_files_do_not_stop_good_jobs(gq: Any) -> None:
    """1,000 bad files of every kind dropped at once, while good jobs are queued and one good file
    is still being written: the good jobs run, every bad file ends in rejected/ with its reason,
    the half-written file waits, and the worker keeps going."""
    Spool(gq.home).ensure()
    worker = gq.start_worker("--watch")
    wait_for(lambda: "started" in gq.worker_output(), 20, what="the worker to start")
    secret = gq.work / "secret.json"
    secret.write_bytes(GOOD_DROP)
    pending = gq.home / "pending"
    # a good file a slow program is still writing: it must not be rejected half-way
    writer = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER, str(pending / "slow.json")], stdin=subprocess.PIPE, text=True
    )
    wait_for(lambda: (pending / "slow.json").exists(), what="the slow writer")
    started = time.monotonic()
    for i in range(1000):
        kind = i % 5
        if kind == 0:
            drop(gq.home, f"bad{i:04d}.json", b'{"cmd": ')
        elif kind == 1:
            drop(gq.home, f"bad{i:04d}.json", b'{"cmd": 5}')
        elif kind == 2:
            (pending / f"bad{i:04d}.json").symlink_to(secret)
        elif kind == 3:
            drop(gq.home, f"bad{i:04d}.json", GOOD_DROP, mode=0o666)
        else:
            drop(gq.home, f"{900000 + i:06d}-bad.json", b"{}")  # named like a job, but is not one
    first = gq.add("true")
    second = gq.add("--after", str(first), "true")
    wait_for(lambda: is_in(gq, second, "done"), 60, what="the good jobs to run")
    good_done = time.monotonic() - started
    assert good_done < 20  # measured 1-2 s here; the bad files must not be worked through first

    def reasons() -> list[str]:
        return [n for n in os.listdir(gq.home / "rejected") if n.endswith(".reason")]

    wait_for(lambda: len(reasons()) >= 1000, 120, interval=0.2, what="1,000 rejections")
    expected = {f"bad{i:04d}.json.reason" for i in range(1000) if i % 5 != 4}
    expected |= {f"{900000 + i:06d}-bad.json.reason" for i in range(4, 1000, 5)}
    assert set(reasons()) == expected, sorted(set(reasons()) ^ expected)
    assert (pending / "slow.json").exists()  # still open for writing: waits, not rejected
    writer.communicate("go\n", timeout=10)
    wait_for(lambda: "slow.json: job #" in gq.worker_output(), 30, what="the slow file to be taken in")
    slow_id = int(gq.worker_output().split("slow.json: job #")[1].split()[0])
    wait_for(lambda: is_in(gq, slow_id, "done"), 30, what="the slow file's job to run")
    assert worker.poll() is None, gq.worker_output()
    assert secret.read_bytes() == GOOD_DROP
    assert all((gq.home / "rejected" / f"bad{i:04d}.json").is_symlink() for i in range(2, 1000, 5))
    print(f"good jobs done {good_done:.2f}s after 1,000 bad files were dropped")


_SLOW_WRITER = """
import sys
with open(sys.argv[1], "w") as fh:
    fh.write('{"cmd": ["tr')
    fh.flush()
    sys.stdin.readline()
    fh.write('ue"]}')
"""


def test_rejecting_a_file_already_gone_leaves_rejected_untouched(spool: Spool) -> None:
    """The worker's view of pending/ lags its events, so it may try again to reject a file it has
    just rejected: no reason may appear in rejected/ for it, even for an instant (`.ci/run` once
    counted 1,001 reasons for 1,000 bad files, a NAME.1.reason placed before the move failed)."""
    first = drop(Path(spool.home), "gone.json", b"{}")
    spool.dropbox.reject(first.name, "not a job")
    rejected = Path(spool.home) / "rejected"
    os.utime(rejected, (1_000_000_000, 1_000_000_000))  # any entry made or removed would change it
    with pytest.raises(FileNotFoundError):
        spool.dropbox.reject(first.name, "not a job")
    assert os.stat(rejected).st_mtime == 1_000_000_000
    assert sorted(os.listdir(rejected)) == ["gone.json", "gone.json.reason"]


def test_a_broken_job_file_seen_while_written_is_rejected_at_a_later_quiet_look(spool: Spool) -> None:
    """A job file in pending/ made invalid by hand, first seen within the intake's quiet time, is
    left for later; nothing announces that its writer is done, and the worker's quiet steps (pending/
    unchanged) skipped it for a minute: a `gpuq wait` for it waited so. The next look rejects it."""
    pending = Path(spool.home) / "pending"
    broken = pending / "000007-broken.json"
    broken.write_text('{"schema_version": 1, "id": 7, "na')
    written = os.stat(broken).st_mtime
    for sub in ("pending", "running", "locks", "control"):  # old listings: no change they could race
        os.utime(Path(spool.home) / sub, (written - 3600, written - 3600))
    worker = Worker(spool, Launcher(spool), say=lambda _line: None)
    worker.step(written)  # just written: it may still be being written
    assert broken.exists()
    worker.step(written + intake.quiet_seconds() + 1, woken=False)  # a periodic look, nothing new
    assert not broken.exists() and (Path(spool.home) / "rejected" / broken.name).exists()


def test_a_file_finished_while_intake_looks_at_it_is_taken_in(gq: Any, spool: Spool) -> None:
    """The writer may close the file between intake's read (partial) and its look at /proc (no
    writer any more): that file is complete, and must become a job, not be rejected."""
    for trial in range(10):
        path = gq.home / "pending" / f"race{trial}.json"
        writer = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(path)], stdin=subprocess.PIPE, text=True)
        wait_for(lambda: path.exists() and path.stat().st_size > 0, what="the partial file")  # noqa: B023
        os.utime(path, (time.time() - 60, time.time() - 60))  # the quiet period is over
        writer.stdin.write("go\n")
        writer.stdin.flush()  # the writer finishes now, while intake is looking
        outcomes = [intake.take_in(spool, path.name, time.time()) for _ in range(200)]
        writer.wait(10)
        outcomes = [o for o in outcomes if o not in ("waiting", "gone")]
        assert outcomes and outcomes[0].startswith("job #"), (trial, outcomes)


def test_an_argument_that_is_not_utf8_reaches_the_job_byte_for_byte(gq: Any) -> None:
    """`gpuq add` keeps undecodable argument bytes (Python holds them as \\udcXX; the job file
    stores them as \\u escapes) instead of failing with a traceback."""
    out = gq.work / "out"
    args = [sys.executable, "-m", "gpuq", "add", "-q", "sh", "-c", b'printf %s "$1" > out', "sh", b"caf\xe9"]
    proc = subprocess.run(args, cwd=gq.work, env=gq.env, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout)
    gq.gpuq("run")
    assert gq.state_of(job_id) == "done"
    assert out.read_bytes() == b"caf\xe9"


_MANY_WRITER = """
import os, sys
files = [open(os.path.join(sys.argv[1], f"w{i:03d}.json"), "w") for i in range(int(sys.argv[2]))]
for fh in files:
    fh.write('{"cmd": ["tr')
    fh.flush()
print("written", flush=True)
sys.stdin.readline()
for fh in files:
    fh.write('ue"]}')
    fh.close()
"""


def test_many_files_being_written_cost_one_look_at_proc(gq: Any, spool: Spool, monkeypatch: Any) -> None:
    """Hundreds of half-written files in one intake pass: each is seen as still being written
    (none rejected half-way), and /proc is read a few times per pass, not once per file."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs Linux /proc")
    count = 150
    scans = []
    real_scan = intake._scan_writers
    monkeypatch.setattr(intake, "_scan_writers", lambda prefix: scans.append(prefix) or real_scan(prefix))
    pending = gq.home / "pending"
    writer = subprocess.Popen(
        [sys.executable, "-c", _MANY_WRITER, str(pending), str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout.readline().strip() == "written"
    began = time.monotonic()
    outcomes = intake.take_in_some(spool, time.time() + 60)[0]  # every quiet period is over
    took = time.monotonic() - began
    assert outcomes == [] and len(os.listdir(pending)) == count  # all waiting, none rejected
    assert 1 <= len(scans) <= 2 + took / intake.Writers.MAX_AGE, (len(scans), took)
    writer.communicate("go\n", timeout=30)
    outcomes = intake.take_in_some(spool, time.time() + 60)[0]
    assert len(outcomes) == count and all(o.startswith("job #") for _n, o in outcomes)


def test_a_script_named_with_escapes_gives_a_printable_name_and_status_prints_none_raw(gq: Env) -> None:
    script = gq.work / "ev\x1b[41mil\x1b]0;PWNED\x07.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    added = gq.gpuq("add", "--", f"./{script.name}")
    assert "\x1b" not in added.stdout and "ev\\x1b[41mil\\x1b]0;PWNED\\x07" in added.stdout
    job = gq.job(1)
    assert job["name"] == "work/ev\\x1b[41mil\\x1b]0;PWNED\\x07"
    shown = gq.gpuq("status").stdout + gq.gpuq("show", "1").stdout
    assert "\x1b" not in shown and "\x07" not in shown
    # a file dropped by hand (and --name) with one is refused; a published job file written before
    # names were checked still loads
    with pytest.raises(schema.InvalidJob, match="name"):
        schema.normalize_dropped({"cmd": ["true"], "name": "a\x1b]0;PWNED\x07"})
    with pytest.raises(schema.InvalidJob, match="name"):
        schema.normalize_dropped({"cmd": ["true"], "name": "a\x9bb"})  # C1's one-byte CSI
    assert schema.validate(dict(job, name="tab\there"))["name"] == "tab\there"
