"""A job file dropped by hand into pending/ says what `gpuq add` can of the rules that waste no
GPU-hour: `retry_oom` (--retry-oom), `keep_checkpoints` (--keep-checkpoints N|best) and `min_free`
(--min-free), each taken in by a real worker and acted on; a bad value sends the file to rejected/
with the reason."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from conftest import Env, small_tmpfs, wait_for
from test_gpu_worker import Gpus, fake_gpus, row
from test_oom import OOM_ONCE, G, _attempt
from test_oom_checkpoints import TRAINER, _names
from test_oom_diskguard import short_of_8m


def _drop(gq: Env, name: str, fields: dict[str, Any]) -> None:
    """Written elsewhere and moved in, as spool_layout.md section 3 asks of a writer."""
    gq.gpuq("status")  # creates the spool
    tmp = gq.work / f".{name}.tmp"
    tmp.write_text(json.dumps({"cwd": str(gq.work), **fields}))
    os.chmod(tmp, 0o600)
    os.rename(tmp, gq.home / "pending" / name)


def test_a_dropped_retry_oom_retries_with_the_share_doubled(gq: Env) -> None:
    Gpus(gq, fake_gpus(1, total=80 * G))
    gq.script("oom.py", OOM_ONCE)
    _drop(gq, "oom.json", {"cmd": ["oom.py", "1"], "gpu_mem": "20G", "retry_oom": 1})
    gq.start_worker("--watch")
    assert _attempt(gq, 0)["retry"] is None
    assert _attempt(gq, 1) == {"retry": "1", "gpus": "0"}
    (gq.work / "go").write_text("")
    job = gq.wait_state(1, "done", timeout=20)
    assert job["retry_oom"] == 1 and job["retries"] == 0 and job["source"] == "dropped:oom.json"
    assert job["gpu_mem_mib"] == 40 * G and job["oom_retries"] == 1
    assert "retrying after out-of-memory with 40G" in job["history"][0]["change"]


def test_a_dropped_keep_checkpoints_keeps_the_newest_two(gq: Env) -> None:
    gq.script("train.py", TRAINER)
    _drop(gq, "keep.json", {"cmd": "train.py --output_dir out", "gpus": 0, "keep_checkpoints": 2})
    gq.gpuq("run")  # takes the file in, runs it, returns
    job = gq.wait_state(1, "done")
    assert job["keep_checkpoints"] == 2
    assert _names(gq) == ["checkpoint-10", "checkpoint-12", "checkpoint-14"]
    assert "removed checkpoint-2, checkpoint-4, checkpoint-8" in gq.log(1)


def test_a_dropped_best_is_the_rule_best(gq: Env) -> None:
    gq.script("train.py", TRAINER)
    _drop(gq, "best.json", {"cmd": ["train.py", "out/checkpoint-4", "--output_dir", "out"], "gpus": 0,
                            "keep_checkpoints": "best"})  # fmt: skip
    gq.gpuq("run")
    assert gq.wait_state(1, "done")["keep_checkpoints"] == "best"
    assert _names(gq) == ["checkpoint-4", "checkpoint-12", "checkpoint-14"]


# Saves ckpts/step_1 .. step_4, then runs on until none of them may still be being written (a glob's
# match changed in the last 2 s may be: engine/tracking/retention.py), so that its end prunes them.
STEPS = """import os, time
os.makedirs("ckpts", exist_ok=True)
for step in range(1, 5):
    with open(os.path.join("ckpts", f"step_{step}"), "w") as fh:
        fh.write("w")
saved = time.time()
while time.time() - saved < 2.5:
    time.sleep(0.05)
