"""A full disk (issue 14), on a real small filesystem (a tmpfs this test mounts; skipped where
mounting is not permitted): every exit code is kept, the worker lives on and starts the next job
once there is room, and gpuq itself can make room. Also the log cap, which needs no mount."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from conftest import WAIT_FOR_GO, Env, fill_up, small_tmpfs, spool_with_true_jobs, wait_for

FILL = """import os, sys
chunk = b"x" * (256 * 1024)
try:
    while True:
        os.write(1, chunk)
except OSError:
    os._exit(7)  # the disk is full: a job that says so with its own exit code
"""


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, "8m") as mount:
        yield mount


@pytest.fixture
def gq_full(gq: Env, small_fs: Path) -> Env:
    """gq with its spool and its jobs' working directory on the small filesystem."""
    gq.home = small_fs / "spool"
    gq.env["GPUQ_HOME"] = str(gq.home)
    gq.work = small_fs / "work"
    gq.work.mkdir()
    return gq


def waiting(gq: Env, job_id: int) -> str:
    return next(r for r in gq.status_json() if r["id"] == job_id)["waiting"] or ""


def test_a_job_that_fills_the_disk_keeps_its_exit_code_and_the_worker_goes_on(gq_full: Env) -> None:
    gq = gq_full
    gq.script("fill.py", FILL)
    gq.script("ok.py", "print('next job ran')\n")
    filler = gq.add("fill.py")
    later = gq.add("ok.py")
    extra = gq.add("ok.py")
    worker = gq.start_worker("--watch")

    failed = gq.wait_state(filler, "failed", timeout=60)
    assert failed["exit_code"] == 7  # the real exit code, not lost to the full disk
    assert "disk was full" in failed["note"]
    assert worker.poll() is None  # the worker lives on
    wait_for(lambda: "waiting for disk space" in waiting(gq, later), 20, what="the next job to wait for space")
    assert gq.state_of(later) == "pending"

    fill_up(gq.work)  # really full now: `add` needs room it cannot have
    before = gq.files("pending")
    refused = gq.gpuq("add", "ok.py", check=False)
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1
    assert "cannot write to the spool" in refused.stderr
    assert gq.files("pending") == before and len(before) == 2  # nothing half-added
    assert not [n for n in os.listdir(gq.home / "tmp") if n.startswith(".job")]

    gq.gpuq("cancel", str(extra))  # a person can still act on a full disk
    assert gq.state_of(extra) == "cancelled"
    out = gq.gpuq("clear", "--logs").stdout
    assert "dropped the logs of" in out and "freeing" in out
    freed = float(out.split("freeing ")[1].split(" MiB")[0])
    assert freed >= 5.0  # the filler's log
    gq.wait_state(later, "done", timeout=30)  # space came back: the worker started it by itself
    assert "next job ran" in gq.log(later)
    assert worker.poll() is None


def test_status_warns_when_the_spool_is_nearly_full(gq_full: Env) -> None:
    gq = gq_full
    gq.gpuq("status")
    fill_up(gq.work)
    out = gq.gpuq("status").stdout
    assert "warning: disk full: the spool's filesystem has 0% free" in out


def test_an_end_noted_in_the_lock_file_survives_its_supervisor(gq: Env) -> None:
    """A supervisor that waited for room (its job's end noted in the claim's lock file) and then
    died: the next look records the end with the noted exit code."""
    gq.script("t.py", "")
    job_id = gq.add("t.py")
    code = (
        "import sys, time\nfrom gpuq.spool import Spool\nfrom gpuq.core import transitions\n"
        "s = Spool(sys.argv[1]); ref = s.jobs.find(int(sys.argv[2])); job = s.jobs.load(ref)\n"
        "claim = s.claims.claim(job['id'])\n"
        "started = transitions.start(job, slot=None, gpus=None, boot_id='b', host='h', log='')\n"
        "s.jobs.move(ref, job, 'running', started)\n"
        "claim.note({'pid': 1, 'exit_code': 3, 'state': 'failed', 'waiting': 'disk full'})\n"
    )
    subprocess.run([sys.executable, "-c", code, str(gq.home), str(job_id)], check=True)  # dies holding nothing
    gq.gpuq("status")
    job = gq.wait_state(job_id, "failed")
    assert job["exit_code"] == 3 and "noted by its supervisor while the disk was full" in job["note"]


