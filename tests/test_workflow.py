"""The experiment workflow (issue 16): sweeps, hold and release, editing a queued job, and the
history with its picture. Real workers and jobs in a temporary spool."""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import Env

from gpuq.system.extras import install_command

ECHO = "import json, sys\nopen(sys.argv[-1], 'w').write(json.dumps(sys.argv[1:-1]))\n"


def test_a_sweep_queues_one_job_per_combination(gq: Env) -> None:
    gq.script("train.py", ECHO)
    out = gq.gpuq(
        "add", "-q", "--sweep", "lr=1e-4,3e-4,1e-3", "--sweep", "seed=0,1", "train.py",
        "--lr", "{lr}", "--seed", "{seed}", "--out=run-{lr}-{seed}.json", "{seed}.json",
    ).stdout  # fmt: skip
    ids = [int(line) for line in out.split()]
    assert len(ids) == 6 and ids == list(range(ids[0], ids[0] + 6))
    jobs = [gq.job(i) for i in ids]
    combos = [(j["sweep"]["values"]["lr"], j["sweep"]["values"]["seed"]) for j in jobs]
    assert combos == [("1e-4", "0"), ("1e-4", "1"), ("3e-4", "0"), ("3e-4", "1"), ("1e-3", "0"), ("1e-3", "1")]
    assert [j["name"] for j in jobs][:2] == ["work/train lr=1e-4 seed=0", "work/train lr=1e-4 seed=1"]
    assert jobs[3]["cmd"][1:] == ["train.py", "--lr", "3e-4", "--seed", "1", "--out=run-3e-4-1.json", "1.json"]
    assert all(j["sweep"]["id"] == ids[0] for j in jobs)

    folded = gq.gpuq("status").stdout
    assert f"sweep #{ids[0]} work/train" in folded and "0 done, 0 running, 6 waiting, 0 failed" in folded
    assert "lr=3e-4 seed=1" not in folded and "lr=3e-4 seed=1" in gq.gpuq("status", "-a").stdout
    members = json.loads(gq.gpuq("show", "--json", str(ids[2])).stdout)["sweep_jobs"]
    assert [m["id"] for m in members] == ids

    gq.script("eval.py", "print('evaluated')\n")
    last = gq.add("--after", f"{ids[0]}-{ids[-1]}", "eval.py")
    assert gq.job(last)["after"] == ids
    gq.gpuq("run")
    for job_id in ids + [last]:
        assert gq.state_of(job_id) == "done"
    finished = [json.loads((gq.work / f"{seed}.json").read_text()) for seed in (0, 1)]
    assert finished[1][:4] == ["--lr", "1e-3", "--seed", "1"]  # the last of each seed wrote it
    started = {i: gq.job(i)["started_at"] for i in ids}
    assert gq.job(last)["started_at"] > max(started.values())  # the eval waited for the whole sweep


def test_a_wrong_sweep_queues_nothing(gq: Env) -> None:
    gq.script("train.py", ECHO)
    for args in (
        ("--sweep", "lr=1e-4,3e-4", "train.py", "--lr", "{lr2}"),
        ("--sweep", "lr=", "train.py", "--lr", "{lr}"),
        ("--sweep", "a=" + ",".join(map(str, range(40))), "--sweep", "b=" + ",".join(map(str, range(40))),
         "train.py", "{a}", "{b}"),
    ):  # fmt: skip
        proc = gq.gpuq("add", *args, check=False)
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "unknown placeholder {lr2}" in gq.gpuq("add", "--sweep", "lr=1", "train.py", "{lr2}", check=False).stderr
    assert gq.files("pending") == []


