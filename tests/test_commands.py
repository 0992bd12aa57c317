"""Everyday commands (cancel, kill, retry, clear, status, log, show) and hand-dropped job files."""

from __future__ import annotations

import json
import os
import time

from conftest import Env, alive, wait_for

from gpuq.spool import Spool


def test_cancel_pending_and_refuse_an_unknown_id(gq: Env) -> None:
    gq.script("t.py", "")
    job_id = gq.add("t.py")
    assert "cancelled" in gq.gpuq("cancel", str(job_id)).stdout
    assert gq.state_of(job_id) == "cancelled"
    proc = gq.gpuq("cancel", "99", check=False)
    assert proc.returncode == 1 and proc.stderr.strip() == "gpuq: no such job #99"


def test_kill_stops_the_whole_process_group(gq: Env) -> None:
    child_pid = gq.work / "child.pid"
    gq.script(
        "parent.py",
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(child_pid)!r}, 'w').write(str(c.pid))\n"
        "time.sleep(120)\n",
    )
    job_id = gq.add("parent.py")
    gq.start_worker("--watch")
    wait_for(lambda: child_pid.exists() and child_pid.read_text(), what="child started")  # its pid in it
    out = gq.gpuq("kill", str(job_id)).stdout
    assert "killed" in out
    job = gq.job(job_id)
    assert job["state"] == "cancelled" and job["exit_code"] == 143 and job["signal"] == "SIGTERM"
    child = int(child_pid.read_text())
    wait_for(lambda: not alive(child), what="grandchild gone")


def test_kill_escalates_to_sigkill_after_grace(gq: Env) -> None:
    ready = gq.work / "ready"
    gq.script(
        "stubborn.py",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"open({str(ready)!r}, 'w').close()\ntime.sleep(120)\n",
    )
    job_id = gq.add("stubborn.py")
    gq.start_worker("--watch")
    wait_for(ready.exists, what="job ready")
    gq.gpuq("kill", str(job_id), timeout=60)
    job = gq.job(job_id)
    assert job["state"] == "cancelled" and job["signal"] == "SIGKILL" and job["exit_code"] == 137


def test_clear_keeps_what_held_and_interrupted_jobs_depend_on(gq: Env) -> None:
    """Not only a pending job is queued again: one held, interrupted (any unfinished) keeps its
    dependencies, or `gpuq release` would leave it blocked on "no such job"."""
    gq.script("ok.py", "")
    first, second, third = gq.add("ok.py"), gq.add("ok.py"), gq.add("ok.py")
    gq.gpuq("run")
    held = gq.add("--hold", "--after", str(first), "ok.py")
    gq.add("--hold", "--after-any", str(second), "ok.py")
    stopped = gq.add("--after", str(third), "ok.py")
    spool = Spool(gq.home)
    ref = spool.jobs.find(stopped)
    assert ref is not None
    spool.jobs.move(ref, spool.jobs.load(ref), "interrupted", {"note": "its machine went down"})
    out = gq.gpuq("clear", "-y").stdout
    assert f"kept (waiting jobs depend on them): #{first}, #{second}, #{third}" in out.splitlines(), out
    assert [gq.state_of(i) for i in (first, second, third)] == ["done"] * 3
    gq.gpuq("release", str(held), str(held + 1))
    gq.gpuq("run")
    assert gq.state_of(held) == gq.state_of(held + 1) == "done"


def test_retry_puts_failed_job_back_and_it_runs(gq: Env) -> None:
    flag = gq.work / "fixed"
    gq.script("t.py", f"import os, sys; sys.exit(0 if os.path.exists({str(flag)!r}) else 4)\n")
    job_id = gq.add("t.py")
    gq.gpuq("run")
    assert gq.state_of(job_id) == "failed"
    flag.touch()
    assert "back in the queue" in gq.gpuq("retry", str(job_id)).stdout
    assert gq.state_of(job_id) == "pending"
    gq.gpuq("run")
    job = gq.job(job_id)
    assert job["state"] == "done" and [h["exit_code"] for h in job["history"]] == [4, 0]
    assert gq.gpuq("retry", str(job_id), check=False).returncode == 1  # done jobs are not retried


