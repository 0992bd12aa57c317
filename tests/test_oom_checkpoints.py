"""Checkpoints kept by rule (`--keep-checkpoints`), through a real worker: the job's script writes HF
`checkpoint-N` directories (trainer_state.json last, as HF does) and the supervisor removes the
older ones while it runs and when it ends, saying so in the job's log."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import Env, wait_for

from gpuq.core.job import Job
from gpuq.engine.tracking import checkpoints, retention

# Writes checkpoint-2, -4, -8, -10, -12 complete and -14 without trainer_state.json (being written);
# then waits for `go` when asked to, so that a test can look while it runs.
TRAINER = """import json, os, sys, time
out = "out"
best = sys.argv[1] if len(sys.argv) > 1 else None
for step in (2, 4, 8, 10, 12):
    d = os.path.join(out, f"checkpoint-{step}")
    os.makedirs(d)
    with open(os.path.join(d, "model.safetensors"), "wb") as fh:
        fh.write(b"w" * 4096)
    state = {"global_step": step, "best_model_checkpoint": best}
    with open(os.path.join(d, "trainer_state.json"), "w") as fh:
        json.dump(state, fh)
os.makedirs(os.path.join(out, "checkpoint-14"))
with open(os.path.join(out, "checkpoint-14", "model.safetensors"), "wb") as fh:
    fh.write(b"w" * 4096)
while os.environ.get("WAIT") and not os.path.exists("go"):
    time.sleep(0.02)
