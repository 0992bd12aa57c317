"""`gpuq adopt`: real processes started outside gpuq become running jobs; refusals are one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import WAIT_FOR_GO, wait_for
from test_gpu_worker import Gpus, fake_gpus, seen
from test_gpu_worker import add as add_gpu_job
from test_turns import _policy, needs_root

from gpuq.run.launcher import Launcher
from gpuq.run.worker import Worker
from gpuq.spool import Spool
from gpuq.system import policy
from gpuq.system.leases import LeaseDir

# Runs until the file named in argv[2] appears (the test sets its pace), printing progress.
OUTSIDE = """
import os, sys, time
print("argv:", sys.argv[1:], flush=True)
step = 0
while not os.path.exists(sys.argv[2]):
    step = min(step + 1, 99)
    print(f"Step {step}/100", flush=True)
    time.sleep(0.1)
"""


def row_of(gq, job_id: int) -> dict:
    return next(r for r in gq.status_json() if r["id"] == job_id)


def wait_state(gq, job_id: int, state: str, timeout: float = 20) -> dict:
    found = {}

    def check():
        found["row"] = row_of(gq, job_id)
        return found["row"]["state"] == state

    wait_for(check, timeout, interval=0.1, what=f"job {job_id} to be {state}")
    return found["row"]


@pytest.fixture
def outside(gq):
    """Start processes the way a user does by hand: not through gpuq; all killed at the end."""
    procs: list[subprocess.Popen] = []

    def start(*args: str, cwd=None, log=None, **kw) -> subprocess.Popen:
        out = open(log, "wb") if log else subprocess.DEVNULL
        proc = subprocess.Popen([sys.executable, *args], cwd=cwd or gq.work, stdout=out, stderr=out, **kw)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_adopt_a_real_process_and_a_job_after_it(gq, outside) -> None:
    Gpus(gq, {"gpus": []})  # a machine without GPUs: the adopted job takes the whole of it
    project = gq.work / "my project"
    project.mkdir()
    script = gq.script("train.py", OUTSIDE, where=project)
    release = gq.work / "release"
    log = project / "train.log"
    proc = outside(str(script), "lr 0.1 with spaces", str(release), cwd=project, log=log)
    wait_for(lambda: "Step 3/100" in log.read_text(), 10, what="the process to make progress")
    before_adopt = time.time()

    out = gq.gpuq("adopt", str(proc.pid), "--name", "by hand", "--log", str(log)).stdout
    assert "adopted" in out
    job_id = int(out.split("#")[1].split(":")[0])
    job = json.loads(gq.gpuq("show", "--json", str(job_id)).stdout)
    assert job["state"] == "running" and job["adopted"] is True
    assert job["cmd"] == [sys.executable, str(script), "lr 0.1 with spaces", str(release)]
    assert job["cwd"] == str(project)
    assert job["pid"] == proc.pid and job["slot"] is None and job["log"] == str(log)
    import psutil

    from gpuq.core.times import parse_iso

    assert parse_iso(job["started_at"]) == pytest.approx(psutil.Process(proc.pid).create_time(), abs=0.01)
    assert parse_iso(job["started_at"]) < before_adopt - 0.2  # its real start, not the adoption

    # progress from the log it writes, shown by status
    row = wait_for(lambda: (r := row_of(gq, job_id))["progress"] and r, 10, what="progress of the adopted job")
    assert row["progress_source"] == "log"

    after = gq.add("--after", str(job_id), "-q", sys.executable, "-c", "print('eval ran')")
    other = gq.add(sys.executable, "-c", "print('other ran')")
    # While the adopted process runs, nothing starts: it occupies the worker's slot(s).
    spool = Spool(gq.home)
    step = Worker(spool, Launcher(spool), say=lambda _text: None).step()
    assert step.started == [] and step.busy
    assert row_of(gq, after)["state"] == "pending" and row_of(gq, other)["state"] == "pending"

    gq.start_worker("--watch")
    release.touch()
    proc.wait(10)
    ended = wait_state(gq, job_id, "done")
    assert ended["exit_code"] is None and "exit code cannot be known" in ended["note"]
    wait_state(gq, after, "done")
    wait_state(gq, other, "done")
    assert "eval ran" in gq.log(after)


def test_show_of_an_adopted_job_gives_no_time_in_the_queue(gq, outside) -> None:
    """It started before it was queued: `show` gives its start without a wait in the queue (it said
    `(after  in the queue)`, a negative wait written as an empty duration)."""
    script = gq.script("train.py", OUTSIDE)
    log = gq.work / "train.log"
    proc = outside(str(script), "by hand", str(gq.work / "release"), log=log)
    wait_for(lambda: "Step 2/100" in log.read_text(), 10, what="the process to make progress")
    out = gq.gpuq("adopt", str(proc.pid), "--log", str(log)).stdout
    job_id = int(out.split("#")[1].split(":")[0])
    shown = gq.gpuq("show", str(job_id)).stdout.splitlines()
    (started,) = [line for line in shown if line.split()[:1] == ["started"]]
    assert "in the queue" not in started, started


def test_adopt_refusals(gq, outside) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    res = gq.gpuq("adopt", str(gone.pid), check=False)
    assert res.returncode == 1 and "no such process" in res.stderr and res.stderr.count("\n") == 1

    res = gq.gpuq("adopt", "not-a-pid", check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr

    release = gq.work / "release"
    proc = outside("-c", OUTSIDE, "x", str(release))
    res = gq.gpuq("adopt", str(proc.pid), "--log", str(gq.work / "missing.log"), check=False)
    assert res.returncode == 1 and "no such file" in res.stderr

    gq.gpuq("adopt", str(proc.pid))
    res = gq.gpuq("adopt", str(proc.pid), check=False)
    assert res.returncode == 1 and "already tracked by gpuq: it is job #1" in res.stderr
    assert len(gq.files("running")) == 1


def test_adopt_refuses_another_users_process(gq, outside) -> None:
    other = None
    if os.geteuid() == 0:  # as root: a process that really runs as another user (nobody)
        other = subprocess.Popen(["sleep", "60"], cwd="/", user=65534, group=65534, extra_groups=[])
        pid = other.pid
    else:
        pid = 1  # init belongs to root
    try:
        res = gq.gpuq("adopt", str(pid), check=False)
    finally:
        if other is not None:
            other.kill()
            other.wait()
    assert res.returncode == 1
    assert "another user" in res.stderr or "cannot be read" in res.stderr
    assert gq.files("running") == []


def test_adopting_a_gpuq_job_or_its_supervisor_is_refused(gq) -> None:
    gq.script("long.py", "import time\ntime.sleep(60)\n")
    job_id = gq.add("long.py")
    gq.start_worker()
    job = wait_for(lambda: (j := gq.job(job_id)).get("pid") and j, 15, what="the job's pid")
    for pid, why in ((job["pid"], f"it is job #{job_id}"), (job["supervisor"]["pid"], "supervisor of job")):
        res = gq.gpuq("adopt", str(pid), check=False)
        assert res.returncode == 1 and why in res.stderr, res.stderr
    assert len(gq.files("running")) == 1


def test_adopting_the_worker_is_refused(gq) -> None:
    """`gpuq adopt` of the worker's pid made it a job, and `gpuq kill` of that job killed the worker."""
    worker = gq.start_worker("--watch")
    wait_for(lambda: list((gq.home / "workers").glob(f"worker-{worker.pid}.json")), 15, what="the worker's file")
    res = gq.gpuq("adopt", str(worker.pid), check=False)
    assert (res.returncode, res.stdout) == (1, "") and res.stderr.count("\n") == 1, res.stderr
    assert f"process {worker.pid} is already tracked by gpuq: it is gpuq's worker" in res.stderr
    assert gq.files("running") == [] and worker.poll() is None


