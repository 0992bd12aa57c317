"""gpuq's Slurm client and batch script against a real single-node Slurm (tests/slurm_cluster.py).

Tests that take the `slurm` fixture skip where no cluster can be started (binaries missing, not
root); the pure ones (options, parsers, checkpoint choice, environment) run everywhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest
from conftest import REPO, wait_for

from gpuq.core.job import Job
from gpuq.core.times import iso_of
from gpuq.run.slurm_batch import (
    batch_script,
    launch_environment,
    launch_plan,
    sbatch_options,
    slurm_job_name,
)
from gpuq.system import slurm as client
from gpuq.system.slurm import SlurmError, SlurmJob

TRAINER = REPO / "tests" / "fake_trainer.py"
STAMP = 'python3 -c "import time; print(\\"{0}\\", repr(time.time()), flush=True)"'


# ---- helpers ---------------------------------------------------------------------------------------
def make_job(tmp: Path, job_id: int, cmd: list[str], **fields: Any) -> dict[str, Any]:
    """A gpuq job dict as the spool holds it (the fields the hand-over reads)."""
    (tmp / "logs").mkdir(exist_ok=True)
    job = {
        "id": job_id,
        "name": f"t/job{job_id}",
        "cmd": cmd,
        "cwd": str(tmp),
        "env": {},
        "shell_env": None,
        "venv": None,
        "umask": None,
        "after": [],
        "after_any": [],
        "gpu_request": 0,
        "log": str(tmp / "logs" / f"{job_id:06d}.log"),
    }
    job.update(fields)
    return Job(job)


def hand_over(
    slurm: Any, jobs: list[dict[str, Any]], extra: Optional[list[str]] = None, grace: int = 30, spool_id: str = "t"
) -> dict[int, int]:
    """Submit `jobs` in order, as `gpuq slurm submit` will: gpuq id -> Slurm id."""
    ids: dict[int, int] = {}
    for job in jobs:
        script = batch_script(job, python=sys.executable, package_parent=str(REPO), log_path=job["log"])
        options = sbatch_options(
            job, spool_id=spool_id, slurm_ids=ids, extra=extra or [], grace_seconds=grace, gres=slurm.gpus > 0
        )
        ids[job["id"]] = client.submit(script, options, env=slurm.env)
    return ids


def final(slurm: Any, slurm_id: int, timeout: float = 20) -> SlurmJob:
    def ended() -> Optional[SlurmJob]:
        job = client.query([slurm_id], env=slurm.env).get(slurm_id)
        return job if job is not None and job.finished else None

    return wait_for(ended, timeout, interval=0.2, what=f"Slurm job {slurm_id} to end")


def state(slurm: Any, slurm_id: int) -> Optional[SlurmJob]:
    return client.query([slurm_id], env=slurm.env).get(slurm_id)


def log(job: dict[str, Any]) -> str:
    path = Path(job["log"])
    return path.read_text() if path.exists() else ""


def stamps(job: dict[str, Any]) -> dict[str, float]:
    """`begin 1796...`/`end 1796...` lines a payload printed."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(begin|end) ([0-9.]+)$", log(job), re.M)}


def scontrol(slurm: Any, *args: str) -> None:
    subprocess.run(["scontrol", *args], env=slurm.env, check=True, capture_output=True, timeout=30)


def bash(script: str) -> list[str]:
    return ["bash", "-c", script]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- against the cluster -----------------------------------------------------------------------------
def test_chain_of_three_runs_in_order(slurm: Any, tmp_path: Path) -> None:
    body = f"{STAMP.format('begin')}; sleep 0.5; {STAMP.format('end')}"
    first = make_job(tmp_path, 1, bash(body))
    second = make_job(tmp_path, 2, bash(body), after=[1])
    third = make_job(tmp_path, 3, bash(body), after=[2])
    ids = hand_over(slurm, [first, second, third])
    ended = {gpuq_id: final(slurm, sid, timeout=30) for gpuq_id, sid in ids.items()}
    assert [(j.state, j.exit_code) for j in ended.values()] == [("COMPLETED", 0)] * 3
    times = [stamps(job) for job in (first, second, third)]
    assert times[0]["end"] <= times[1]["begin"] and times[1]["end"] <= times[2]["begin"], times
    assert "=== gpuq: job #2 t/job2 (slurm job" in log(second)


