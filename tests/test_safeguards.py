"""What batch queues learned (issue 17): time limits, delayed starts, drain and wait, why a job
failed, and which code it ran. Real workers, real jobs, real git repositories."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import WAIT_FOR_GO, Env, spool_with_true_jobs, wait_for
from test_gpu_worker import fake_gpus

from gpuq.core.times import parse_iso

FAKE = Path(__file__).with_name("fake_trainer.py")
FOREVER = """import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open("pids", "w").write(f"{os.getpid()} {child.pid}")
while True:
    time.sleep(0.1)
"""


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is gone too
        return fh.read().split(")")[-1].split()[0] == "Z"


def test_a_job_over_its_time_limit_is_stopped_and_fails_with_a_note(gq: Env) -> None:
    gq.script("forever.py", FOREVER)
    job_id = gq.add("--time", "2s", "forever.py")
    gq.start_worker("--watch")
    pids = [
        int(p) for p in wait_for(lambda: (gq.work / "pids").exists() and (gq.work / "pids").read_text(), 15).split()
    ]
    job = gq.wait_state(job_id, "failed", timeout=30)
    ran = parse_iso(job["finished_at"]) - parse_iso(job["started_at"])
    assert 2 <= ran < 20 and job["time_limit"] == 2  # stopped at its limit: it would run forever
    assert "time limit of 2s was reached" in job["note"] and job["reason"] == "time limit of 2s reached"
    wait_for(lambda: all(gone(pid) for pid in pids), 15, what="the job's whole process group to be gone")
    assert "time limit of 2s" in gq.gpuq("status").stdout


def test_a_preemptible_job_over_its_time_limit_is_preempted_with_its_checkpoint(gq: Env) -> None:
    shutil.copy(FAKE, gq.work / "fake_trainer.py")
    args = (
        "--output_dir",
        "out",
        "--max_steps",
        "1000",
        "--save_steps",
        "50",
        "--step_time",
        "0.05",
        "--save_on_sigterm",
    )
    job_id = gq.add("--time", "2s", "--preemptible", "-p", sys.executable, "fake_trainer.py", *args)
    gq.start_worker("--watch")
    job = gq.wait_state(job_id, "preempted", timeout=30)
    record = job["preemptions"][-1]
    assert record["checkpoint"] and (Path(record["checkpoint"]) / "trainer_state.json").exists()
    assert "time limit of 2s" in job["note"]
    assert f"resumes from {record['checkpoint']}" in gq.gpuq("resume", "--back", str(job_id)).stdout


def test_begin_starts_no_earlier_and_not_much_later(gq: Env) -> None:
    gq.script("stamp.py", "import time\nopen('started', 'w').write(repr(time.time()))\n")
    gq.start_worker("--watch")
    wait_for(lambda: gq.gpuq("status").stdout.startswith("worker: running"), 15)
    asked = time.time()
    job_id = gq.add("--begin", "+3s", "stamp.py")
    begin = parse_iso(gq.job(job_id)["begin_at"])
    assert 2.5 <= begin - asked <= 4.0
    assert "starts at" in next(r for r in gq.status_json() if r["id"] == job_id)["waiting"]
    started = float(wait_for(lambda: (gq.work / "started").exists() and (gq.work / "started").read_text(), 15))
    assert begin <= started <= begin + 1.0


def test_stop_drain_lets_the_running_job_finish_and_starts_none(gq: Env) -> None:
    gq.script("slow.py", "import time\nwhile not __import__('os').path.exists('finish'): time.sleep(0.05)\n")
    gq.script("t.py", "")
    running = gq.add("slow.py")
    waiting = gq.add("t.py")
    worker = gq.start_worker("--watch")
    gq.wait_state(running, "running")
    out = gq.gpuq("stop", "--drain").stdout
    assert "starting nothing new" in out
    wait_for(lambda: "draining" in gq.gpuq("status").stdout, 10, what="status to say the worker drains")
    (gq.work / "finish").write_text("")
    assert worker.wait(20) == 0
    assert gq.state_of(running) == "done" and gq.state_of(waiting) == "pending"
    assert "drained" in gq.worker_output()


# A job with progress (so an ETA, and a start time for the job behind it) until `finish` is written.
PROGRESSING = f"""import os, sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
from gpuq.integrations import ProgressWriter
w = ProgressWriter(min_interval=0)
step = 0
while not os.path.exists("finish"):
    step += 1
    w.update(step, 100000)
    time.sleep(0.05)
