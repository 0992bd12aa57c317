"""`gpuq slurm submit | sync`, `gpuq cancel` and `gpuq status` with jobs handed to a real single-node
Slurm (tests/slurm_cluster.py), through the real CLI and a temporary spool."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import Env, wait_for
from test_slurm import free_port

from gpuq.core import transitions
from gpuq.core.times import now_iso
from gpuq.engine.lifecycle.slurm_handover import spool_marker
from gpuq.spool import Spool
from gpuq.system import slurm as client

STAMP = 'echo "{0} $(date +%s.%N)"'


@pytest.fixture
def cq(gq: Env, slurm: Any) -> Env:
    """The `gq` spool with the test cluster's SLURM_CONF, so that gpuq's sbatch and squeue reach it."""
    gq.env["SLURM_CONF"] = slurm.env["SLURM_CONF"]
    return gq


def add(cq: Env, body: str, *opts: str) -> int:
    """A CPU job (`--gpus 0`) running a shell snippet."""
    return cq.add("--gpus", "0", *opts, "--", "sh", "-c", body)


def sync_until(cq: Env, cond: Any, timeout: float = 30, what: str = "Slurm") -> Any:
    """Run `gpuq slurm sync` until `cond()` holds."""

    def synced() -> Any:
        cq.gpuq("slurm", "sync")
        return cond()

    return wait_for(synced, timeout, interval=0.3, what=what)


def slurm_id(cq: Env, job_id: int) -> int:
    return int(cq.job(job_id)["slurm"]["job_id"])


def stamps(cq: Env, job_id: int) -> dict[str, float]:
    return {m[0]: float(m[1]) for m in re.findall(r"^(begin|end) ([0-9.]+)$", cq.log(job_id), re.M)}


# ---- against the cluster ------------------------------------------------------------------------
def test_chain_of_three_runs_in_order_and_is_synced_to_done(cq: Env) -> None:
    body = f"{STAMP.format('begin')}; sleep 0.3; {STAMP.format('end')}"
    first = add(cq, body)
    second = add(cq, body, "--after", str(first))
    third = add(cq, body, "--after", str(second), "--on-finish", "true")
    out = cq.gpuq("slurm", "submit", str(third), str(second), str(first)).stdout
    assert out.count("submitted") == 3, out
    assert out.count("--on-finish are not sent on Slurm") == 1, out  # only the job that has one is told
    assert cq.files("pending") == [] and len(cq.files("slurm")) == 3  # `ls ~/.gpuq/slurm`
    marks = [cq.job(i)["slurm"] for i in (first, second, third)]
    assert marks[0]["job_id"] < marks[1]["job_id"] < marks[2]["job_id"]  # submitted in dependency order
    status = cq.gpuq("status").stdout
    assert re.search(rf"slurm {marks[2]['job_id']} (PENDING|RUNNING)", status), status
    # `gpuq wait` asks Slurm as it waits (it waits for jobs on Slurm by default too).
    waited = cq.gpuq("wait", "--timeout", "40", timeout=60)
    assert waited.returncode == 0 and all(cq.state_of(i) == "done" for i in (first, second, third)), waited
    jobs = [cq.job(i) for i in (first, second, third)]
    assert [(j["exit_code"], j["slurm"]["state"], j["history"][-1]["outcome"]) for j in jobs] == [
        (0, "COMPLETED", "done")
    ] * 3
    times = [stamps(cq, i) for i in (first, second, third)]
    assert times[0]["end"] <= times[1]["begin"] and times[1]["end"] <= times[2]["begin"], times
    assert f"=== gpuq: job #{second}" in cq.log(second)


def test_failed_job_its_stuck_dependent_and_cancel(cq: Env) -> None:
    failing = add(cq, "echo failing; exit 3")
    dependent = add(cq, "echo dependent ran", "--after", str(failing))
    cq.gpuq("slurm", "submit", "--all")
    sync_until(cq, lambda: cq.state_of(failing) == "failed", what="the failing job to be recorded")
    job = cq.job(failing)
    assert (job["exit_code"], job["slurm"]["state"]) == (3, "FAILED")
    assert job["history"][-1]["slurm_state"] == "FAILED" and "failing" in cq.log(failing)
    # Its dependent never runs: Slurm says why, and `gpuq status` shows it (status syncs by itself).
    wait_for(
        lambda: f"slurm {slurm_id(cq, dependent)} PENDING (DependencyNeverSatisfied)" in cq.gpuq("status").stdout,
        15,
        interval=0.3,
        what="DependencyNeverSatisfied in gpuq status",
    )
    assert cq.state_of(dependent) == "slurm" and cq.job(dependent)["slurm"]["reason"] == "DependencyNeverSatisfied"
    out = cq.gpuq("cancel", str(dependent)).stdout
    assert f"scancel of Slurm job {slurm_id(cq, dependent)}" in out
    assert cq.state_of(dependent) == "cancelled" and cq.job(dependent)["slurm"]["state"] == "CANCELLED"
    sid = slurm_id(cq, dependent)
    ended = wait_for(lambda: (j := client.query([sid], env=cq.env).get(sid)) and j.finished and j, 15)
    assert ended.state == "CANCELLED"
    assert "dependent ran" not in cq.log(dependent)
    cq.gpuq("slurm", "sync")
    assert cq.state_of(dependent) == "cancelled"  # a later sync leaves it there
    # Retried, the failed job is an ordinary pending job again (it runs here unless handed over).
    cq.gpuq("retry", str(failing))
    again = cq.job(failing)
    assert (again["state"], again["slurm"]) == ("pending", None) and again["history"][-1]["slurm_state"] == "FAILED"
    assert "being handed to Slurm" not in cq.gpuq("status").stdout


def test_progress_of_a_job_slurm_runs_is_read_from_its_log(cq: Env) -> None:
    job_id = add(cq, "echo 'Step 5/10'; echo ready; sleep 300")
    cq.gpuq("slurm", "submit", str(job_id))
    wait_for(lambda: "ready" in cq.log(job_id), 20, interval=0.2, what="the job to run")
    row = wait_for(
        lambda: next(
            (line for line in cq.gpuq("status").stdout.splitlines() if "slurm " in line and "RUNNING" in line), ""
        ),
        15,
        interval=0.3,
        what="gpuq status to show it running on Slurm",
    )
    assert "50%" in row, row
    eta = cq.gpuq("eta", str(job_id)).stdout
    assert f"#{job_id}" in eta and "5/10" in eta.replace(" ", ""), eta
    cq.gpuq("cancel", str(job_id))


def test_dependencies_on_finished_local_jobs(cq: Env) -> None:
    ok = add(cq, "true")
    bad = add(cq, "exit 1")
    cq.start_worker()
    cq.wait_state(ok, "done")
    cq.wait_state(bad, "failed")
    cq.cleanup()
    after_ok = add(cq, "echo after ok", "--after", str(ok))
    after_bad = add(cq, "echo after bad", "--after", str(bad))
    after_any_bad = add(cq, "echo after any", "--after-any", str(bad))
    left_behind = add(cq, "true")
    waits = add(cq, "true", "--after", str(left_behind))

    refused = cq.gpuq("slurm", "submit", str(after_bad), check=False)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"job #{after_bad} runs after #{bad}, which failed" in refused.stderr
    refused = cq.gpuq("slurm", "submit", str(waits), check=False)
    assert refused.returncode == 1 and "hand it over too" in refused.stderr, refused.stderr
    assert cq.files("slurm") == []  # refused before anything was submitted

    cq.gpuq("slurm", "submit", str(after_ok), str(after_any_bad))
    sync_until(cq, lambda: cq.state_of(after_ok) == cq.state_of(after_any_bad) == "done", what="both to run")
    assert "after ok" in cq.log(after_ok) and "after any" in cq.log(after_any_bad)
    # A dependency on a job already on Slurm becomes a Slurm dependency on its id.
    cq.gpuq("slurm", "submit", str(left_behind), str(waits))
    assert cq.state_of(waits) == "slurm"


def test_submit_all_hands_over_what_can_go_and_names_what_stays(cq: Env) -> None:
    bad = add(cq, "exit 1")
    cq.start_worker()
    cq.wait_state(bad, "failed")
    cq.cleanup()
    after_bad = add(cq, "true", "--after", str(bad))
    after_that = add(cq, "true", "--after", str(after_bad))
    first = add(cq, "while [ ! -e go ]; do sleep 0.05; done")  # runs on Slurm until the test says go
    second = add(cq, "true", "--after", str(first))

    proc = cq.gpuq("slurm", "submit", "--all", check=False)
    assert proc.returncode == 1 and proc.stdout.count("(submitted)") == 2, proc
    assert proc.stderr.splitlines() == [
        f"gpuq: job #{after_bad} runs after #{bad}, which failed: it would never start "
        f"(`gpuq retry {bad}` first, or --after-any)",
        f"gpuq: job #{after_that} runs after #{after_bad}, which stays here: it stays too",
    ]
    assert [cq.state_of(i) for i in (after_bad, after_that, first, second)] == ["pending"] * 2 + ["slurm"] * 2
    assert cq.job(after_bad).get("slurm") is None and cq.job(after_that).get("slurm") is None  # not marked
    # The dependency between the two handed over is Slurm's.
    shown = subprocess.run(
        ["scontrol", "-o", "show", "job", str(slurm_id(cq, second))], env=cq.env, capture_output=True, text=True
    )
    assert f"Dependency=afterok:{slurm_id(cq, first)}" in shown.stdout, shown
    cancelled = cq.gpuq("cancel", str(first), str(second)).stdout
    assert cancelled.count("scancel of Slurm job") == 2 and cq.state_of(second) == "cancelled"


def test_interrupted_hand_over_is_repaired_never_submitted_twice(cq: Env, slurm: Any) -> None:
    found, lost = add(cq, "echo found", "--name", "t/found"), add(cq, "echo lost", "--name", "t/lost")
    spool = Spool(cq.home)
    # gpuq killed between marking and sbatch's answer: the marks are there, as the engine writes them.
    for job_id in (found, lost):
        ref = spool.jobs.find(job_id)
        assert ref is not None
        job = spool.jobs.load(ref)
        mark = {"job_id": None, "state": "SUBMITTING", "submitted_at": now_iso(), "cluster_opts": []}
        job["slurm"] = mark
        (cq.home / "pending" / ref.name).write_text(json.dumps(dict(job, rev=job["rev"] + 1)))
    # ... and for `found`, sbatch did answer: a Slurm job carries its marker.
    marker = spool_marker(spool, found)
    argv = ["sbatch", "--parsable", f"--comment={marker}", f"--output={cq.job(found)['log']}", "--open-mode=append"]
    argv += ["--begin=now+600"]  # held in squeue until released below: found by its comment, not by chance
    made = subprocess.run([*argv, "--wrap", "echo made before the cut"], env=cq.env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    existing = int(made.stdout.strip().split(";")[0])
    # A marked job is not run here, nor cancelled here (Slurm may hold it).
    assert "being handed to Slurm" in cq.gpuq("status").stdout
    assert "being handed to Slurm" in cq.gpuq("cancel", str(found), check=False).stderr

    out = cq.gpuq("slurm", "submit", str(found), str(lost)).stdout
    assert f"Job #{found}" in out and f"-> Slurm job {existing} (found on Slurm" in out, out
    assert slurm_id(cq, found) == existing
    assert f"Job #{lost}" in out and out.count("(submitted)") == 1
    with_marker = client.find_by_comment(marker, env=cq.env)
    assert [sid for sid, _state in with_marker] == [existing]  # not submitted twice
    lost_marker = client.find_by_comment(spool_marker(spool, lost), env=cq.env)
    assert [sid for sid, _state in lost_marker] == [slurm_id(cq, lost)]
    subprocess.run(["scontrol", "update", f"jobid={existing}", "StartTime=now"], env=cq.env, check=True, timeout=30)
    sync_until(cq, lambda: cq.state_of(found) == cq.state_of(lost) == "done", what="both to end")
    assert "made before the cut" in cq.log(found)


def test_sbatch_missing_refusing_or_no_controller_moves_nothing(cq: Env, slurm: Any, tmp_path: Path) -> None:
    job_id = add(cq, "true")
    before = cq.job(job_id)
    no_slurm = dict(cq.env, PATH=str(tmp_path))
    proc = cq.gpuq("slurm", "submit", str(job_id), check=False, env=no_slurm)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == "gpuq: Slurm's sbatch is not on PATH: run gpuq on the cluster's login node\n"
    assert cq.job(job_id) == before  # not even marked
    proc = cq.gpuq("slurm", "submit", str(job_id), "--slurm-opt", "--partition=nosuch", check=False)
    refusal = f"gpuq: job #{job_id} stays here: sbatch refused the job: "
    assert proc.returncode == 1 and proc.stderr.startswith(refusal), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    job = cq.job(job_id)
    assert job["state"] == "pending" and job["slurm"] is None  # the mark is taken back
    # A controller that does not answer (nothing listens on its port; MessageTimeout=2 keeps it short):
    # the next job is not tried (it would wait as long again), and both are named.
    other = add(cq, "true")
    dead = slurm.conf_variant("dead-handover.conf", SlurmctldPort=str(free_port()), MessageTimeout="2")
    proc = cq.gpuq("slurm", "submit", "--all", check=False, env=dict(cq.env, SLURM_CONF=str(dead)))
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and len(lines) == 2, proc.stderr
    assert lines[0].startswith(f"gpuq: job #{job_id} stays here: the Slurm controller does not answer"), lines
    assert lines[1].startswith(f"gpuq: job #{other} was not handed over: the Slurm controller does not answer")
    assert [cq.job(i).get("slurm") for i in (job_id, other)] == [None, None] and cq.files("slurm") == []
    usage = cq.gpuq("slurm", "submit", check=False)
    assert usage.returncode == 2 and "--all" in usage.stderr


def test_status_without_slurm_jobs_does_not_import_subprocess(gq: Env) -> None:
    gq.add("--gpus", "0", "--", "true")
    probe = "import sys; from gpuq.cli import main; main(['status']); print('subprocess' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], env=gq.env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout


# ---- the spool on a network filesystem ------------------------------------------------------------
MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /home rw,relatime shared:20 - nfs4 fs1:/export/home rw,vers=4.2
41 40 0:36 / /home/u/local\\040disk rw - ext4 /dev/sdb1 rw
42 22 0:37 / /lustre rw - lustre 10.0.0.1@tcp:/scratch rw
"""