def test_environment_venv_umask_and_gpus_as_locally(slurm: Any, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    tool = venv / "bin" / "which-venv"
    tool.write_text("#!/bin/sh\necho from-venv\n")
    tool.chmod(0o755)
    probe = (
        "which-venv; echo VIRTUAL_ENV=$VIRTUAL_ENV; echo FROM_SHELL=$FROM_SHELL; echo JOB_VAR=$JOB_VAR; "
        "echo GPUQ_JOB_ID=$GPUQ_JOB_ID GPUQ_SLURM=$GPUQ_SLURM; echo CVD=${CUDA_VISIBLE_DEVICES-unset}; "
        "echo PWD=$(pwd); echo SLURM_JOB_ID=$SLURM_JOB_ID; touch made; stat -c MODE=%a made"
    )
    shell_env = {"PATH": "/usr/bin:/bin", "FROM_SHELL": "shell", "CUDA_VISIBLE_DEVICES": "7", "HOME": "/root"}
    gpus = 2 if slurm.gpus >= 2 else 0
    job = make_job(tmp_path, 9, bash(probe), venv=str(venv), env={"JOB_VAR": "job"}, shell_env=shell_env, umask=0o027)
    job["gpu_request"] = gpus
    sid = hand_over(slurm, [job])[9]
    assert final(slurm, sid).state == "COMPLETED", log(job)
    text = log(job)
    for line in ("from-venv", f"VIRTUAL_ENV={venv}", "FROM_SHELL=shell", "JOB_VAR=job", "GPUQ_JOB_ID=9 GPUQ_SLURM=1"):
        assert line in text.splitlines(), text
    assert f"PWD={tmp_path}" in text and f"SLURM_JOB_ID={sid}" in text and "MODE=640" in text, text
    # The login node's CUDA_VISIBLE_DEVICES never reaches the job: Slurm's (for --gres) or none.
    assert ("CVD=0,1" if gpus else "CVD=unset") in text.splitlines(), text


def test_failed_job_leaves_its_afterok_dependent_pending_until_cancelled(slurm: Any, tmp_path: Path) -> None:
    failing = make_job(tmp_path, 1, bash("exit 3"))
    dependent = make_job(tmp_path, 2, bash("echo dependent ran"), after=[1])
    cleanup = make_job(tmp_path, 3, bash("echo cleanup ran"), after_any=[1])
    ids = hand_over(slurm, [failing, dependent, cleanup])
    failed = final(slurm, ids[1])
    assert (failed.state, failed.exit_code) == ("FAILED", 3)
    assert final(slurm, ids[3]).state == "COMPLETED" and "cleanup ran" in log(cleanup).splitlines()
    stuck = wait_for(
        lambda: (s := state(slurm, ids[2])) and s.reason == "DependencyNeverSatisfied" and s,
        10,
        what="DependencyNeverSatisfied",
    )
    assert stuck.state == "PENDING"
    assert client.cancel(ids[2], env=slurm.env)
    assert final(slurm, ids[2]).state == "CANCELLED"
    assert log(dependent) == ""  # it never started


def test_cancel_stops_the_payload_and_a_batch_signal_reaches_it_once(slurm: Any, tmp_path: Path) -> None:
    pid_file = tmp_path / "payload.pid"
    sleeper = make_job(tmp_path, 1, bash(f"echo $$ > {pid_file}; exec sleep 300"))
    sid = hand_over(slurm, [sleeper])[1]
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 15, what="the payload to start"))
    assert client.cancel(sid, env=slurm.env) is True
    assert final(slurm, sid).state == "CANCELLED"
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 15, what="the payload to be gone")

    # `cancel(id, "TERM")` signals the batch shell only; its trap forwards TERM to the payload.
    handler = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    polite = make_job(tmp_path, 2, [sys.executable, "-c", handler])
    sid = hand_over(slurm, [polite])[2]
    wait_for(lambda: "ready" in log(polite).splitlines(), 15, what="the payload to be ready")
    assert client.cancel(sid, "TERM", env=slurm.env) is True
    ended = final(slurm, sid)
    assert (ended.state, ended.exit_code) == ("COMPLETED", 0), log(polite)
    assert log(polite).splitlines().count("got TERM") == 1
    assert client.cancel(sid, env=slurm.env) is False  # already ended
    assert client.cancel(999999, env=slurm.env) is False  # Slurm knows no such job
    assert client.cancel(999999, "TERM", env=slurm.env) is False