def test_clear_removes_finished_keeps_interrupted_and_needed(gq: Env) -> None:
    gq.script("ok.py", "")
    gq.script("bad.py", "raise SystemExit(2)\n")
    done = gq.add("ok.py")
    failed = gq.add("bad.py")
    gq.gpuq("run")
    cancelled = gq.add("ok.py")
    gq.gpuq("cancel", str(cancelled))
    needed = gq.add("ok.py")
    gq.gpuq("run")
    waiting = gq.add("--after", str(needed), "--after", str(failed), "ok.py")
    out = gq.gpuq("clear").stdout
    assert "removed 2 finished jobs" in out
    assert out.splitlines()[1] == f"kept (waiting jobs depend on them): #{failed}, #{needed}"
    assert gq.state_of(done) is None and gq.state_of(cancelled) is None
    assert gq.state_of(needed) == "done" and gq.state_of(waiting) == "pending"
    assert gq.state_of(failed) == "failed"  # the waiting job names it: kept so the reason stays visible
    assert not (gq.home / "logs" / f"{done:06d}.log").exists()


def test_status_json_and_table(gq: Env) -> None:
    gq.script("ok.py", "print('hello')\n")
    first = gq.add("ok.py")
    gq.gpuq("run")
    second = gq.add("--after", str(first), "--name", "名前-emoji🚀", "ok.py")
    rows = gq.status_json()
    assert [r["id"] for r in rows] == [second, first]
    for key in ("id", "name", "state", "pid", "exit_code", "after", "progress", "eta_seconds"):
        assert key in rows[0]
    assert rows[1]["state"] == "done" and rows[1]["exit_code"] == 0
    assert rows[0]["after"] == [first]
    lines = gq.gpuq("status").stdout.splitlines()
    assert lines[0].startswith("worker: none running") and "1 pending job will not start" in lines[0]
    header, _rule, *body = lines[1:]
    from gpuq.cli.render import width

    info_col = width(header.split("Info")[0])
    for line in body:  # the Info column starts at the same terminal column on every row
        assert width(line[: len(line) - len(line.lstrip())]) >= 0
        prefix = line.split("exit=")[0] if "exit=" in line else line.split("after")[0]
        assert width(prefix) == info_col, (line, header)


def test_log_and_show(gq: Env) -> None:
    gq.script("many.py", "for i in range(100): print('line', i)\n")
    job_id = gq.add("many.py")
    gq.gpuq("run")
    out = gq.gpuq("log", str(job_id), "-n", "3").stdout.splitlines()
    assert out[0] == "line 98" and out[1] == "line 99" and out[2].startswith("=== gpuq: exit 0")
    assert gq.gpuq("logs", str(job_id), "-n", "1").stdout.startswith("=== gpuq: exit 0")
    shown = json.loads(gq.gpuq("show", "--json", str(job_id)).stdout)
    assert shown["state"] == "done" and shown["id"] == job_id


def test_log_follow_ends_with_the_job(gq: Env) -> None:
    gq.script(
        "slowprint.py", "import time\nfor i in range(5):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n"
    )
    job_id = gq.add("slowprint.py")
    gq.start_worker("--watch")
    gq.wait_state(job_id, "running")
    out = gq.gpuq("log", str(job_id), "-f", timeout=30).stdout
    assert "tick 4" in out and "exit 0" in out