def test_network_filesystem_is_read_from_mountinfo() -> None:
    from gpuq.system.fsutil import network_filesystem

    assert network_filesystem(Path("/home/u/.gpuq"), MOUNTINFO) == "nfs4"
    assert network_filesystem(Path("/home"), MOUNTINFO) == "nfs4"
    assert network_filesystem(Path("/home/u/local disk/.gpuq"), MOUNTINFO) is None  # mounted inside, local
    assert network_filesystem(Path("/lustre/u/q"), MOUNTINFO) == "lustre"
    assert network_filesystem(Path("/homework"), MOUNTINFO) is None and network_filesystem(Path("/tmp"), "") is None


def test_worker_files_of_other_hosts_are_seen_and_run_is_quiet_on_a_local_spool(gq: Env) -> None:
    spool = Spool(gq.home).ensure()
    (gq.home / "workers" / "worker-999999.json").write_text(json.dumps({"pid": 999999, "host": "node7"}))
    assert [w["host"] for w in spool.workers.recorded()] == ["node7"]
    assert spool.network_filesystem() is None  # pytest's tmp_path is local here
    gq.add("--gpus", "0", "--", "true")
    proc = gq.gpuq("run")
    assert "network filesystem" not in proc.stderr


def test_begin_and_time_limit_reach_slurm_and_kill_scancels_a_running_job(cq: Env) -> None:
    later = add(cq, "echo ran", "--begin", "+1h", "--time", "3s")
    running = add(cq, "echo started; sleep 300")
    out = cq.gpuq("slurm", "submit", str(later), str(running)).stdout
    assert "its --time 3s is --time=1 on Slurm (whole minutes)" in out
    shown = subprocess.run(
        ["scontrol", "-o", "show", "job", str(slurm_id(cq, later))], env=cq.env, capture_output=True, text=True
    ).stdout
    assert "TimeLimit=00:01:00" in shown and "Reason=BeginTime" in shown, shown
    assert "JobState=PENDING" in shown
    # A running job on Slurm: `kill` does what `cancel` does there, and its attempt is in its history.
    sync_until(cq, lambda: cq.job(running)["started_at"] is not None, what="the job to run on Slurm")
    killed = cq.gpuq("kill", str(running)).stdout
    assert f"cancelled (scancel of Slurm job {slurm_id(cq, running)})" in killed and "not running" not in killed
    job = cq.job(running)
    assert job["state"] == "cancelled" and "gpuq kill" in job["note"]
    assert [(h["outcome"], h["slurm_state"]) for h in job["history"]] == [("cancelled", "CANCELLED")]
    assert "no attempt has ended yet" not in cq.gpuq("history", str(running)).stdout
    cq.gpuq("cancel", str(later))