def test_an_end_noted_on_a_disk_still_full_waits_for_room_and_is_kept(gq_full: Env) -> None:
    """The supervisor died while the disk was still full: a look that cannot record the noted end
    yet must leave the note where it is (it used to remove the lock file holding it, and the job
    was later recorded interrupted, its exit code lost), and `status` must still answer."""
    from gpuq.spool import Spool

    gq = gq_full
    gq.script("t.py", "")
    job_id = gq.add("t.py")
    code = (
        "import sys\nfrom gpuq.spool import Spool\nfrom gpuq.core import transitions\n"
        "s = Spool(sys.argv[1]); ref = s.jobs.find(int(sys.argv[2])); job = s.jobs.load(ref)\n"
        "claim = s.claims.claim(job['id'])\n"
        "started = transitions.start(job, slot=None, gpus=None, boot_id='b', host='h', log='')\n"
        "s.jobs.move(ref, job, 'running', started)\n"
        "claim.note({'pid': 1, 'exit_code': 5, 'state': 'failed', 'waiting': 'disk full'})\n"
    )
    subprocess.run([sys.executable, "-c", code, str(gq.home), str(job_id)], check=True, env=gq.env)
    spool = Spool(gq.home)
    spool.files.give_up_emergency_room()
    filler = fill_up(gq.work)
    for _look in range(2):
        assert gq.gpuq("status", check=False).returncode == 0
        assert gq.state_of(job_id) == "running" and (spool.claims.noted(job_id) or {}).get("exit_code") == 5
    filler.unlink()
    gq.gpuq("status")
    job = gq.wait_state(job_id, "failed")
    assert job["exit_code"] == 5 and "noted by its supervisor while the disk was full" in job["note"]


def test_a_file_dropped_on_a_full_disk_is_rejected_with_its_reason_once_there_is_room(gq_full: Env) -> None:
    """spool_layout.md section 3: a refused file has its one-line reason. On a full disk the reason
    cannot be written: the file used to go to rejected/ without it, for good."""
    gq = gq_full
    gq.gpuq("status")
    gq.start_worker("--watch")
    wait_for(lambda: "watching for new jobs" in gq.worker_output(), 15, what="the worker")
    staged = gq.work / "bad.json"  # on the same filesystem: moved in at once, as a finished drop is
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b'{"cmd": "echo x", "bogus": 2}')
    os.close(fd)
    filler = fill_up(gq.work)
    os.rename(staged, gq.home / "pending" / "bad.json")
    wait_for(lambda: "disk full" in gq.worker_output(), 15, what="the worker to find the disk full")
    assert gq.files("pending") == ["bad.json"] and not gq.files("rejected")
    filler.unlink()
    wait_for(lambda: gq.files("rejected"), 15, what="the file rejected")
    assert "rejected/bad.json" in (out := gq.gpuq("rejected").stdout) and "unknown field 'bogus'" in out, out


def test_cancel_and_clear_work_on_a_full_disk_where_no_worker_ever_ran(gq_full: Env) -> None:
    """The emergency room comes with the spool: jobs only added, never a worker, and a full disk."""
    gq = gq_full
    gq.script("ok.py", "")
    first, second, third = (gq.add("ok.py") for _ in range(3))
    assert (gq.home / "reserve").stat().st_size == 256 * 1024  # made with the spool by the first `add`
    queued = {name: (gq.home / "pending" / name).read_bytes() for name in gq.files("pending")}
    fill_up(gq.work)

    gq.gpuq("cancel", str(second))
    cancelled = gq.job(second)
    assert gq.state_of(second) == "cancelled" and cancelled["note"] == "cancelled by user"
    assert (gq.home / "reserve").exists()  # what the cancel did not need is kept as a (smaller) room
    out = gq.gpuq("clear").stdout
    assert "removed 1 finished job," in out and gq.state_of(second) is None
    left = {name: (gq.home / "pending" / name).read_bytes() for name in gq.files("pending")}
    assert left == {name: data for name, data in queued.items() if not name.startswith(f"{second:06d}-")}
    assert [gq.state_of(i) for i in (first, third)] == ["pending", "pending"]
    assert not os.listdir(gq.home / "tmp") and not os.listdir(gq.home / "locks")


