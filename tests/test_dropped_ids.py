"""Job files moved into pending/ by hand with their gpuq name (from another queue, or a finished
job's file put back): their ids are never given out again, a copy that no crash can have left is
moved to rejected/ with the reason (never deleted), and a crash's leftover copy is still removed."""

from __future__ import annotations

import json
import os
import shutil

from conftest import Env


def _other(gq: Env, count: int) -> Env:
    """A second queue beside this one, with `count` jobs queued."""
    other = Env(gq.work.parent / "other-home", gq.work)
    for n in range(1, count + 1):
        other.add("echo", f"other-{n}")
    return other


def _move_in(other: Env, gq: Env, job_id: int) -> str:
    (name,) = [n for n in other.files("pending") if n.startswith(f"{job_id:06d}-")]
    shutil.move(str(other.home / "pending" / name), str(gq.home / "pending" / name))
    return name


def _outputs(gq: Env) -> dict[int, str]:
    return {int(n[:6]): gq.log(int(n[:6])).splitlines()[-2] for n in gq.files("done")}


def test_a_job_moved_in_from_another_queue_past_the_counter_does_not_give_its_id_out_again(gq: Env) -> None:
    assert gq.add("echo", "mine-1") == 1
    other = _other(gq, 3)
    _move_in(other, gq, 3)
    gq.gpuq("run")  # runs mine-1 and other-3
    added = [gq.add("echo", f"mine-{n}") for n in (2, 3, 4)]
    assert 3 not in added and len(set(added)) == 3, added
    gq.gpuq("run")
    assert gq.files("pending") == [] and gq.files("rejected") == []
    assert _outputs(gq) == {1: "mine-1", 3: "other-3", **{i: f"mine-{n}" for i, n in zip(added, (2, 3, 4))}}


def test_add_passes_an_id_that_a_file_moved_into_pending_holds(gq: Env) -> None:
    """No look at the queue in between: `add` itself passes the ids in pending/ (it failed with
    'File exists' when the names were the same, and two jobs had one id when they were not)."""
    assert gq.add("echo", "mine-1") == 1
    other = _other(gq, 2)
    _move_in(other, gq, 2)
    proc = gq.gpuq("add", "-q", "echo", "mine-2", check=False)
    assert proc.returncode == 0 and proc.stderr == "", proc
    assert int(proc.stdout) == 3
    gq.gpuq("run")
    assert _outputs(gq) == {1: "mine-1", 2: "other-2", 3: "mine-2"}


def test_a_finished_jobs_file_put_back_in_pending_is_rejected_with_the_reason(gq: Env) -> None:
    job_id = gq.add("echo", "once")
    gq.gpuq("run")
    (name,) = gq.files("done")
    shutil.copy(gq.home / "done" / name, gq.home / "pending" / name)  # to run it again
    os.chmod(gq.home / "pending" / name, 0o600)
    proc = gq.gpuq("status")
    assert gq.files("pending") == [] and gq.files("rejected") == [name, name + ".reason"], proc.stdout
    reason = (gq.home / "rejected" / (name + ".reason")).read_text()
    assert reason.startswith(f"job #{job_id} is in done/ already: a copy put back in pending/ is not run again")
    assert "`gpuq add`" in reason and name in proc.stdout
    assert gq.files("done") == [name] and gq.log(job_id).count("=== gpuq: job") == 1


def test_another_job_with_a_finished_jobs_id_is_rejected_and_the_finished_one_kept(gq: Env) -> None:
    """A file of another queue with an id this queue already gave out: whatever its rev, it never
    replaces the job here and is not deleted."""
    gq.add("echo", "mine-1")
    gq.gpuq("run")
    other = _other(gq, 1)
    name = _move_in(other, gq, 1)
    path = gq.home / "pending" / name
    path.write_text(json.dumps(dict(json.loads(path.read_text()), rev=50)))
    gq.gpuq("status")
    assert gq.files("pending") == [] and gq.files("rejected") == [name, name + ".reason"]
    assert "holds an id given out before" in (gq.home / "rejected" / (name + ".reason")).read_text()
    assert _outputs(gq) == {1: "mine-1"}


def test_a_crashs_leftover_pending_copy_is_still_removed(gq: Env) -> None:
    """The pending copy a crash left after the job moved on: written before the copy that replaced
    it, with a lower rev: removed, nothing rejected."""
    gq.add("echo", "once")
    (name,) = gq.files("pending")
    kept = gq.work / "pending-copy.json"
    shutil.copy2(gq.home / "pending" / name, kept)  # its version and time as the pending copy
    gq.gpuq("run")
    shutil.copy2(kept, gq.home / "pending" / name)
    gq.gpuq("status")
    assert gq.files("pending") == [] and gq.files("rejected") == [] and gq.files("done") == [name]


def test_a_dropped_file_with_a_byte_order_mark_is_taken_in(gq: Env) -> None:
    gq.gpuq("status")  # creates the spool
    tmp = gq.work / "bom.json"
    tmp.write_bytes(b"\xef\xbb\xbf" + json.dumps({"cmd": ["echo", "with-bom"]}).encode())
    os.chmod(tmp, 0o600)
    os.rename(tmp, gq.home / "pending" / "bom.json")
    gq.gpuq("run")
    assert gq.files("rejected") == [] and _outputs(gq) == {1: "with-bom"}


def test_a_finished_job_moved_in_raises_the_counter_once_status_lists_it(gq: Env) -> None:
    gq.add("echo", "mine-1")
    other = _other(gq, 3)
    other.gpuq("run")
    (name,) = [n for n in other.files("done") if n.startswith("000003-")]
    shutil.move(str(other.home / "done" / name), str(gq.home / "done" / name))
    gq.gpuq("status", "-a")
    assert gq.add("echo", "mine-2") == 4