def test_the_worker_syncs_a_slurm_job_a_local_job_waits_for(cq: Env) -> None:
    first = add(cq, "echo first")
    cq.gpuq("slurm", "submit", str(first))
    second = add(cq, "echo second", "--after", str(first))
    cq.start_worker()
    wait_for(lambda: cq.state_of(second) == "done", 40, interval=0.3, what="the local job after the Slurm one")
    assert cq.state_of(first) == "done"  # recorded by the worker's sync: no status, no sync was run


def test_a_job_whose_slurm_is_gone_is_cancelled_here_only_with_force(gq: Env) -> None:
    job_id = add(gq, "true")
    spool = Spool(gq.home)
    ref = spool.jobs.find(job_id)
    assert ref is not None
    job = spool.jobs.load(ref)
    ref, job = spool.jobs.move(ref, job, "slurm", transitions.hand_over(job, 4242))
    spool.jobs.rewrite(ref, job, **transitions.slurm_seen(job, "RUNNING", None, now_iso()))
    gone = dict(gq.env, PATH=str(gq.work))  # no scancel, no squeue: this is no login node any more
    refused = gq.gpuq("cancel", str(job_id), env=gone, check=False)
    assert refused.returncode == 1 and "scancel is not on PATH" in refused.stderr
    assert f"gpuq cancel --force {job_id}" in refused.stderr and gq.state_of(job_id) == "slurm"
    out = gq.gpuq("cancel", "--force", str(job_id), env=gone).stdout
    assert "cancelled here only: Slurm (job 4242) could not be told" in out and "may still run there" in out
    ended = gq.job(job_id)
    assert ended["state"] == "cancelled" and [h["outcome"] for h in ended["history"]] == ["cancelled"]