def test_clear_needs_no_room_at_all(gq_full: Env) -> None:
    """With the emergency room used up and the disk full again, `clear` still removes finished jobs."""
    gq = gq_full
    gq.script("ok.py", "")
    job_id = gq.add("ok.py")
    gq.gpuq("cancel", str(job_id))
    (gq.home / "reserve").unlink(missing_ok=True)
    fill_up(gq.work)
    out = gq.gpuq("clear").stdout
    assert "removed 1 finished job," in out and gq.state_of(job_id) is None
    assert not os.listdir(gq.home / "locks")


def test_clear_on_a_full_disk_keeps_the_history_in_the_room_its_logs_free(gq_full: Env) -> None:
    """`clear` drops the logs first, then keeps the jobs' runs in the room that made (kept-runs)."""
    gq = gq_full
    gq.script("chatty.py", "import sys\nsys.stdout.write('x' * (2 << 20))\n")
    job_id = gq.add("chatty.py")
    gq.gpuq("run")
    assert json.loads(gq.gpuq("history", "--json").stdout)[0]["runs"] == 1
    (gq.home / "reserve").unlink(missing_ok=True)
    fill_up(gq.work)
    out = gq.gpuq("clear").stdout
    assert "removed 1 finished job," in out and gq.state_of(job_id) is None
    assert json.loads(gq.gpuq("history", "--json").stdout)[0]["runs"] == 1


def test_a_filesystem_too_small_for_the_full_room_gets_a_smaller_one(tmp_path: Path) -> None:
    from gpuq.engine.lifecycle import actions, enqueue
    from gpuq.spool import Spool
    from gpuq.spool.files import RESERVE_BYTES, RESERVE_FLOOR

    with small_tmpfs(tmp_path, "512k") as mount:
        spool = Spool(mount / "spool").ensure()
        size = os.path.getsize(spool.layout.top_file("reserve"))
        assert RESERVE_FLOOR <= size < RESERVE_BYTES
        jobs = [
            enqueue.enqueue(
                spool, cmd=["true"], cwd=mount, name=None, venv=None, env={}, shell_env={},
                after=[], after_any=[], retries=0,
            )
            for _ in range(2)
        ]  # fmt: skip
        fill_up(mount)
        cancelled = actions.cancel(spool, jobs[0][1]["id"])
        assert cancelled["rev"] == jobs[0][1]["rev"] + 1 and spool.jobs.find(cancelled["id"]).state == "cancelled"
        assert spool.jobs.find(jobs[1][1]["id"]).state == "pending"


def test_add_makes_the_room_again_and_grows_a_small_one(tmp_path: Path) -> None:
    """`add` keeps the emergency room (a stat when it is there), so a spool that never sees a worker
    has it again once a full disk has passed."""
    from gpuq.engine.lifecycle import enqueue
    from gpuq.spool.files import RESERVE_BYTES

    spool, [(_ref, job)] = spool_with_true_jobs(tmp_path)
    room = Path(spool.layout.top_file("reserve"))
    assert spool.files.give_up_emergency_room() and not room.exists()
    queue = dict(cwd=tmp_path / "work", name=None, venv=None, env={}, shell_env={}, after=[], after_any=[], retries=0)
    enqueue.enqueue(spool, cmd=["true"], **queue)
    assert room.stat().st_size == RESERVE_BYTES
    room.write_bytes(bytes(32 * 1024))  # made small on a disk that was nearly full
    enqueue.enqueue(spool, cmd=["true"], **queue)
    assert room.stat().st_size == RESERVE_BYTES