def test_hold_keeps_a_job_and_its_dependent_back_while_others_run(gq: Env) -> None:
    gq.script("t.py", "print('ran')\n")
    held = gq.add("--hold", "t.py")
    dependent = gq.add("--after", str(held), "t.py")
    other = gq.add("--priority", "-1", "t.py")
    assert gq.files("held") == [f"{held:06d}-work-t.json"]
    assert "(held): runs after `gpuq release" in gq.gpuq("status").stdout
    gq.gpuq("run")  # runs what it can, then stops: the rest waits for a person
    assert gq.state_of(other) == "done"
    assert gq.state_of(held) == "held" and gq.state_of(dependent) == "pending"
    gq.gpuq("release", str(held))
    gq.gpuq("run")
    assert gq.state_of(held) == "done" and gq.state_of(dependent) == "done"

    again = gq.add("t.py")
    gq.gpuq("hold", str(again))
    assert gq.state_of(again) == "held"


def test_a_running_job_cannot_be_held(gq: Env) -> None:
    gq.script("slow.py", "import time\nwhile True: time.sleep(0.1)\n")
    job_id = gq.add("slow.py")
    gq.start_worker("--watch")
    gq.wait_state(job_id, "running")
    proc = gq.gpuq("hold", str(job_id), check=False)
    assert proc.returncode == 1 and f"`gpuq preempt {job_id}`" in proc.stderr
    gq.gpuq("kill", str(job_id))