def test_concurrent_adopts_of_one_process_make_one_job(gq, outside) -> None:
    proc = outside("-c", "import time; time.sleep(60)")
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: gq.gpuq("adopt", str(proc.pid), check=False), range(6)))
    assert sorted(r.returncode for r in results) == [0, 1, 1, 1, 1, 1]
    assert len(gq.files("running")) == 1


def test_adopted_process_that_ends_goes_to_done_with_unknown_exit(gq, outside) -> None:
    # It ends when told, once adopted: `gpuq adopt` may take a while on a loaded machine.
    code = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.02)\nsys.exit(3)\n"
    proc = outside("-c", code, str(gq.work / "end"))
    job_id = int(gq.gpuq("adopt", str(proc.pid)).stdout.split("#")[1].split(":")[0])
    assert row_of(gq, job_id)["state"] == "running"
    (gq.work / "end").touch()
    proc.wait(10)  # reaped by its real parent (us): gpuq never sees the 3
    row = wait_state(gq, job_id, "done")
    assert row["exit_code"] is None and "cannot be known" in row["note"]


# Writes checkpoint-30 of 100 (HF style, trainer_state.json last) 0.6 s after it starts, then no
# other until its release file appears: a training between two of its checkpoints.
CHECKPOINTED = """
import json, os, sys, time
time.sleep(0.6)
os.makedirs("out/checkpoint-30")
with open("out/checkpoint-30/trainer_state.json", "w") as fh:
    json.dump({"global_step": 30, "max_steps": 100}, fh)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def test_an_adopted_training_whose_checkpoint_does_not_move_counts_from_its_real_start(gq, outside) -> None:
    proc = outside("-c", CHECKPOINTED, str(gq.work / "release"), "--output_dir", "out")
    state = gq.work / "out" / "checkpoint-30" / "trainer_state.json"
    wait_for(state.exists, 10, what="the checkpoint")
    out = gq.gpuq("adopt", str(proc.pid)).stdout
    job_id = int(out.split("#")[1].split(":")[0])
    started = json.loads(gq.gpuq("show", "--json", str(job_id)).stdout)["started_at"]
    from gpuq.core.times import parse_iso

    born = parse_iso(started)
    wait_for(lambda: time.time() - born > 2.5, 10, what="the process to be 2.5 s old")  # its checkpoint, long ago
    before = time.time()
    row = row_of(gq, job_id)
    after = time.time()
    assert row["progress"] == 0.3 and row["progress_source"] == "checkpoint"
    assert "elapsed x remaining / done (one sample so far)" in row["eta_method"], row
    # 30 steps in the time since it started (not in the 0.6 s until the checkpoint), 70 left
    low, high = 70 / 30 * (before - born) - (after - before), 70 / 30 * (after - born)
    assert low - 0.1 <= row["eta_seconds"] <= high + 0.1, (row, low, high)
    (gq.work / "release").touch()


# Writes checkpoint-30 of 100 as soon as it starts (a training that resumed on its own, or saves
# early), then no other until its release file appears.
CHECKPOINTED_AT_ONCE = CHECKPOINTED.replace("time.sleep(0.6)\n", "")


def test_an_adopted_training_gets_an_eta_at_once_though_its_checkpoint_came_at_its_start(gq, outside) -> None:
    """Its only checkpoint was written in its first instant and does not move: 30 steps in all
    the time since the process's real start is still a rate, from the first look on."""
    proc = outside("-c", CHECKPOINTED_AT_ONCE, str(gq.work / "release"), "--output_dir", "out")
    wait_for((gq.work / "out" / "checkpoint-30" / "trainer_state.json").exists, 10, what="the checkpoint")
    job_id = int(gq.gpuq("adopt", str(proc.pid)).stdout.split("#")[1].split(":")[0])
    from gpuq.core.times import parse_iso

    born = parse_iso(json.loads(gq.gpuq("show", "--json", str(job_id)).stdout)["started_at"])
    wait_for(lambda: time.time() - born > 2, 10, what="the process to be 2 s old")
    before = time.time()
    row = row_of(gq, job_id)
    after = time.time()
    assert row["progress"] == 0.3 and row["progress_source"] == "checkpoint"
    assert row["eta_seconds"] is not None, row["eta_method"]
    assert "elapsed x remaining / done (one sample so far)" in row["eta_method"], row
    # 70 steps left at the pace of 30 in the process's whole life, as it was during the look
    low, high = 70 / 30 * (before - born) - (after - before), 70 / 30 * (after - born)
    assert low - 0.1 <= row["eta_seconds"] <= high + 0.1, (row, low, high)
    again = row_of(gq, job_id)  # a second look at the same checkpoint: still the first-look rate
    assert again["eta_seconds"] is not None and "elapsed x remaining / done" in again["eta_method"], again
    (gq.work / "release").touch()