# The supervisor's part: it takes the job's preemption request, and its end does not fit on the disk.
NOTED_PREEMPTION = """import os, sys
from gpuq.core import transitions
from gpuq.run.supervisor import end, start
from gpuq.run.supervisor.order import StartOrder
from gpuq.spool import Spool
spool, job_id = Spool(sys.argv[1]), int(sys.argv[2])
ref = spool.jobs.find(job_id)
job = spool.jobs.load(ref)
claim = spool.claims.claim(job_id)
started = transitions.start(job, slot=None, gpus=None, boot_id="b", host="h", log=job["log"])
ref, job = spool.jobs.move(ref, job, "running", started)
run = start.Run(spool, claim, ref, job, order=StartOrder(job_id, None, None, None, None))
run.log_fd = spool.logs.open_job_log(job_id)
print("running", flush=True)
sys.stdin.readline()  # the job has saved a checkpoint and been preempted; the disk is full
end.finish(run, exit_code=143, sig=None, note=None, retry=False)  # notes the end, waits for room
"""


def test_a_noted_preemption_keeps_its_checkpoint_when_its_supervisor_dies(gq_full: Env) -> None:
    """An urgent preemption's end, noted in the lock file on a full disk by a supervisor that then
    died: recovery records the preemption (its checkpoint, resumed by itself) as the supervisor would have."""
    from gpuq.core.states import PREEMPT_RESUME
    from gpuq.spool import Spool

    gq = gq_full
    gq.script("train.py", "")
    job_id = gq.add("train.py", "--output_dir", "out")
    supervisor = subprocess.Popen(
        [sys.executable, "-c", NOTED_PREEMPTION, str(gq.home), str(job_id)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=gq.env,
    )  # fmt: skip
    try:
        assert supervisor.stdout.readline() == "running\n"
        ckpt = gq.work / "out" / "checkpoint-30"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 30}))
        spool = Spool(gq.home)
        spool.control.request(job_id, PREEMPT_RESUME)  # as the worker asks for room for an urgent job
        spool.files.give_up_emergency_room()
        filler = fill_up(gq.work)
        supervisor.stdin.write("go\n")
        supervisor.stdin.flush()
        wait_for(lambda: (spool.claims.noted(job_id) or {}).get("waiting"), 10, what="the end noted")
    finally:
        supervisor.kill()
        supervisor.wait()
    filler.unlink()
    gq.gpuq("status")
    job = gq.wait_state(job_id, "preempted")
    assert job["exit_code"] == 143 and "noted by its supervisor" in job["note"]
    assert job["checkpoint"] == str(ckpt) and job["preemptions"][-1]["checkpoint"] == str(ckpt)
    assert job["preemptions"][-1]["by"] == "urgent job" and job["auto_resume"] is True


def test_a_capped_log_keeps_its_head_and_newest_tail(gq: Env) -> None:
    gq.script(
        "chatty.py",
        "import sys, time\nfor i in range(30000):\n    print(f'line {i:06d} ' + 'x' * 40)\n"
        "    if i % 3000 == 0: sys.stdout.flush(); time.sleep(0.05)\nprint('the end')\n",
    )
    cap = 64 * 1024
    job_id = gq.add("--max-log-size", "64K", "chatty.py")
    log = gq.home / "logs" / f"{job_id:06d}.log"
    gq.start_worker()
    sizes = []
    wait_for(lambda: sizes.append(log.stat().st_size if log.exists() else 0) or gq.state_of(job_id) == "done", 60)
    assert max(sizes) <= cap + 1024  # never past the cap (the supervisor's own lines aside)
    text = log.read_text()
    assert "line 000000" in text and "log cut here (--max-log-size)" in text
    tail = gq.gpuq("log", str(job_id), "-n", "3").stdout.splitlines()
    assert tail[0].startswith("line 029999") and tail[1] == "the end" and tail[2].startswith("=== gpuq: exit 0")
    dropped = int(text.split("log cut here (--max-log-size):")[1].split("bytes")[0])
    assert dropped + len(text.encode()) > 30000 * 52  # what was left out plus what is there: everything
    assert json.loads(gq.gpuq("show", "--json", str(job_id)).stdout)["max_log_bytes"] == cap


