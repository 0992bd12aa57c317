"""What a researcher's day needs around the queue (issue 12): the service unit, shell completion,
hooks when a job ends, a live status, and the rough edges a new user hit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, Env, wait_for

# ---- the service ---------------------------------------------------------------------------------


def test_service_install_writes_a_unit_that_keeps_jobs_alive(gq: Env, tmp_path: Path) -> None:
    dest = tmp_path / "units"
    out = gq.gpuq("service", "install", "--dest", str(dest), "--recover").stdout
    unit = (dest / "gpuq.service").read_text()
    assert "run --watch --recover" in unit and "KillMode=process" in unit and "Restart=on-failure" in unit
    assert f"GPUQ_HOME={gq.home}" in unit
    assert "systemctl --user enable --now gpuq.service" in out and "loginctl enable-linger" in out
    again = gq.gpuq("service", "install", "--dest", str(dest), "--recover").stdout
    assert "is already this unit" in again and again.count("enable-linger") == out.count("enable-linger") == 1
    if shutil.which("systemd-analyze"):
        runtime = tmp_path / "runtime"
        runtime.mkdir(mode=0o700)
        env = dict(gq.env, XDG_RUNTIME_DIR=str(runtime))
        check = subprocess.run(
            ["systemd-analyze", "--user", "verify", str(dest / "gpuq.service")], env=env, capture_output=True, text=True
        )
        if "Failed to initialize manager" not in check.stderr:
            assert check.returncode == 0 and check.stdout + check.stderr == "", check.stderr
    removed = gq.gpuq("service", "uninstall", "--dest", str(dest)).stdout
    assert "removed" in removed and not (dest / "gpuq.service").exists()


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="this machine runs systemd")
def test_service_without_systemd_is_refused_in_one_line(gq: Env) -> None:
    proc = gq.gpuq("service", "install", check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("gpuq: a systemd user service is not supported here")
    assert len(proc.stderr.splitlines()) == 1


# ---- completion ----------------------------------------------------------------------------------


def bash_complete(gq: Env, script: Path, words: list[str]) -> list[str]:
    """What bash completes for `words` (the last one being typed), with gpuq's script loaded."""
    line = " ".join(words)
    program = (
        f"source {script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        f"COMP_LINE={line!r}; COMP_POINT={len(line)}\n"
        "_shtab_gpuq\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = dict(gq.env, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    out = subprocess.run(["bash", "-c", program], env=env, capture_output=True, text=True, check=True)
    return [w.strip() for w in out.stdout.split() if w.strip()]


@pytest.mark.skipif(not shutil.which("gpuq", path=os.path.dirname(sys.executable)), reason="no gpuq entry point")
def test_bash_completion_completes_commands_and_job_ids(gq: Env, tmp_path: Path) -> None:
    gq.script("t.py", "")
    ids = [gq.add("t.py") for _ in range(2)]
    script = tmp_path / "gpuq.bash"
    script.write_text(gq.gpuq("completion", "bash").stdout)
    assert "shtab" in script.read_text()  # generated from the parser, not written by hand
    assert {"log", "logs"} <= set(bash_complete(gq, script, ["gpuq", "lo"]))
    assert set(bash_complete(gq, script, ["gpuq", "cancel", ""])) == {str(i) for i in ids}
    assert "--after-any" in bash_complete(gq, script, ["gpuq", "add", "--after-"])


def test_bash_completion_completes_file_names_where_a_path_goes(gq: Env, tmp_path: Path) -> None:
    """`complete -o bashdefault` has no fallback to file names: the script, `-d`, `import`'s file and
    the like are marked as files or directories, or TAB beeps."""
    (tmp_path / "train.py").write_text("")
    (tmp_path / "project").mkdir()
    (tmp_path / "gpuq.bash").write_text(gq.gpuq("completion", "bash").stdout)
    assert gq.gpuq("completion", "bash").stdout.endswith("gpuq\n")  # `>> ~/.bashrc` glues no line to it
    script, base = tmp_path / "gpuq.bash", str(tmp_path)
    train, project = f"{base}/train.py", f"{base}/project"
    assert bash_complete(gq, script, ["gpuq", "add", f"{base}/tr"]) == [train]
    assert bash_complete(gq, script, ["gpuq", "add", "--gpus", "2", f"{base}/tr"]) == [train]
    assert bash_complete(gq, script, ["gpuq", "add", "train.py", "--data", f"{base}/tr"]) == [train]
    assert bash_complete(gq, script, ["gpuq", "add", "-d", f"{base}/pr"]) == [project]
    assert bash_complete(gq, script, ["gpuq", "import", f"{base}/tr"]) == [train]
    assert bash_complete(gq, script, ["gpuq", "lease", f"{base}/tr"]) == [train]
    assert "--gpus" in bash_complete(gq, script, ["gpuq", "add", "--urgent", "--g"])
    assert bash_complete(gq, script, ["gpuq", "add", "train.py", "--g"]) == []  # the script's, add refuses them
    assert bash_complete(gq, script, ["gpuq", "add", "--gpus", "2", "train.py", "--g"]) == []


def test_zsh_completion_is_generated(gq: Env) -> None:
    out = gq.gpuq("completion", "zsh").stdout
    assert out.startswith("#compdef gpuq") and "gpuq _ids" in out


# ---- hooks ---------------------------------------------------------------------------------------

RECORD = "env | grep ^GPUQ_JOB_ | sort > {out}"


def test_on_finish_gets_the_job_and_a_bad_hook_changes_nothing(gq: Env) -> None:
    gq.script("ok.py", "print('fine')\n")
    gq.script("bad.py", "raise SystemExit(3)\n")
    good = gq.add("--on-finish", RECORD.format(out=gq.work / "good.env"), "ok.py")
    failing = gq.add("--on-finish", "echo hook says hi; exit 1", "bad.py")
    hanging = gq.add("--on-finish", "sleep 1000 & sleep 1000", "ok.py")
    after = gq.add("--after", str(hanging), "ok.py")
    gq.env["GPUQ_HOOK_TIMEOUT"] = "1"
    gq.start_worker("--notify")  # no notify-send here: said in the worker log, nothing else changes
    for job_id, state in ((good, "done"), (failing, "failed"), (hanging, "done"), (after, "done")):
        gq.wait_state(job_id, state, timeout=30)
    seen = dict(line.split("=", 1) for line in (gq.work / "good.env").read_text().splitlines())
    assert seen == {
        "GPUQ_JOB_ID": str(good),
        "GPUQ_JOB_NAME": gq.job(good)["name"],
        "GPUQ_JOB_STATE": "done",
        "GPUQ_JOB_EXIT_CODE": "0",
        "GPUQ_JOB_LOG": str(gq.home / "logs" / f"{good:06d}.log"),
    }
    worker_log = wait_for(lambda: _has(gq.home / "logs" / "worker.log", "killed after"), 20, what="the hook log")
    assert f"job #{failing}: on-finish hook: hook says hi" in worker_log
    assert f"job #{failing}: on-finish hook failed: exit 1" in worker_log
    assert f"job #{hanging}: on-finish hook killed after 1s" in worker_log
    wait_for(lambda: not _sleepers(), 15, what="the hanging hook's processes to be gone")


def _has(path: Path, text: str) -> str:
    content = path.read_text() if path.exists() else ""
    return content if text in content else ""


def _sleepers() -> list[str]:
    out = subprocess.run(["pgrep", "-f", "^sleep 1000$"], capture_output=True, text=True)
    return out.stdout.split()


def test_notify_reaches_notify_send(gq: Env, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "notify-send").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "notified"}\n')
    (bin_dir / "notify-send").chmod(0o755)
    gq.env["PATH"] = f"{bin_dir}{os.pathsep}{gq.env['PATH']}"
    gq.script("ok.py", "")
    job_id = gq.add("--notify", "ok.py")
    gq.gpuq("run")
    notified = wait_for(lambda: (tmp_path / "notified").exists() and (tmp_path / "notified").read_text(), 15)
    assert f"job #{job_id} done" in notified