def test_time_limit_signal_checkpoint_requeue_and_resume(slurm: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    stale = out / "checkpoint-90000"  # an earlier run's, with a higher step than this run reaches
    stale.mkdir(parents=True)
    (stale / "trainer_state.json").write_text('{"global_step": 90000}')
    hour_ago = time.time() - 3600
    for path in (stale / "trainer_state.json", stale):
        os.utime(path, (hour_ago, hour_ago))
    cmd = [sys.executable, str(TRAINER), "--output_dir", str(out), "--max_steps", "100000"]
    cmd += ["--save_steps", "1000000", "--step_time", "0.05", "--save_on_sigterm"]
    job = make_job(tmp_path, 5, cmd)
    sid = hand_over(slurm, [job], extra=["--time=10"], grace=55)[5]
    wait_for(lambda: "Step 1/" in log(job), 15, what="training to start")
    assert "Starting from scratch" in log(job)  # the stale checkpoint was not passed
    # A 1-minute limit: the warning (USR1, 55 s before) comes at slurmctld's next check (<= 30 s).
    scontrol(slurm, "update", f"jobid={sid}", "TimeLimit=1")
    release_requeued(slurm, sid)
    saved = re.search(r"SIGTERM: saved checkpoint at step (\d+)", log(job))
    assert saved, log(job)
    step = int(saved.group(1))
    assert "Slurm time limit near" in log(job) and f"requeueing Slurm job {sid}" in log(job)
    wait_for(lambda: f"Step {step + 3}/" in log(job), 30, what="the resumed run to make progress")
    text = log(job)
    assert f"=== gpuq: slurm restart 1: resumes from {out}/checkpoint-{step}" in text, text
    assert f"Resumed from step {step}" in text and "Resumed from step 90000" not in text
    assert f"--resume_from_checkpoint {out}/checkpoint-{step}" in text
    # A TERM (not the time-limit signal): the job saves and ends; it does not requeue.
    assert client.cancel(sid, "TERM", env=slurm.env)
    ended = final(slurm, sid)
    assert (ended.state, ended.exit_code, ended.restarts) == ("COMPLETED", 0, 1), log(job)


def release_requeued(slurm: Any, sid: int) -> None:
    """Wait until Slurm has requeued `sid`, then let it start again now (with a 10-minute limit)
    instead of after the credential lifetime.

    Why each step (observed with Slurm 22.05 on a loaded 2-core machine): the requeue ends only
    when the job has finished COMPLETING (squeue -O State already says PENDING then), and only
    then does Slurm set its begin time to now + cred_expire + 1 (Reason=BeginTime). A
    `StartTime=now` sent before that is overwritten, and once the begin time passes nothing
    wakes the scheduler: the job waits for its periodic pass (26-29 s after the requeue here).
    Released in the same second as the requeue, the launch fails (the new launch credential
    must be newer than the revoked one; Slurm's times are whole seconds): wait 2 s past it."""
    cred_expire = 10  # AuthInfo=...,cred_expire=10 in tests/slurm_cluster.py

    def requeued() -> Optional[SlurmJob]:
        s = state(slurm, sid)
        return s if s and s.state == "PENDING" and s.reason == "BeginTime" and s.restarts == 1 else None

    held = wait_for(requeued, 60, interval=0.2, what="the job to requeue itself")
    requeued_at = (held.start or time.time()) - cred_expire - 1
    wait_for(lambda: time.time() >= requeued_at + 2, 5, interval=0.1, what="a new second for the launch credential")
    scontrol(slurm, "update", f"jobid={sid}", "StartTime=now", "TimeLimit=10")
    wait_for(
        lambda: (s := state(slurm, sid)) and s.state == "RUNNING" and s.restarts == 1,
        15,
        interval=0.2,
        what="the requeued job to run again",
    )


def test_no_requeue_for_a_job_cancelled_while_it_saves(slurm: Any, tmp_path: Path) -> None:
    # The time-limit warning sent by hand; the payload takes 2 s to save; a user cancels meanwhile.
    slow = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('saving', flush=True), time.sleep(2), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    job = make_job(tmp_path, 1, [sys.executable, "-c", slow])
    sid = hand_over(slurm, [job])[1]
    wait_for(lambda: "ready" in log(job).splitlines(), 15, what="the payload to be ready")
    assert client.cancel(sid, "USR1", env=slurm.env)
    wait_for(lambda: "saving" in log(job).splitlines(), 10, what="the payload to start saving")
    assert client.cancel(sid, env=slurm.env)
    ended = final(slurm, sid)
    assert (ended.state, ended.restarts) == ("CANCELLED", 0), log(job)
    assert "Slurm time limit near" in log(job) and "requeueing Slurm job" not in log(job)


def test_find_by_comment(slurm: Any, tmp_path: Path) -> None:
    spool_id = uuid.uuid4().hex
    waiting = make_job(tmp_path, 42, bash("true"))
    sid = hand_over(slurm, [waiting], extra=["--begin=now+3600"], spool_id=spool_id)[42]
    marker = client.comment_marker(spool_id, 42)
    assert marker == f"gpuq:{spool_id}:42"
    assert client.find_by_comment(marker, env=slurm.env) == [(sid, "PENDING")]
    assert client.find_by_comment(client.comment_marker(spool_id, 43), env=slurm.env) == []
    assert client.cancel(sid, env=slurm.env)


def test_sbatch_refusal_missing_and_dead_controller(slurm: Any, tmp_path: Path) -> None:
    script = "#!/bin/bash\ntrue\n"
    with pytest.raises(SlurmError, match=r"^sbatch refused the job: .*[Ii]nvalid partition"):
        client.submit(script, ["--partition=nosuch", "-o", "/dev/null"], env=slurm.env)
    no_slurm = dict(slurm.env, PATH=str(tmp_path))
    with pytest.raises(SlurmError) as missing:
        client.submit(script, [], env=no_slurm)
    assert str(missing.value) == "Slurm's sbatch is not on PATH: run gpuq on the cluster's login node"
    with pytest.raises(SlurmError, match="squeue is not on PATH"):
        client.query([1], env=no_slurm)
    # A controller port with nothing listening; MessageTimeout=2 keeps sbatch's retries short.
    dead = slurm.conf_variant("dead.conf", SlurmctldPort=str(free_port()), MessageTimeout="2")
    dead_env = dict(slurm.env, SLURM_CONF=str(dead))
    with pytest.raises(SlurmError) as down:
        client.submit(script, [], env=dead_env)
    assert str(down.value).startswith(
        "the Slurm controller does not answer (sbatch: error: Batch job submission failed: "
        "Unable to contact slurm controller"
    ), str(down.value)
    with pytest.raises(SlurmError, match="^the Slurm controller does not answer"):
        client.query([1], env=dead_env)
    with pytest.raises(SlurmError, match="^the Slurm controller does not answer"):
        client.cancel(1, env=dead_env)


def test_query_exit_codes_live_and_after_slurm_forgot(slurm: Any, tmp_path: Path) -> None:
    ok = make_job(tmp_path, 1, bash("true"), name="t/ok")
    three = make_job(tmp_path, 2, bash("exit 3"), name="t/three")
    spool_id = uuid.uuid4().hex
    ids = hand_over(slurm, [ok, three], spool_id=spool_id)
    live = {gpuq_id: final(slurm, sid) for gpuq_id, sid in ids.items()}
    assert (live[1].state, live[1].exit_code, live[1].source) == ("COMPLETED", 0, "squeue")
    assert (live[2].state, live[2].exit_code, live[2].source) == ("FAILED", 3, "squeue")
    assert live[2].start is not None and live[2].end is not None and live[2].end >= live[2].start
    # What query falls back to where squeue lacks a field (older Slurm): `scontrol -o show job`.
    via_scontrol = client._scontrol(sorted(ids.values()), slurm.env)
    assert {j.id: (j.state, j.exit_code, j.restarts, j.source) for j in via_scontrol.values()} == {
        ids[1]: ("COMPLETED", 0, 0, "scontrol"),
        ids[2]: ("FAILED", 3, 0, "scontrol"),
    }
    # MinJobAge=5 in the test cluster: the controller forgets them within seconds; sacct still knows.
    wait_for(
        lambda: all(j.source == "sacct" for j in client.query(ids.values(), env=slurm.env).values()),
        30,
        interval=0.5,
        what="Slurm to forget the jobs",
    )
    gone = client.query(list(ids.values()) + [999999], env=slurm.env)
    assert 999999 not in gone
    assert (gone[ids[1]].state, gone[ids[1]].exit_code) == ("COMPLETED", 0)
    assert (gone[ids[2]].state, gone[ids[2]].exit_code) == ("FAILED", 3)
    # The completion log keeps no comment: a forgotten job is found by its Slurm name.
    marker = client.comment_marker(spool_id, 2)
    assert client.find_by_comment(marker, env=slurm.env) == []
    found = client.find_by_comment(marker, name=slurm_job_name("t/three"), since=time.time() - 120, env=slurm.env)
    assert found == [(ids[2], "FAILED")]


# ---- pure: options, parsers, checkpoint choice, environment --------------------------------------------
def test_sbatch_options_text() -> None:
    job = Job(
        {
            "id": 7,
            "name": "exp 1|a/train",
            "cwd": "/data/run",
            "log": "/spool/logs/100%/000007.log",
            "after": [3, 4],
            "after_any": [5, 6],
            "gpu_request": 2,
        }
    )
    extra = ["--time=60", "--partition=gpu"]
    opts = sbatch_options(job, spool_id="abc", slurm_ids={3: 30, 5: 50}, extra=extra, grace_seconds=90)
    assert opts == [
        "--job-name=exp_1_a/train",
        "--output=/spool/logs/100%%/000007.log",
        "--error=/spool/logs/100%%/000007.log",
        "--open-mode=append",
        "--chdir=/data/run",
        "--export=ALL",
        "--requeue",
        "--signal=B:USR1@90",
        "--comment=gpuq:abc:7",
        "--gres=gpu:2",
        "--dependency=afterok:30,afterany:50",  # 4 and 6: not in this hand-over, the caller's business
        "--time=60",
        "--partition=gpu",
    ]

    def gres_of(job: dict[str, Any], **kw: Any) -> list[str]:
        options = sbatch_options(Job(job), spool_id="a", slurm_ids={}, extra=[], grace_seconds=0, **kw)
        return [o for o in options if o.startswith(("--gres", "--dependency"))]

    assert gres_of(job) == ["--gres=gpu:2"]  # no dependency: 3, 4, 5, 6 are not in this hand-over
    assert gres_of(job, gres=False) == [] and gres_of(dict(job, gpu_request=0)) == []
    assert gres_of({k: v for k, v in job.items() if k != "gpu_request"}) == ["--gres=gpu:1"]  # the default
    with pytest.raises(ValueError, match="gpu_request"):
        gres_of(dict(job, gpu_request=-1))
    with pytest.raises(ValueError, match="grace period"):
        sbatch_options(job, spool_id="a", slurm_ids={}, extra=[], grace_seconds=70000)
    assert slurm_job_name("  ") == "gpuq" and slurm_job_name("a b\tc") == "a_b_c"


def test_parsers() -> None:
    assert client.parse_parsable("123\n") == 123 and client.parse_parsable("77;cluster2\n") == 77
    assert client.parse_parsable("Submitted batch job 9\n") == 9
    with pytest.raises(SlurmError, match="without a job id"):
        client.parse_parsable("")
    job = client.parse_squeue_line("4|FAILED|NonZeroExitCode|768|1|2026-12-02T18:11:32|2026-12-02T18:11:40|a|b|")
    assert job is not None
    assert (job.id, job.state, job.reason, job.exit_code, job.signal, job.restarts, job.name) == (
        4, "FAILED", "NonZeroExitCode", 3, 0, 1, "a|b")  # fmt: skip
    assert job.end is not None and job.start is not None and job.end - job.start == 8
    killed = client.parse_squeue_line("5|CANCELLED|None|9|0|N/A|NONE|x|")
    assert killed is not None and (killed.exit_code, killed.signal, killed.reason, killed.start) == (137, 9, None, None)
    running = client.parse_squeue_line("6|RUNNING|None|0|0|2026-12-02T18:11:32|NONE|x|")
    assert running is not None and (running.exit_code, running.finished) == (None, False)
    row = client.parse_sacct_row(["8", "CANCELLED by 0", "0:15", "2026-12-02T18:11:32", "Unknown", "n"])
    assert row is not None and (row.state, row.exit_code, row.signal, row.end) == ("CANCELLED", 143, 15, None)
    assert client.parse_sacct_row(["8.batch", "COMPLETED", "0:0", "", "", ""]) is None
    line = "JobId=4 JobName=my name UserId=root(0) JobState=FAILED Reason=NonZeroExitCode Restarts=2 ExitCode=3:0"
    sc = client.parse_scontrol_line(line)
    assert sc is not None and (sc.name, sc.state, sc.exit_code, sc.restarts) == ("my name", "FAILED", 3, 2)


def _checkpoint(out: Path, step: int, mtime: Optional[float] = None) -> Path:
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if mtime is not None:
        for p in (path / "trainer_state.json", path):
            os.utime(p, (mtime, mtime))
    return path


def test_launch_plan_resumes_only_from_this_runs_checkpoints(tmp_path: Path) -> None:
    out = tmp_path / "out"
    started = time.time() - 60
    _checkpoint(out, 50, mtime=started - 3600)  # an earlier run's
    since = iso_of(started)
    job = Job({"id": 1, "cmd": ["python", "t.py", "--output_dir", "out"], "cwd": str(tmp_path), "ckpt_since": since})
    argv, why = launch_plan(job, restart=1)
    assert argv == job["cmd"] and why and "starts over" in why[0] and since in why[0]
    assert launch_plan(job, restart=0) == (job["cmd"], [])
    mine = _checkpoint(out, 20)
    argv, why = launch_plan(Job(job, cmd=job["cmd"] + ["--resume_from_checkpoint", "old"]), restart=2)
    assert argv == ["python", "t.py", "--output_dir", "out", "--resume_from_checkpoint", str(mine)]
    assert why == [f"slurm restart 2: resumes from {mine}"]
    # A checkpoint directory rewritten in place counts as this run's: its files are new.
    rewritten = _checkpoint(out, 60, mtime=started - 3600)
    (rewritten / "trainer_state.json").write_text("{}")
    assert launch_plan(job, restart=1)[1] == [f"slurm restart 1: resumes from {rewritten}"]
    glob_job = Job(job, ckpt_glob="ckpts/*.pt", resume_arg="ckpt_path={ckpt}")
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "ckpts" / "model_epoch_3.pt").write_text("w")
    argv, _ = launch_plan(glob_job, restart=1)
    assert argv[-1] == f"ckpt_path={tmp_path}/ckpts/model_epoch_3.pt"