def test_edit_with_set_changes_a_pending_job_and_a_bad_edit_changes_nothing(gq: Env) -> None:
    gq.script("train.py", ECHO)
    job_id = gq.add("train.py", "--lr", "1e-4", "out.json")
    before = gq.job(job_id)
    gq.gpuq("edit", str(job_id), "--set", "priority=5", "--set", 'env={"SEED": "7"}')
    job = gq.job(job_id)
    assert (job["priority"], job["env"], job["rev"]) == (5, {"SEED": "7"}, before["rev"] + 1)
    assert job["history"] == before["history"] and job["created_at"] == before["created_at"]

    cmd = json.dumps([sys.executable, "train.py", "--lr", "3e-4", "out.json"])
    gq.gpuq("edit", str(job_id), "--set", f"cmd={cmd}", "--set", "name=exp/tuned")
    assert gq.job(job_id)["cmd"][2:4] == ["--lr", "3e-4"] and gq.files("pending") == [f"{job_id:06d}-exp-tuned.json"]

    bad_values = ("retries=-3", "cmd=[]", "priority=high", "cpus=0", "cpus=abc", "gpus=abc", "retries=abc")
    bad_values += ("priority=abc", "retry_oom=-1", "conda=torch", "notify_urls=x", "mem=abc", "gpu_mem=abc")
    for bad in bad_values:  # a bad value is a bad command line, whatever its field
        proc = gq.gpuq("edit", str(job_id), "--set", bad, check=False)
        assert proc.returncode == 2 and proc.stderr.startswith("gpuq edit: "), (bad, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1, (bad, proc.stderr)
    proc = gq.gpuq("edit", str(job_id), "--set", "after=[999]", check=False)  # no such job: refused, as by `add`
    assert proc.returncode == 1 and "not changed: after: no such job #999" in proc.stderr
    for forbidden in ("id=9", "history=[]"):
        proc = gq.gpuq("edit", str(job_id), "--set", forbidden, check=False)
        assert proc.returncode == 2 and "not editable" in proc.stderr
    assert gq.job(job_id)["rev"] == before["rev"] + 2  # the refused edits changed nothing

    gq.gpuq("run")
    assert json.loads((gq.work / "out.json").read_text()) == ["--lr", "3e-4"]


def test_editing_a_running_job_is_refused(gq: Env) -> None:
    gq.script("slow.py", "import time\nwhile True: time.sleep(0.1)\n")
    job_id = gq.add("slow.py")
    gq.start_worker("--watch")
    gq.wait_state(job_id, "running")
    proc = gq.gpuq("edit", str(job_id), "--set", "priority=1", check=False)
    assert proc.returncode == 1 and "running, not pending or held" in proc.stderr
    gq.gpuq("kill", str(job_id))


def test_edit_in_an_editor(gq: Env, tmp_path: Path) -> None:
    gq.script("t.py", "")
    job_id = gq.add("t.py")
    editor = tmp_path / "editor.py"  # a scripted $EDITOR: raises the priority, adds an env variable
    editor.write_text(
        "import json, sys\nd = json.load(open(sys.argv[1]))\nd['priority'] = 9\nd['env']['K'] = 'v'\n"
        "json.dump(d, open(sys.argv[1], 'w'))\n"
    )
    env = dict(gq.env, EDITOR=f"{sys.executable} {editor}")
    out = gq.gpuq("edit", str(job_id), env=env).stdout
    assert "changed: env, priority" in out
    assert gq.job(job_id)["priority"] == 9 and gq.job(job_id)["env"] == {"K": "v"}
    breaker = tmp_path / "breaker.py"
    breaker.write_text("import sys\nopen(sys.argv[1], 'w').write('{not json')\n")
    proc = gq.gpuq("edit", str(job_id), env=dict(gq.env, VISUAL=f"{sys.executable} {breaker}"), check=False)
    assert proc.returncode == 2 and "not changed" in proc.stderr and gq.job(job_id)["priority"] == 9


# ---- history -------------------------------------------------------------------------------------


def _finished(gq: Env, job_id: int, start: str, end: str, gpus: list, state: str = "done") -> None:
    """A finished job with known run times, published through gpuq's own library."""
    from gpuq.core import schema
    from gpuq.spool import Spool

    job = schema.new_job(job_id=job_id, name=f"exp/j{job_id}", cmd=["python3", "train.py"], cwd=str(gq.work), log="")
    attempt = {"attempt": 1, "started_at": start, "finished_at": end, "exit_code": 0, "signal": None}
    job.update(started_at=start, finished_at=end, exit_code=0, gpus=gpus, rev=2, history=[dict(attempt, outcome=state)])
    Spool(gq.home).ensure().jobs.publish(job, state)


def test_history_sums_gpu_hours_and_draws_a_timeline(gq: Env, tmp_path: Path) -> None:
    gq.gpuq("status")
    _finished(gq, 1, "2026-12-01T10:00:00+00:00", "2026-12-01T11:30:00+00:00", [0, 1])  # 2 GPUs x 1.5 h
    _finished(gq, 2, "2026-12-01T12:00:00+00:00", "2026-12-01T12:30:00+00:00", [0])  # 1 GPU x 0.5 h
    _finished(gq, 3, "2026-12-01T13:00:00+00:00", "2026-12-01T14:00:00+00:00", [1], "failed")
    groups = json.loads(gq.gpuq("history", "--json").stdout)
    assert len(groups) == 1 and groups[0]["key"] == str(gq.work)
    assert groups[0]["gpu_hours"] == 4.5 and (groups[0]["runs"], groups[0]["done"], groups[0]["failed"]) == (3, 2, 1)
    assert "4.50 GPU-hours" in gq.gpuq("history").stdout

    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    png, svg = tmp_path / "week.png", tmp_path / "week.svg"
    gq.gpuq("history", "--plot", str(png))
    gq.gpuq("history", "--plot", str(svg))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    assert imread(str(png)).shape[0] > 100
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    bars = [e for e in root.iter() if (e.get("id") or "").startswith("gpuq-run-")]
    assert len(bars) == 4  # job 1 in two GPU lanes, jobs 2 and 3 in one each


def test_history_plot_without_matplotlib_says_which_extra(gq: Env, tmp_path: Path) -> None:
    code = "import sys; sys.modules['matplotlib'] = None; from gpuq.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = __import__("subprocess").run(
        [sys.executable, "-c", code, "history", "--plot", str(tmp_path / "x.png")],
        env=gq.env,
        cwd=gq.work,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"gpuq: history --plot needs matplotlib: {install_command('plot')}"
    assert not os.path.exists(tmp_path / "x.png")
