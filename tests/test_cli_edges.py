"""The command line at its edges (issue 39, items 2, 3 and 10): a `--dry-run` after the script, a
dry run that admits host memory and CPUs as the worker does, and input that used to pass silently
or surprise. Each on the real CLI, in a subprocess, with real workers."""

from __future__ import annotations

from conftest import Env, wait_for

# ---- `--dry-run` after the script ------------------------------------------------------------


def test_a_dry_run_after_the_script_is_refused_and_nothing_runs(gq: Env) -> None:
    gq.script("eval.py", "open('ran', 'w').write('yes')\n")
    gq.start_worker("--watch")
    wait_for(lambda: "worker: running" in gq.gpuq("status").stdout, what="the worker to register")
    proc = gq.gpuq("add", "--gpu-mem", "20G", "eval.py", "--dry-run", check=False)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "gpuq add: --dry-run comes after the script, so eval.py would get it and the job would be queued and run "
        "for real; put it before the script: gpuq add --gpu-mem 20G --dry-run eval.py (or `--` before the script "
        "to pass it to eval.py)\n"
    )
    with_json = gq.gpuq("add", "eval.py", "--dry-run", "--json", check=False)  # --json goes with it
    assert with_json.returncode == 2 and "put them before the script: gpuq add --dry-run --json eval.py" in (
        with_json.stderr
    )
    assert gq.status_json() == [] and not (gq.work / "ran").exists()
    passed = gq.gpuq("add", "-q", "--", "eval.py", "--dry-run")  # `--`: the script gets it
    assert gq.job(int(passed.stdout))["cmd"][-2:] == ["eval.py", "--dry-run"]