def test_a_long_job_keeps_its_end_through_the_tmp_cleaner(gq: Env) -> None:
    """The cleaner's 10-minute rule for tmp/ must not take anything a supervisor needs to record
    its job's end (it once took the room of every job longer than that, and the job's end was lost:
    `interrupted`). The cleaner is asked to look as if 11 minutes had passed."""
    from gpuq.spool import Spool

    gq.script("wait.py", WAIT_FOR_GO)
    job_id = gq.add("wait.py")
    gq.start_worker("--watch")
    wait_for(lambda: gq.job(job_id).get("pid"), 20, what="the job running")
    Spool(gq.home).files.clean_tmp(now=time.time() + 660)  # what the worker's repair runs every few seconds
    (gq.work / "go").write_text("")
    done = gq.wait_state(job_id, "done", 20)
    assert done["exit_code"] == 0


def test_the_tmp_cleaner_takes_a_dead_or_stuck_writers_file(tmp_path: Path) -> None:
    from gpuq.spool import Spool

    spool = Spool(tmp_path / "spool").ensure()
    tmp = Path(spool.layout.tmp_dir())
    mine = tmp / f".job-{os.getpid()}-1-00000000"  # this process: alive, and writing now
    mine.write_bytes(b"x")
    dead = tmp / ".job-999999999-1-00000000"
    dead.write_bytes(b"x")
    stuck = tmp / f".job-{os.getpid()}-2-00000000"  # alive, but 11 minutes on one file
    stuck.write_bytes(b"x")
    before = time.time() - 660
    os.utime(stuck, (before, before))
    assert spool.files.clean_tmp() == 2
    assert mine.exists() and not dead.exists() and not stuck.exists()


def test_status_shows_an_end_waiting_for_room_as_ended_and_says_when_its_supervisor_is_gone(gq_full: Env) -> None:
    """A job whose end waits for room (noted in its lock file): `status` shows it ended, its time
    stopped at its end, not `running ... pid=`; and once its supervisor is killed, the warning no
    longer says the supervisor records it."""
    from gpuq.spool import Spool

    gq = gq_full
    gq.script("t.py", "")
    job_id = gq.add("t.py")
    supervisor = subprocess.Popen(
        [sys.executable, "-c", NOTED_PREEMPTION, str(gq.home), str(job_id)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=gq.env,
    )  # fmt: skip
    spool = Spool(gq.home)
    try:
        assert supervisor.stdout.readline() == "running\n"
        spool.files.give_up_emergency_room()
        filler = fill_up(gq.work)
        supervisor.stdin.write("go\n")
        supervisor.stdin.flush()
        wait_for(lambda: (spool.claims.noted(job_id) or {}).get("waiting"), 10, what="the end noted")
        rows = [line for line in gq.gpuq("status").stdout.splitlines() if line.split()[:1] == [str(job_id)]]
        assert "ended (exit 143), waiting for room" in rows[0] and "pid=" not in rows[0]
        row = next(r for r in gq.status_json() if r["id"] == job_id)
        assert row["exit_code"] == 143 and row["finished_at"]
        assert "its supervisor records it as soon as there is room" in gq.gpuq("status").stdout
    finally:
        supervisor.kill()
        supervisor.wait()
    out = gq.gpuq("status").stdout
    assert "its supervisor is gone; the next look records it as soon as there is room" in out
    filler.unlink()
    gq.gpuq("status")
    assert gq.wait_state(job_id, "failed")["exit_code"] == 143