"""


def test_a_dropped_ckpt_glob_is_where_its_kept_checkpoints_are(gq: Env) -> None:
    gq.script("train.py", STEPS)
    _drop(gq, "glob.json", {"cmd": ["train.py"], "gpus": 0, "keep_checkpoints": 2, "ckpt_glob": "ckpts/step_*"})
    gq.gpuq("run")
    job = gq.wait_state(1, "done")
    assert job["ckpt_glob"] == "ckpts/step_*" and job["keep_checkpoints"] == 2
    assert sorted(os.listdir(gq.work / "ckpts")) == ["step_3", "step_4"]


def test_a_dropped_min_free_holds_the_job_until_there_is_room(gq: Env, tmp_path: Path) -> None:
    with small_tmpfs(tmp_path, "16m") as mount:
        short_of_8m(mount)
        gq.script("job.py", "print('ran')\n")
        _drop(gq, "guard.json", {"cmd": ["job.py", "--output_dir", str(mount / "out")], "gpus": 0, "min_free": "8M"})
        gq.start_worker("--watch")
        reason = wait_for(lambda: gq.state_of(1) == "pending" and row(gq, 1)["waiting"], 15, what="the guard")
        assert reason.startswith(f"waiting for disk space: {mount} has ") and "(--min-free 8.0M)" in reason
        assert gq.job(1)["min_free_bytes"] == 8 << 20 and "ran" not in gq.log(1)


def test_a_dropped_min_free_in_mib_as_every_size_in_a_file(gq: Env) -> None:
    _drop(gq, "mib.json", {"cmd": ["true"], "gpus": 0, "min_free": 512})
    gq.gpuq("run")
    assert gq.wait_state(1, "done")["min_free_bytes"] == 512 << 20


def test_a_bad_value_sends_the_file_to_rejected_with_the_reason(gq: Env) -> None:
    bad = {
        "oom.json": ({"retry_oom": -1}, "'retry_oom' must be an integer from 0 to 100"),
        "keep.json": ({"keep_checkpoints": 0}, "'keep_checkpoints': not a number of checkpoints (1 or more), 'best'"),
        "newest.json": ({"keep_checkpoints": "newest"}, "'keep_checkpoints': not a number of checkpoints"),
        "free.json": ({"min_free": "lots"}, "'min_free': cannot read 'lots' as a size"),
        "zero.json": ({"min_free": 0}, "'min_free' must be a size of free disk space"),
        "glob.json": ({"ckpt_glob": ""}, "'ckpt_glob' must be where its checkpoints are"),
    }
    for name, (fields, _reason) in bad.items():
        _drop(gq, name, {"cmd": ["true"], **fields})
    gq.gpuq("run")
    for name, (_fields, reason) in bad.items():
        assert reason in (gq.home / "rejected" / f"{name}.reason").read_text(), name
    assert gq.files("pending") == [] and gq.files("done") == []


def test_edit_sets_them_as_a_dropped_file_says_them_and_keeps_them_otherwise(gq: Env) -> None:
    """`gpuq edit` changes the keys a dropped file may say: min_free read back to the byte."""
    job_id = gq.add("--hold", "--gpus", "0", "--min-free", "500K", "--keep-checkpoints", "3", "true")
    gq.gpuq("edit", str(job_id), "--set", "retry_oom=2")
    job = gq.job(job_id)
    assert (job["retry_oom"], job["keep_checkpoints"], job["min_free_bytes"]) == (2, 3, 500 << 10)
    gq.gpuq("edit", str(job_id), "--set", "min_free=8G", "--set", "keep_checkpoints=best")
    job = gq.job(job_id)
    assert (job["keep_checkpoints"], job["min_free_bytes"]) == ("best", 8 << 30)
    refused = gq.gpuq("edit", str(job_id), "--set", "min_free=8", check=False)
    assert refused.returncode == 2 and "did you mean min_free=8G?" in refused.stderr
    for value in ("0", "0G", "-5G"):  # no unit to suggest: refused as add refuses them
        refused = gq.gpuq("edit", str(job_id), "--set", f"min_free={value}", check=False)
        assert refused.returncode == 2 and f"{value!r} is not a positive size" in refused.stderr, refused.stderr
    gq.gpuq("edit", str(job_id), "--set", "min_free=null", "--set", "keep_checkpoints=null")
    job = gq.job(job_id)
    assert (job["keep_checkpoints"], job["min_free_bytes"], job["retry_oom"]) == (None, None, 2)