"""


def test_while_the_worker_drains_a_pending_job_is_said_to_wait_for_it_with_no_start_time(gq: Env) -> None:
    gq.script("progress.py", PROGRESSING)
    running = gq.add("--gpus", "0", "progress.py")
    waiting = gq.add("--gpus", "0", "true")
    worker = gq.start_worker("--watch")
    row = lambda: next(r for r in gq.status_json() if r["id"] == waiting)  # noqa: E731
    wait_for(lambda: row()["starts_in_seconds"] is not None, 20, what="a start time behind the running job")
    gq.gpuq("stop", "--drain")
    wait_for(lambda: "draining" in gq.gpuq("status").stdout, 10, what="status to say the worker drains")
    draining = "the worker is draining (`gpuq stop --drain`): it starts nothing new"
    assert row()["waiting"].startswith(draining) and row()["starts_in_seconds"] is None
    assert draining in row()["eta_method"]
    (line,) = [line for line in gq.gpuq("status").stdout.splitlines() if line.split()[:1] == [str(waiting)]]
    assert draining in line and "starts ~" not in line, line
    assert f"  state      pending: {draining}" in gq.gpuq("show", str(waiting)).stdout
    assert json.loads(gq.gpuq("triage", "--json", str(waiting)).stdout)["waiting_for"].startswith(draining)
    (gq.work / "finish").write_text("")
    assert worker.wait(20) == 0
    assert gq.state_of(running) == "done" and gq.state_of(waiting) == "pending"


def test_while_the_worker_drains_a_job_waiting_for_a_gpu_or_its_begin_time_is_said_to_wait_for_it(
    gq: Env, tmp_path: Path
) -> None:
    """status, show and triage said a pending job waited "for a free GPU (0: job #1)" (the draining
    worker's last view) and a --begin job "starts at 01:38 (--begin)", though neither would start."""
    (tmp_path / "gpus.json").write_text(json.dumps(fake_gpus(1)))
    gq.env["GPUQ_FAKE_GPUS"] = str(tmp_path / "gpus.json")
    gq.script("wait.py", WAIT_FOR_GO)
    running = gq.add("wait.py")
    worker = gq.start_worker("--watch")
    gq.wait_state(running, "running")
    behind, later = gq.add("true"), gq.add("--begin", "+1h", "true")
    gpu_wait = lambda: next(r for r in gq.status_json() if r["id"] == behind)["waiting"] or ""  # noqa: E731
    wait_for(lambda: "free GPU" in gpu_wait(), 20, what="the worker to say the job waits for the GPU")
    gq.gpuq("stop", "--drain")
    wait_for(lambda: "draining" in gq.gpuq("status").stdout, 10, what="status to say the worker drains")
    draining = "the worker is draining (`gpuq stop --drain`): it starts nothing new"
    for job in (behind, later):
        (line,) = [line for line in gq.gpuq("status").stdout.splitlines() if line.split()[:1] == [str(job)]]
        assert draining in line, line
        assert f"  state      pending: {draining}" in gq.gpuq("show", str(job)).stdout
        assert json.loads(gq.gpuq("triage", "--json", str(job)).stdout)["waiting_for"].startswith(draining)
    (gq.work / "go").write_text("")
    assert worker.wait(20) == 0


def test_wait_returns_when_the_jobs_end_with_the_right_exit_code(gq: Env) -> None:
    gq.script("ok.py", "import time\ntime.sleep(0.5)\n")
    gq.script("bad.py", "raise SystemExit(4)\n")
    ok = gq.add("ok.py")
    gq.start_worker("--watch")
    wait_for(lambda: "worker: running" in gq.gpuq("status").stdout, 15, what="the worker")  # else: nothing will run
    started = time.monotonic()
    assert gq.gpuq("wait", str(ok)).returncode == 0
    assert gq.state_of(ok) == "done" and time.monotonic() - started < 30
    bad = gq.add("bad.py")
    after = gq.add("--after", str(bad), "ok.py")
    proc = gq.gpuq("wait", str(bad), str(after), check=False)
    assert proc.returncode == 1
    assert (
        f"#{bad} failed: exit 4" in proc.stdout and f"#{after} pending: blocked: after #{bad} (failed)" in proc.stdout
    )
    gq.gpuq("cancel", str(after))
    last = gq.add("ok.py")
    assert gq.gpuq("wait").returncode == 0  # default: what is queued now (only #last; the others ended)
    assert gq.state_of(last) == "done"


def test_wait_tells_a_job_that_just_failed_by_its_new_copy(tmp_path: Path) -> None:
    """A move writes the new copy before it removes the old one: `gpuq wait` looking in between
    (the supervisor still holds the claim) said `#N failed: failed`, read from the running copy,
    where the failed one says `exit 4` (seen on a loaded machine in the test above)."""
    from gpuq.core.states import FAILED, RUNNING
    from gpuq.engine.lifecycle import actions

    spool, [(ref, job)] = spool_with_true_jobs(tmp_path)
    claim = spool.claims.claim(ref.id)  # the supervisor's, held through the move
    assert claim is not None
    try:
        ref, job = spool.jobs.move(ref, job, RUNNING, {})
        spool.jobs.move(ref, job, FAILED, {"exit_code": 4}, keep_old=True)  # its running copy not yet removed
        assert spool.jobs.find(ref.id, (RUNNING,)) is not None
        waited = actions.wait_for(spool, [ref.id], timeout=5)
    finally:
        claim.release()
    assert waited.ends == {ref.id: (FAILED, "exit 4")}


OOM = """import sys
print("Epoch 3:  45%|####5     | 450/1000 [12:03<14:40, 0.62it/s]", flush=True)
sys.stderr.write('''Traceback (most recent call last):
  File "train.py", line 88, in <module>
    trainer.train()
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1518, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15\
 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use.
''')
sys.exit(1)
"""
NCCL = """import sys
sys.stderr.write('''[rank1]:[E1202 10:41:07.123456 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught\
 collective operation timeout: WorkNCCL(SeqNum=1204, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576,\
 Timeout(ms)=600000) ran for 600012 milliseconds before timing out.
''')
sys.exit(1)
"""
PLAIN = "raise ValueError('bad learning rate: -1')\n"
KILLED = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"


def test_failure_reasons_from_real_looking_logs_and_exit_137(gq: Env) -> None:
    expected = {
        "oom.py": (OOM, "CUDA out of memory (tried to allocate 2.00 GiB)"),
        "nccl.py": (NCCL, "NCCL error: ALLREDUCE timed out after 10m00s (collective watchdog)"),
        "plain.py": (PLAIN, "ValueError: bad learning rate: -1"),
        "killed.py": (KILLED, "killed by SIGKILL (likely the kernel's OOM killer"),
    }
    ids = {}
    for name, (body, _reason) in expected.items():
        gq.script(name, body)
        ids[name] = gq.add(name)
    gq.gpuq("run")
    rows = {r["id"]: r for r in gq.status_json()}
    for name, (_body, reason) in expected.items():
        assert rows[ids[name]]["state"] == "failed" and rows[ids[name]]["reason"].startswith(reason), name
    assert rows[ids["killed.py"]]["exit_code"] == 137
    table = gq.gpuq("status").stdout
    assert "CUDA out of memory (tried to allocate 2.00 GiB)" in table


def git(repo: Path, *args: str) -> str:
    env = dict(
        os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"
    )
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(gq: Env) -> Path:
    if not shutil.which("git"):
        pytest.skip("git is not installed")
    path = gq.work / "exp"
    path.mkdir()
    git(path, "init", "-q")
    (path / "train.py").write_text("import model\nprint('model', model.VERSION)\n")
    (path / "model.py").write_text("VERSION = 1\n")
    git(path, "add", ".")
    git(path, "commit", "-qm", "v1")
    return path


def test_a_job_records_its_commit_and_a_change_before_it_starts_is_reported(gq: Env, repo: Path) -> None:
    job_id = gq.add("-d", str(repo), "train.py")
    code = gq.job(job_id)["code"]
    assert code["commit"] == git(repo, "rev-parse", "HEAD").strip() and code["dirty"] is False
    (repo / "model.py").write_text("VERSION = 2\n")  # edited while the job waits
    gq.gpuq("run")
    job = gq.wait_state(job_id, "done")
    assert job.get("code_changed") == "code changed since it was queued: uncommitted changes made since"
    at_start = job["code_at_start"]
    assert at_start["commit"] == code["commit"] and at_start["dirty"] is True and at_start["diff_hash"]
    assert "model 2" in gq.log(job_id)
    assert "code changed since it was queued" in gq.gpuq("status").stdout


def test_a_snapshot_job_runs_the_code_it_was_queued_with(gq: Env, repo: Path) -> None:
    (repo / "data.txt").write_text("untracked data\n")
    (repo / "train.py").write_text(
        "import model\nprint('model', model.VERSION, open('data.txt').read().strip())\n"
        "open('out.txt', 'w').write('x')\n"
    )
    job_id = gq.add("-d", str(repo), "--snapshot", "train.py")
    snap = gq.job(job_id)["snapshot"]
    assert Path(snap["path"]).is_dir() and snap["files"] == 2
    (repo / "model.py").write_text("VERSION = 2\n")  # edited after add
    gq.gpuq("run")
    gq.wait_state(job_id, "done")
    assert "model 1 untracked data" in gq.log(job_id)  # the queued code, its own data
    assert (repo / "out.txt").exists()  # outputs land in its directory, not in the copy
    assert gq.job(job_id).get("code_changed") is None
    gq.gpuq("clear")
    assert not Path(snap["path"]).exists()  # the copy goes with the job


def test_a_partial_snapshot_of_a_dead_add_is_removed_a_live_ones_kept(gq: Env) -> None:
    """An `add --snapshot` killed mid-copy leaves `.NNNNNN.tmp-PID-...`: the worker's repair and
    `clear` remove it once that pid is dead, never while its writer lives."""
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()  # reaped: its pid is dead
    snaps = gq.home / "snapshots"
    snaps.mkdir(parents=True, exist_ok=True)
    dead = snaps / f".000003.tmp-{exited.pid}-0a1b2c3d"
    live = snaps / f".000004.tmp-{os.getpid()}-0a1b2c3d"  # this process: copying still
    for partial in (dead, live):
        (partial / "pkg").mkdir(parents=True)
        (partial / "pkg" / "train.py").write_text("print(1)\n")
    old = time.time() - 3600  # a live copy untouched for an hour (its add Ctrl-Z'd, or deep in one folder)
    os.utime(live, (old, old))
    gq.script("t.py", "")
    gq.wait_state(gq.add("t.py"), "pending")
    gq.gpuq("run")
    assert not dead.exists() and live.exists()
    dead.mkdir()
    gq.gpuq("clear")
    assert not dead.exists() and (live / "pkg" / "train.py").exists()


def test_bad_safeguard_options_are_one_line(gq: Env) -> None:
    gq.script("t.py", "")
    for args in (("--time", "soon"), ("--time", "0"), ("--begin", "tomorrowish"), ("--snapshot",)):
        proc = gq.gpuq("add", *args, "t.py", check=False)
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, (args, proc.stderr)
    assert gq.files("pending") == []
    assert json.loads(gq.gpuq("status", "--json").stdout) == []