"""


def _names(gq: Env) -> list[str]:
    return sorted(os.listdir(gq.work / "out"), key=lambda name: int(name.rsplit("-", 1)[1]))


def test_keep_2_keeps_exactly_10_and_12_and_leaves_the_one_being_written(gq: Env) -> None:
    gq.script("train.py", TRAINER)
    job_id = gq.add("--gpus", "0", "--keep-checkpoints", "2", "train.py", "--output_dir", "out")
    gq.gpuq("run")  # runs what is queued, then returns
    job = gq.wait_state(job_id, "done")
    assert _names(gq) == ["checkpoint-10", "checkpoint-12", "checkpoint-14"]
    log = gq.log(job_id)
    assert "removed checkpoint-2, checkpoint-4, checkpoint-8" in log and "--keep-checkpoints 2" in log
    assert job["ckpt_bytes"] >= 4096  # checkpoint-12's size, for the disk guard


def test_older_checkpoints_go_while_the_job_runs(gq: Env) -> None:
    gq.script("train.py", TRAINER)
    gq.env.update(GPUQ_CKPT_KEEP_SECONDS="0.2", WAIT="1")
    job_id = gq.add("--gpus", "0", "--keep-checkpoints", "1", "train.py", "--output_dir", "out")
    gq.start_worker("--watch")
    wait_for(lambda: (gq.work / "out").exists() and _names(gq) == ["checkpoint-12", "checkpoint-14"], 20,
             what="the older checkpoints to go")  # fmt: skip
    assert gq.state_of(job_id) == "running"
    (gq.work / "go").write_text("")
    gq.wait_state(job_id, "done")


def test_best_keeps_the_newest_and_the_best(gq: Env) -> None:
    gq.script("train.py", TRAINER)
    job_id = gq.add("--gpus", "0", "--keep-checkpoints", "best", "train.py", "out/checkpoint-4", "--output_dir", "out")
    gq.gpuq("run")
    gq.wait_state(job_id, "done")
    assert _names(gq) == ["checkpoint-4", "checkpoint-12", "checkpoint-14"]


def test_the_config_file_gives_the_default(gq: Env, tmp_path: Path) -> None:
    (tmp_path / "config" / "gpuq").mkdir(parents=True)
    (tmp_path / "config" / "gpuq" / "config.toml").write_text("keep_checkpoints = 3\n")
    gq.env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    gq.script("train.py", TRAINER)
    job_id = gq.add("--gpus", "0", "train.py", "--output_dir", "out")
    gq.gpuq("run")
    gq.wait_state(job_id, "done")
    assert _names(gq) == ["checkpoint-8", "checkpoint-10", "checkpoint-12", "checkpoint-14"]


def test_all_keeps_every_checkpoint_over_the_config_file_s_rule(gq: Env, tmp_path: Path) -> None:
    """With `keep_checkpoints = 3` in the config file no job could opt out: `all` was refused ("not
    a number of checkpoints (1 or more) or 'best'") by add and edit; it now keeps every one."""
    (tmp_path / "config" / "gpuq").mkdir(parents=True)
    (tmp_path / "config" / "gpuq" / "config.toml").write_text("keep_checkpoints = 3\n")
    gq.env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    gq.script("train.py", TRAINER)
    job_id = gq.add("--hold", "--gpus", "0", "--keep-checkpoints", "2", "train.py", "--output_dir", "out")
    gq.gpuq("edit", str(job_id), "--set", "keep_checkpoints=all")
    gq.gpuq("release", str(job_id))
    gq.gpuq("run")
    assert gq.wait_state(job_id, "done")["keep_checkpoints"] == "all"
    assert _names(gq) == [f"checkpoint-{step}" for step in (2, 4, 8, 10, 12, 14)]
    assert "removed" not in gq.log(job_id)
    again = gq.add("--gpus", "0", "--keep-checkpoints", "ALL", "train.py", "--output_dir", "out")
    assert gq.job(again)["keep_checkpoints"] == "all"


def test_a_bad_rule_is_refused_in_one_line(gq: Env) -> None:
    gq.script("train.py", TRAINER)
    for bad in ("0", "-2", "newest"):
        proc = gq.gpuq("add", "--keep-checkpoints", bad, "train.py", check=False)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _glob_job(work: Path, **fields: object) -> Job:
    return Job(cmd=["train"], cwd=str(work), ckpt_glob="ckpts/step_*", **fields)


def _old(path: Path) -> None:
    os.utime(path, (1e9, 1e9))  # long unchanged: not being written


def test_a_link_out_of_the_directory_and_a_name_without_a_step_are_never_removed(tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data").write_text("keep me")
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    (ckpts / "step_1").symlink_to(outside)
    for name in ("step_2", "step_3", "step_final"):
        (ckpts / name).write_text("w")
        _old(ckpts / name)
    removed = retention.remove(_glob_job(tmp_path), 1)
    assert [os.path.basename(r.path) for r in removed] == ["step_2"]
    assert (outside / "data").read_text() == "keep me" and (ckpts / "step_1").is_symlink()
    assert sorted(os.listdir(ckpts)) == ["step_1", "step_3", "step_final"]


def test_a_match_still_being_written_and_the_one_resumed_from_stay(tmp_path: Path) -> None:
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    for step in (5, 10, 20):
        (ckpts / f"step_{step}").write_text("w")
        _old(ckpts / f"step_{step}")
    (ckpts / "step_30").write_text("w")  # written just now: it may still be being written
    job = _glob_job(tmp_path, resumed_from=str(ckpts / "step_20"))
    assert [c.step for c in retention.removable(job, 1)] == [5, 10]  # 20 is the newest complete one
    (ckpts / "step_30").write_text("w")
    _old(ckpts / "step_30")
    assert [c.step for c in retention.removable(job, 1)] == [5, 10, 20]  # a newer complete one exists


def test_an_hf_checkpoint_without_its_state_is_never_complete(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for step in (1, 2):
        (out / f"checkpoint-{step}").mkdir(parents=True)
        (out / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (out / "checkpoint-3").mkdir()
    job = Job(cmd=["train", "--output_dir", "out"], cwd=str(tmp_path))
    assert [c.step for c in retention.removable(job, 1)] == [1]


def test_a_match_with_nothing_written_yet_is_not_the_newest(tmp_path: Path) -> None:
    """A save that made its directory and has written nothing for a while: step_20 stays the newest."""
    ckpts = tmp_path / "ckpts"
    for step in (10, 20):
        (ckpts / f"step_{step}").mkdir(parents=True)
        (ckpts / f"step_{step}" / "w.bin").write_text("w")
        _old(ckpts / f"step_{step}" / "w.bin")
        _old(ckpts / f"step_{step}")
    (ckpts / "step_30" / "shards").mkdir(parents=True)
    (ckpts / "step_30" / "shards" / "0.bin").write_text("")
    for path in (ckpts / "step_30" / "shards" / "0.bin", ckpts / "step_30" / "shards", ckpts / "step_30"):
        _old(path)
    assert [c.step for c in retention.removable(_glob_job(tmp_path), 1)] == [10]


def test_a_name_with_more_than_one_number_has_no_step_and_is_never_removed(tmp_path: Path) -> None:
    """`ck-20261208-0100.pt` ends in a number that is a time, not a step: read as step 100 it sorted
    before `ck-20261207-2300.pt` (step 2300) and the newest was removed. Only a name's one number is
    its step (`ck-8`, `w_0800.pt`)."""
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    for name in ("ck-20261207-2300.pt", "ck-20261208-0100.pt"):
        (ckpts / name).write_text("w")
        _old(ckpts / name)
    assert checkpoints.name_step("ck-20261208-0100.pt") is None and checkpoints.name_step("model-8.h5") is None
    assert checkpoints.name_step("w_0800.pt") == 800 and checkpoints.name_step("ck-8") == 8
    assert retention.remove(Job(cmd=["train"], cwd=str(tmp_path), ckpt_glob="ckpts/*.pt"), 1) == []
    assert sorted(os.listdir(ckpts)) == ["ck-20261207-2300.pt", "ck-20261208-0100.pt"]