def by_hand(outside, gq, visible=None, **kw) -> subprocess.Popen:
    """A process started by hand, with `visible` as its CUDA_VISIBLE_DEVICES (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})
    return outside("-c", WAIT_FOR_RELEASE, str(gq.work / "release"), env=env, **kw)


WAIT_FOR_RELEASE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"


def test_an_adopted_process_holds_the_gpus_its_cuda_visible_devices_names(gq, outside) -> None:
    """Before it holds any GPU memory (still loading its data): GPU 1 is its, GPU 0 is free."""
    Gpus(gq, fake_gpus(2))
    proc = by_hand(outside, gq, "1")
    out = gq.gpuq("adopt", str(proc.pid), "--name", "by hand").stdout
    adopted = int(out.split("#")[1].split(":")[0])
    first, second = add_gpu_job(gq), add_gpu_job(gq)
    gq.start_worker()
    assert seen(gq, first)["CUDA_VISIBLE_DEVICES"] == "0"
    wait_for(lambda: f"job #{adopted}" in (row_of(gq, second)["waiting"] or ""), 10, what="the job to wait for it")
    assert row_of(gq, second)["state"] == "pending"
    assert "holds GPU 1 (its CUDA_VISIBLE_DEVICES=1): no job of this queue starts there while it runs" in out, out
    job = json.loads(gq.gpuq("show", "--json", str(adopted)).stdout)
    assert (job["gpus"], job["slot"]) == ([1], "1")


def test_gpus_lists_no_adopted_job_whose_process_has_ended(gq, outside) -> None:
    """With no worker to record their end, `gpuq gpus` went on listing adopted jobs on their GPU
    ("jobs #1 #2") after their processes had ended."""
    Gpus(gq, fake_gpus(1))
    proc = by_hand(outside, gq, "0")
    adopted = int(gq.gpuq("adopt", str(proc.pid)).stdout.split("#")[1].split(":")[0])
    assert f"  GPU 0  Fake H100  0.0/79.6 GiB  jobs #{adopted}\n" in gq.gpuq("gpus").stdout
    (gq.work / "release").touch()
    proc.wait(10)
    assert list((gq.home / "running").iterdir()), "nothing recorded its end: it is in running/ still"
    assert "jobs #" not in gq.gpuq("gpus").stdout
    assert [gpu["jobs"] for gpu in json.loads(gq.gpuq("gpus", "--json").stdout)] == [[]]


def test_an_adopted_process_without_cuda_visible_devices_holds_every_gpu(gq, outside) -> None:
    gpus = Gpus(gq, fake_gpus(2))
    proc = by_hand(outside, gq)
    out = gq.gpuq("adopt", str(proc.pid), "--name", "by hand").stdout
    adopted = int(out.split("#")[1].split(":")[0])
    waiting = add_gpu_job(gq)
    gq.start_worker()
    wait_for(lambda: f"job #{adopted}" in (row_of(gq, waiting)["waiting"] or ""), 10, what="the job to wait for it")
    assert "holds GPU 0,1 (every GPU: its CUDA_VISIBLE_DEVICES is not set)" in out, out
    eta_text = gq.gpuq("eta", str(waiting)).stdout
    assert f"start unknown (#{adopted} by hand, adopted, has no ETA)" in eta_text, eta_text
    # the GPU it holds memory on counts too, beside the one its CUDA_VISIBLE_DEVICES names
    held = by_hand(outside, gq, "0")
    gpus.set(fake_gpus(2, foreign={1: (held.pid, 500)}))
    out = gq.gpuq("adopt", str(held.pid)).stdout
    assert "holds GPU 0,1 (its CUDA_VISIBLE_DEVICES=0; it holds memory on GPU 1)" in out, out
    # one that sees no GPU holds none
    out = gq.gpuq("adopt", str(by_hand(outside, gq, "").pid)).stdout
    assert "holds no GPU (its CUDA_VISIBLE_DEVICES is empty): other jobs start beside it" in out, out
    assert row_of(gq, waiting)["state"] == "pending"


def test_an_adopted_job_is_not_gpuqs_to_preempt_and_has_no_supervisor(gq, outside) -> None:
    """With only an adopted job running, `add --urgent` said "nothing running that it could
    preempt": it says the adopted job is not gpuq's to preempt. `gpuq stop` said every running job's
    supervisor records how it ends: an adopted job has none, and it says how that one is recorded."""
    Gpus(gq, fake_gpus(1))
    proc = by_hand(outside, gq, "0")
    out = gq.gpuq("adopt", str(proc.pid), "--name", "by hand").stdout
    adopted = int(out.split("#")[1].split(":")[0])
    gq.start_worker("--watch")
    urgent = gq.gpuq("add", "--urgent", "--", "true").stdout
    said = f"(nothing running that it could preempt: #{adopted} by hand is adopted, not gpuq's to preempt)"
    assert said in urgent, urgent
    gq.gpuq("cancel", urgent.split("#", 1)[1].split(":", 1)[0])
    gq.script("wait.py", WAIT_FOR_GO)
    beside = gq.add("--gpus", "0", "wait.py")  # a CPU job of gpuq's, beside it
    wait_state(gq, beside, "running")
    stopped = gq.gpuq("stop").stdout
    assert (
        f"jobs keep running: #{beside} work/wait (their supervisors record how they end); "
        f"#{adopted} by hand (adopted, no supervisor: recorded done once its process is gone)."
    ) in stopped, stopped
    gq.workers[0].wait(timeout=30)  # the worker's own last line words the adopted job as `stop` does
    last = (gq.work / "worker-0.out").read_text()
    assert f"still running under their supervisors: #{beside} work/wait (pid " in last, last
    assert f"; #{adopted} by hand (pid {proc.pid}, adopted, no supervisor: recorded done once its" in last, last
    (gq.work / "go").touch()
    (gq.work / "release").touch()
    assert wait_state(gq, adopted, "done")["exit_code"] is None


def test_an_urgent_job_behind_an_adopted_one_is_told_no_urgent_job_preempts_it(gq, outside) -> None:
    """An `--urgent=force` job behind an adopted one was told `--urgent=force` would take one anyway
    (it was force already, and none ever takes an adopted job); `show` said `flags urgent`."""
    Gpus(gq, {"gpus": []})  # a machine without GPUs: the adopted job takes the whole of it
    proc = outside("-c", "import time; time.sleep(120)")
    adopted = int(gq.gpuq("adopt", str(proc.pid)).stdout.split("#")[1].split(":")[0])
    forced = gq.add("--urgent=force", "true")
    urgent = gq.add("--urgent", "true")
    gq.start_worker("--watch")
    said = f"urgent, but #{adopted} is adopted (started outside gpuq): never preempted"
    wait_for(lambda: gq.gpuq("status").stdout.count(said) == 2, 20, what="the urgent jobs' reason")
    shown = gq.gpuq("show", str(forced)).stdout
    assert f"pending: {said}" in shown and "takes one anyway" not in shown
    assert [line.split()[1:] for line in shown.splitlines() if line.split()[:1] == ["flags"]] == [["urgent=force"]]
    assert "flags      urgent\n" in gq.gpuq("show", str(urgent)).stdout


def test_the_worker_says_an_adopted_job_ended_not_that_it_lost_its_supervisor(gq, outside) -> None:
    """The worker's log said `job #1 had lost its process and supervisor: now done` when an adopted
    job ended as it should: an adopted job never has a supervisor."""
    code = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.02)\n"
    proc = outside("-c", code, str(gq.work / "end"))
    job_id = int(gq.gpuq("adopt", str(proc.pid)).stdout.split("#")[1].split(":")[0])
    gq.start_worker("--watch")
    wait_for(lambda: "worker" in gq.worker_output(), 15, what="the worker to start")
    (gq.work / "end").touch()
    proc.wait(10)
    said = f"adopted job #{job_id} ended: now done"
    wait_for(lambda: said in gq.worker_output(), 20, interval=0.1, what="the worker to say the adopted job ended")
    assert "lost its process and supervisor" not in gq.worker_output()


def test_an_adopted_process_leases_its_gpu_until_it_ends(gq, outside, own_lease_dir) -> None:
    """An adopted job took no lease: another party that decides by leases (another user's gpuq,
    another queue, `gpuq lease`) saw only the 30 GiB it held and started a 40 GiB share beside it on
    the GPU it holds whole. Its GPU is leased now, by a keeper that ends the lease with the process."""
    gpus = Gpus(gq, fake_gpus(1))
    proc = by_hand(outside, gq, "0")
    gpus.set(fake_gpus(1, foreign={0: (proc.pid, 30 * 1024)}))
    adopted = int(gq.gpuq("adopt", str(proc.pid), "--name", "by hand").stdout.split("#")[1].split(":")[0])
    share = gq.gpuq("lease", "--no-wait", "--gpu-mem", "40G", "--", "true", check=False)
    assert share.returncode == 75, share.stdout + share.stderr
    assert f"leased whole by your job #{adopted} since " in share.stderr, share.stderr  # this GPUQ_HOME's job
    other_home = dict(gq.env, GPUQ_HOME=str(gq.home) + "-b")
    elsewhere = gq.gpuq("lease", "--no-wait", "--", "true", env=other_home, check=False)
    assert f"leased whole by your job #{adopted} in another queue since " in elsewhere.stderr, elsewhere.stderr
    [lease] = LeaseDir.open(own_lease_dir).live()
    assert (lease.job, lease.pid, lease.spool, lease.whole) == (adopted, proc.pid, Spool(gq.home).lease_id.read(), True)
    # Its file's name carries the pid of the keeper that holds its lock (lease_layout.md section 2),
    # not the `gpuq adopt` that has exited: that pid, reused by a second adopt, wrote the same name
    # over this lease, and this keeper's release then removed the other's live lease.
    holder = int(lease.file.split(".")[-3])  # gpuq-lease.<UUID>.<uid>.<pid>.<n>.lease
    assert str(own_lease_dir / lease.file) in files_open_by(holder), f"pid {holder} holds no lease"
    (gq.work / "release").touch()
    proc.wait(10)
    wait_for(lambda: LeaseDir.open(own_lease_dir).live() == [], 10, what="the lease to end with the process")
    assert (own_lease_dir / f"gpuq-usage.{os.geteuid()}").exists(), "its GPU time counts as the user's"
    gq.gpuq("lease", "--no-wait", "--gpu-mem", "40G", "--", "true")


def files_open_by(pid: int) -> set[str]:
    """The files a live process has open (none for a pid that no longer runs)."""
    try:
        return {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except FileNotFoundError:
        return set()


@needs_root  # the policy file must be root's
def test_an_adopted_process_leases_only_the_gpus_it_is_known_to_use_within_the_cap(
    gq, outside, own_lease_dir, tmp_path, monkeypatch
) -> None:
    """A process without CUDA_VISIBLE_DEVICES (a CPU-only script adopted so that jobs can wait for
    it) leased every GPU whole, past its user's cap of 1: every other user's and queue's gpuq waited.
    It leases the GPUs it is known to use (named, or holding its memory), as many as the cap allows."""
    gpus = Gpus(gq, fake_gpus(2))
    gq.env[policy.POLICY_ENV] = str(_policy(tmp_path, monkeypatch, "[default]\nmax_gpus = 1\n"))
    another_queue = dict(gq.env, GPUQ_HOME=str(tmp_path / "another"))
    out = gq.gpuq("adopt", str(by_hand(outside, gq).pid)).stdout
    assert "holds GPU 0,1 (every GPU: its CUDA_VISIBLE_DEVICES is not set)" in out, out
    assert "leases no GPU: none is named by its CUDA_VISIBLE_DEVICES or holds its memory" in out, out
    assert LeaseDir.open(own_lease_dir).live() == []
    gq.gpuq("lease", "--no-wait", "--gpus", "1", "--", "true", env=another_queue)
    # one without CUDA_VISIBLE_DEVICES that holds memory on GPU 1 leases that one
    holding = by_hand(outside, gq)
    gpus.set(fake_gpus(2, foreign={1: (holding.pid, 500)}))
    out = gq.gpuq("adopt", str(holding.pid)).stdout
    assert "    leases GPU 1 until it ends\n" in out, out
    assert [(lease.gpu_index, lease.pid) for lease in LeaseDir.open(own_lease_dir).live()] == [(1, holding.pid)]
    holding.kill()
    wait_for(lambda: LeaseDir.open(own_lease_dir).live() == [], 10, what="the lease to end with the process")
    # one that names both GPUs leases one: the cap; the adoption itself stands
    both = by_hand(outside, gq, "0,1")
    out = gq.gpuq("adopt", str(both.pid)).stdout
    assert "leases GPU 0 until it ends; not GPU 1: your limit of 1 GPU at once on this machine" in out, out
    assert [(lease.gpu_index, lease.pid) for lease in LeaseDir.open(own_lease_dir).live()] == [(0, both.pid)]
    taken = gq.gpuq("lease", "--no-wait", "--gpus", "1", "--", "true", env=another_queue, check=False)
    assert taken.returncode == 75 and "your limit of 1 GPU" in taken.stderr, taken.stderr