# ---- a live status -------------------------------------------------------------------------------


def test_status_watch_redraws_until_interrupted(gq: Env) -> None:
    gq.script("t.py", "")
    gq.add("t.py")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuq", "status", "--watch", "--interval", "0.2"],
        cwd=gq.work,
        env=gq.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    wait_for(lambda: lines.append(proc.stdout.readline()) or sum("Ctrl-C" in line for line in lines) >= 2, 20)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 130 and err == ""  # as the reference's exit codes say of Ctrl-C
    assert sum("t.py" in line for line in lines) >= 2


# ---- rough edges ---------------------------------------------------------------------------------


def test_a_closed_pipe_is_silent(gq: Env) -> None:
    gq.script("t.py", "")
    for _ in range(3):
        gq.add("t.py")
    for command in ("gpuq status | head -1", "gpuq show 1 | head -1", "gpuq status --json | head -c 10"):
        proc = subprocess.run(
            command.replace("gpuq", f"{sys.executable} -m gpuq"),
            shell=True,
            cwd=gq.work,
            env=dict(gq.env, GPUQ_TEST_PIPE="1"),
            capture_output=True,
            text=True,
            executable="/bin/bash",
        )
        assert proc.stderr == "" and proc.stdout, (command, proc.stderr)


def test_show_keeps_the_inherited_environment_for_when_it_is_asked(gq: Env) -> None:
    gq.script("t.py", "")
    job_id = gq.add("-e", "LR=3e-4", "t.py")
    env = dict(gq.env, SECRET_TOKEN="hunter2")
    shown = subprocess.run([sys.executable, "-m", "gpuq", "show", str(job_id)], env=env, capture_output=True, text=True)
    assert "hunter2" not in shown.stdout and "LR=3e-4" in shown.stdout
    assert f"variables inherited from the shell (`gpuq show {job_id} --env` lists them)" in shown.stdout
    listed = json.loads(gq.gpuq("show", str(job_id), "--env").stdout)
    assert listed["env"] == {"LR": "3e-4"} and listed["shell_env"]["GPUQ_HOME"] == str(gq.home)
    assert isinstance(json.loads(gq.gpuq("show", str(job_id), "--json").stdout)["shell_env"], dict)


def test_run_without_its_dependencies_is_one_line_and_the_job_stays(gq: Env, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = str(bare / "bin" / "python")
    env = dict(gq.env, PYTHONPATH=str(REPO))
    gq.script("t.py", "")
    added = subprocess.run(
        [python, "-m", "gpuq", "add", "-q", "t.py"], cwd=gq.work, env=env, capture_output=True, text=True
    )
    assert added.returncode == 0, added.stderr  # add needs nothing beyond the standard library
    run = subprocess.run([python, "-m", "gpuq", "run"], cwd=gq.work, env=env, capture_output=True, text=True)
    assert run.returncode == 1 and len(run.stderr.splitlines()) == 1 and "Traceback" not in run.stderr
    assert "gpuq run needs psutil, watchdog" in run.stderr and "pip install psutil watchdog" in run.stderr
    assert gq.state_of(int(added.stdout)) == "pending"


def test_a_worker_on_an_empty_queue_prints_no_watchdog_noise(gq: Env) -> None:
    for _ in range(6):
        proc = gq.gpuq("run")
        assert "InotifyEmitter" not in proc.stderr and proc.stderr == "", proc.stderr