def test_launch_environment() -> None:
    runtime = {"PATH": "/sbin", "SLURM_JOB_ID": "5", "CUDA_VISIBLE_DEVICES": "0", "SUBMITTER": "yes"}
    job = Job(id=3, shell_env={"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "7", "PYTHONHOME": "/x"})
    job.update(venv="/v", env={"A": "b"})
    env = launch_environment(job, runtime)
    assert env == {
        "PATH": "/v/bin:/usr/bin",
        "VIRTUAL_ENV": "/v",
        "SLURM_JOB_ID": "5",
        "CUDA_VISIBLE_DEVICES": "0",
        "A": "b",
        "GPUQ_JOB_ID": "3",
        "GPUQ_SLURM": "1",
    }
    plain = launch_environment(Job(id=4, shell_env=None), {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "3"})
    assert plain == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "3", "GPUQ_JOB_ID": "4", "GPUQ_SLURM": "1"}


def test_sbatch_options_carry_the_job_s_time_limit_and_start() -> None:
    begin = float(int(time.time()) + 3600)  # a whole second: as the job file keeps it
    fields = {"id": 2, "name": "j", "cwd": "/w", "log": "/l.log", "gpu_request": 0}
    job = Job(dict(fields, time_limit=3, begin_at=iso_of(begin)))

    def options(extra: list[str]) -> list[str]:
        return sbatch_options(job, spool_id="a", slurm_ids={}, extra=extra, grace_seconds=120)

    local = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(begin))
    own = options([])
    # Slurm counts in minutes; the job's own limit ends it there as here: no warning signal, no requeue.
    assert "--time=1" in own and f"--begin={local}" in own
    assert not any(o.startswith("--signal") for o in own)
    assert "--time=2" in sbatch_options(
        Job(dict(job, time_limit=61)), spool_id="a", slurm_ids={}, extra=[], grace_seconds=0
    )
    # An sbatch option of --slurm-opt wins, and the warning before that limit is kept.
    theirs = options(["-t", "30", "--begin=now+10"])
    assert not any(o.startswith(("--time=", "--begin=2")) for o in theirs) and "--signal=B:USR1@120" in theirs
    assert "--time=1" not in options(["--time=4:00:00"]) and "--time=1" in options(["--time-min=5"])
    past = Job(dict(job, begin_at=iso_of(time.time() - 60), time_limit=None))
    assert not any(
        o.startswith(("--begin", "--time"))
        for o in sbatch_options(past, spool_id="a", slurm_ids={}, extra=[], grace_seconds=0)
    )


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="Slurm's sbatch is not installed")
def test_sbatch_s_own_reason_for_a_refused_option_is_kept(tmp_path: Path) -> None:
    """sbatch reads its options before it looks for a controller: a config naming none will do."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    env = dict(os.environ, SLURM_CONF=str(conf))
    with pytest.raises(SlurmError) as refused:
        client.submit("#!/bin/sh\ntrue\n", ["--bogus"], env=env)
    assert str(refused.value) == "sbatch refused the job: unrecognized option '--bogus'"
    with pytest.raises(SlurmError, match=r"^sbatch refused the job: error: Invalid --time specification$"):
        client.submit("#!/bin/sh\ntrue\n", ["--time=abc"], env=env)