def test_help_is_complete(gq: Env) -> None:
    top = gq.gpuq("--help").stdout
    for command in (
        "add",
        "enqueue",
        "run",
        "stop",
        "status",
        "log",
        "show",
        "cancel",
        "kill",
        "retry",
        "clear",
        "recover",
        "demo",
    ):
        assert command in top
        assert gq.gpuq(command, "--help").returncode == 0
    proc = gq.gpuq("frobnicate", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


# ---- hand-dropped files -------------------------------------------------------------------------
def _drop(gq: Env, name: str, content: str) -> None:
    (gq.home / "pending").mkdir(parents=True, exist_ok=True)
    tmp = gq.work / f".{name}.tmp"
    tmp.write_text(content)
    os.chmod(tmp, 0o600)
    os.rename(tmp, gq.home / "pending" / name)


def test_hand_dropped_minimal_files_are_taken_in_and_run(gq: Env) -> None:
    gq.gpuq("status")  # creates the spool
    out1, out2 = gq.work / "o1", gq.work / "o2"
    _drop(gq, "a.json", json.dumps({"cmd": ["sh", "-c", f"echo list > {out1}"], "cwd": str(gq.work)}))
    _drop(gq, "b.json", json.dumps({"cmd": f"sh -c 'echo string > {out2}'", "name": "mine", "after": [1]}))
    gq.gpuq("run")
    assert out1.read_text() == "list\n" and out2.read_text() == "string\n"
    done = gq.files("done")
    assert done[0].startswith("000001-work-sh") and done[1] == "000002-mine.json"
    assert gq.job(2)["after"] == [1] and gq.job(2)["cwd"] == os.path.expanduser("~")


def test_invalid_dropped_files_are_rejected_with_reason(gq: Env) -> None:
    gq.gpuq("status")
    _drop(gq, "nocmd.json", json.dumps({"name": "x"}))
    _drop(gq, "badjson.json", "{not json")
    _drop(gq, "afterghost.json", json.dumps({"cmd": ["true"], "after": [42]}))
    _drop(gq, "notes.txt", "left alone")
    _drop(gq, ".hidden.json", "{")
    os.utime(gq.home / "pending" / "badjson.json", (time.time() - 60, time.time() - 60))
    gq.gpuq("run")
    rejected = gq.files("rejected")
    assert {"nocmd.json", "badjson.json", "afterghost.json"} <= set(rejected)
    assert "missing 'cmd'" in (gq.home / "rejected" / "nocmd.json.reason").read_text()
    assert "not valid JSON" in (gq.home / "rejected" / "badjson.json.reason").read_text()
    assert "no such job #42" in (gq.home / "rejected" / "afterghost.json.reason").read_text()
    assert sorted(os.listdir(gq.home / "pending")) == [".hidden.json", "notes.txt"]


def test_slowly_written_dropped_file_is_not_rejected(gq: Env) -> None:
    gq.gpuq("status")
    gq.start_worker("--watch")
    out = gq.work / "slow-out"
    path = gq.home / "pending" / "slow.json"
    text = json.dumps({"cmd": ["sh", "-c", f"echo slow > {out}"]})
    with open(path, "w") as fh:  # like `cat > pending/slow.json` typed by hand
        fh.write(text[:10])
        fh.flush()
        # The typist pauses past GPUQ_INTAKE_QUIET (0.3 s in tests) while the worker looks: it took
        # in two files dropped one after the other since, named after this one (a pass goes by
        # name), so a look that began after the quiet period found this file half-written.
        quiet = float(gq.env["GPUQ_INTAKE_QUIET"])
        wait_for(lambda: time.time() - path.stat().st_mtime > quiet, what="the quiet period to pass")
        for n in range(2):
            marker = gq.home / "pending" / f"zz-marker{n}.json"
            marker.write_text(json.dumps({"cmd": ["true"]}))
            wait_for(lambda: not marker.exists(), timeout=30, what="the worker to take in a file dropped since")  # noqa: B023
        assert path.exists() and gq.files("rejected") == []  # seen half-written, and left to its writer
        fh.write(text[10:])
    wait_for(out.exists, timeout=30, what="slow job to run")
    assert gq.files("rejected") == []


def test_ids_are_never_given_out_twice_even_after_clear_and_a_lost_counter(gq: Env) -> None:
    gq.script("t.py", "")
    first = [gq.add("t.py") for _ in range(3)]
    gq.gpuq("cancel", *map(str, first))
    assert "removed 3 finished jobs" in gq.gpuq("clear").stdout
    (gq.home / "next_id").unlink()  # lost: the tree holds no job to rebuild it from
    assert gq.add("t.py") == first[-1] + 1


def test_add_echoes_after_any_as_status_says_it(gq: Env) -> None:
    """`add --after-any N` echoes `after-any #N`, apart from `--after`'s `after #N` (docs/everyday.md),
    also with --hold."""
    first = gq.add("true")
    said = gq.gpuq("add", "--after-any", str(first), "true").stdout.strip()
    assert said == f"[+] Job #{first + 1}: {gq.work.name}/true  after-any #{first}", said
    both = gq.gpuq("add", "--hold", "--after", str(first), "--after-any", str(first + 1), "true").stdout.strip()
    assert both.endswith(f"  after #{first}, after-any #{first + 1}  (held)"), both
