"""The assistant skill (issue 12): every command line in it is one gpuq's own parser accepts and,
run against a real spool and worker, exits as expected (issue 26); the installed package carries
it, and installing it never loses a copy the user changed."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, WAIT_FOR_GO, Env, wait_for
from test_continue import kill_job_and_supervisor
from test_gpu_worker import fake_gpus

from gpuq.cli.parser import build_parser
from gpuq.core.errors import UsageError
from gpuq.run.service import supported as service_supported

SKILL = REPO / "skill" / "gpuq.md"


def command_lines(text: str) -> list[str]:
    """Every `gpuq ...` command in backticks or in a fenced block of the skill."""
    found = re.findall(r"`(gpuq [^`]+)`", text)
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        found += [line.strip() for line in block.splitlines() if line.strip().startswith("gpuq ")]
    return found


def test_every_command_line_in_the_skill_parses() -> None:
    lines = command_lines(SKILL.read_text())
    assert len(lines) >= 30
    parser = build_parser()
    refused = []
    for line in lines:
        argv = shlex.split(line)[1:]
        try:
            if argv and argv[0] in ("add", "enqueue"):
                from gpuq.cli.parser import parse

                parse(argv)
            else:
                parser.parse_args(argv)
        except (UsageError, SystemExit) as exc:
            refused.append(f"{line}: {exc}")
    assert refused == []


def test_the_parser_check_can_fail() -> None:
    with pytest.raises(UsageError):
        build_parser().parse_args(["retry", "--no-such-option", "3"])


def test_skill_format() -> None:
    text = SKILL.read_text()
    front = text.split("---\n")[1]
    assert text.startswith("---\n") and re.search(r"^description: \S", front, re.M)
    assert "$ARGUMENTS" in text
    for phrase in ("看看队列", "show the queue", "先暂停当前任务", "失败的重新跑一下", "把这些任务放到集群上跑"):
        assert phrase in text
    for command in ("--urgent", "gpuq retry", "gpuq kill", "--after-any", "gpuq show", "status --json", "add -q"):
        assert command in text


def test_skill_show_prints_the_shipped_skill(gq: Env) -> None:
    assert gq.gpuq("skill", "show").stdout == SKILL.read_text()


def test_install_keeps_a_changed_copy_and_says_so(gq: Env, tmp_path: Path) -> None:
    dest = tmp_path / "commands"
    first = gq.gpuq("skill", "install", "--dest", str(dest)).stdout
    installed = dest / "gpuq.md"
    assert first.startswith(f"installed {installed}") and installed.read_text().startswith(SKILL.read_text())
    assert "already up to date" in gq.gpuq("skill", "install", "--dest", str(dest)).stdout

    mine = installed.read_text().replace("Rules", "My rules")
    installed.write_text(mine)
    kept = gq.gpuq("skill", "install", "--dest", str(dest)).stdout
    assert kept.startswith(f"kept your changed {installed}") and installed.read_text() == mine
    assert (dest / "gpuq.md.new").read_text().startswith(SKILL.read_text())
    assert sorted(os.listdir(dest)) == ["gpuq.md", "gpuq.md.new"]  # what it said it left

    replaced = gq.gpuq("skill", "install", "--dest", str(dest), "--force").stdout
    assert "yours is now" in replaced and (dest / "gpuq.md.bak").read_text() == mine
    assert installed.read_text().startswith(SKILL.read_text())
    assert sorted(os.listdir(dest)) == ["gpuq.md", "gpuq.md.bak"]  # the earlier .new went with yours


def test_a_new_version_left_beside_goes_once_installed_unless_changed(gq: Env, tmp_path: Path) -> None:
    """You took the new version (copied it over yours): the next install is up to date and removes
    it; one you changed is yours, and stays."""
    dest = tmp_path / "commands"
    installed, beside = dest / "gpuq.md", dest / "gpuq.md.new"
    dest.mkdir()
    installed.write_text("mine\n")
    assert gq.gpuq("skill", "install", "--dest", str(dest)).stdout.startswith("kept your changed")
    installed.write_text(beside.read_text())
    assert "already up to date" in gq.gpuq("skill", "install", "--dest", str(dest)).stdout
    assert sorted(os.listdir(dest)) == ["gpuq.md"]
    installed.write_text("mine\n")
    gq.gpuq("skill", "install", "--dest", str(dest))
    beside.write_text(beside.read_text() + "my note\n")
    gq.gpuq("skill", "install", "--dest", str(dest), "--force")
    assert sorted(os.listdir(dest)) == ["gpuq.md", "gpuq.md.bak", "gpuq.md.new"]


def test_an_unchanged_older_copy_is_updated(gq: Env, tmp_path: Path) -> None:
    from gpuq.system import installs

    installed = tmp_path / "gpuq.md"
    installed.write_text(installs.stamped("an older skill\n"))  # as an older gpuq installed it
    assert gq.gpuq("skill", "install", "--dest", str(tmp_path)).stdout.startswith(f"updated {installed}")
    assert installed.read_text().startswith(SKILL.read_text())


def test_the_built_package_carries_the_skill(tmp_path: Path) -> None:
    """What `pip install .` puts in site-packages, without a checkout beside it."""
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--target", str(target), "."],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    assert (target / "gpuq" / "skill" / "gpuq.md").read_text() == SKILL.read_text()


# ---- every command of the skill, run (issue 26) ----------------------------------------------------

# Run by test_the_skills_slurm_commands_run_on_a_real_cluster, which needs the test Slurm.
ON_SLURM = {"gpuq slurm submit 3 4", "gpuq slurm submit --all", "gpuq slurm sync"}
FAILING = "raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
QUICK = "import sys\nprint('args', sys.argv[1:])\n"


def installed_gpuq() -> list[str]:
    """The `gpuq` that pip installed beside this interpreter (what the assistant types)."""
    script = Path(sys.executable).with_name("gpuq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpuq"]


class Skill:
    """Runs the skill's command lines with its example ids (3, 5, 12, 4242...) replaced by real
    ones; collects every line run, and every answer that was not the expected exit or that
    carried a traceback."""

    def __init__(self, gq: Env) -> None:
        self.gq, self.ran, self.wrong = gq, set(), []

    def __call__(self, line: str, expect: int = 0, **ids: int) -> str:
        words = [str(ids.get(f"_{word}", word)) for word in shlex.split(line)[1:]]  # 3 is given as _3=17
        proc = subprocess.run(
            [*installed_gpuq(), *words], cwd=self.gq.work, env=self.gq.env, capture_output=True, text=True, timeout=60
        )
        self.ran.add(line)
        if proc.returncode != expect or "Traceback" in proc.stderr:
            self.wrong.append(f"gpuq {' '.join(words)}: exit {proc.returncode} (expected {expect})\n{proc.stderr}")
        return proc.stdout

    def serve(self, line: str, **ids: int) -> str:
        """A line that serves until Ctrl-C (`gpuq web`): its first line of output, then Ctrl-C,
        after which it must exit 0."""
        words = [str(ids.get(f"_{word}", word)) for word in shlex.split(line)[1:]]
        proc = subprocess.Popen(
            [*installed_gpuq(), *words],
            cwd=self.gq.work,
            env=self.gq.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
        self.ran.add(line)
        if proc.returncode != 0 or "Traceback" in err or not first:
            self.wrong.append(f"gpuq {' '.join(words)}: exit {proc.returncode}, printed {first!r}\n{err}")
        return first


def running(gq: Env, *job_ids: int) -> bool:
    return all(gq.state_of(i) == "running" and gq.job(i).get("supervisor") for i in job_ids)


def project(gq: Env, tmp_path: Path) -> None:
    """The user's directory: scripts in a git repository (for --snapshot), four fake GPUs, a
    config home of its own (for `service install`)."""
    gq.script("train.py", QUICK)
    gq.script("train.py", QUICK, where=gq.work / "exp05")
    gq.script("eval.py", QUICK)
    gq.script("fail.py", FAILING)
    gq.script("long.py", WAIT_FOR_GO)  # runs until killed: `go` is never written
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=gq.work, check=True)
    subprocess.run([*git, "add", "."], cwd=gq.work, check=True)
    subprocess.run([*git, "commit", "-qm", "scripts"], cwd=gq.work, check=True)
    (tmp_path / "gpus.json").write_text(json.dumps(fake_gpus(4)))
    gq.env.update(GPUQ_FAKE_GPUS=str(tmp_path / "gpus.json"), XDG_CONFIG_HOME=str(tmp_path / "config"))


def test_every_command_of_the_skill_runs(gq: Env, tmp_path: Path) -> None:
    """Each command line of the skill, run through the installed `gpuq` in the order a day could
    bring them, against one spool with jobs in the states the line needs and one worker, the one
    `gpuq run --daemon` starts. The lines that would block run where they return: `gpuq run`
    (foreground) on a queue of short jobs, `log -f` and `wait` on finished jobs."""
    project(gq, tmp_path)
    run = Skill(gq)
    sleeper = subprocess.Popen(["sleep", "300"], cwd=gq.work, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        # no worker yet
        run("gpuq status")
        run("gpuq import")
        run("gpuq lease --no-wait -- python3 train.py")  # four free GPUs: it runs at once
        run("gpuq rejected --json")
        failed = [gq.add("fail.py") for _ in range(3)]
        done = [gq.add("train.py") for _ in range(2)]
        run("gpuq run")  # in the foreground: runs the five, then exits
        assert [gq.state_of(i) for i in failed + done] == ["failed"] * 3 + ["done"] * 2
        failures = [row["id"] for row in json.loads(run("gpuq status -a --json")) if row["state"] == "failed"]
        assert failures == failed
        run("gpuq history --since 7d --by dir")
        run("gpuq history 3", _3=failed[0])
        run("gpuq show 3", _3=failed[0])
        run("gpuq show --json 3", _3=failed[0])
        run("gpuq triage 3 --json", _3=failed[0])
        run("gpuq log 3 -n 50", _3=failed[0])
        run("gpuq log 3 -f", _3=done[0])
        run("gpuq wait 3 4", _3=done[0], _4=done[1])
        run("gpuq retry --from-scratch 3", _3=failed[0])
        run("gpuq retry 3 5", _3=failed[1], _5=failed[2])
        train = int(run("gpuq add -q train.py"))
        for line in ("gpuq add -q --after 12 eval.py", "gpuq add -q --after-any 12 eval.py"):
            run(line, _12=train)
        run("gpuq add -q --after 12 eval.py --split test", _12=train)
        for line in ("gpuq hold 5", "gpuq release 5", "gpuq edit 5 --set priority=5"):
            run(line, _5=train)

        # the worker, and jobs that run until they are stopped
        run("gpuq run --daemon")
        longs = [gq.add("long.py") for _ in range(4)]
        wait_for(lambda: running(gq, *longs), 30, what="four long jobs running")
        run("gpuq adopt 4242 --name exp05/train", _4242=sleeper.pid)
        for line in ("gpuq status", "gpuq eta", "gpuq gpus --json", "gpuq status --json", "gpuq top --once"):
            run(line)
        assert run.serve("gpuq web").startswith("http://127.0.0.1:")
        run("gpuq eta 3", _3=longs[0])
        run("gpuq preempt 3", _3=longs[0])
        run("gpuq resume 3", _3=longs[0])
        run("gpuq kill 3", _3=longs[1])
        run("gpuq cancel 3", _3=longs[2])
        kill_job_and_supervisor(gq, longs[3])  # a reboot, as far as this job can tell
        wait_for(lambda: gq.gpuq("status") and gq.state_of(longs[3]) == "interrupted", 15, what="it to be interrupted")
        for line in ("gpuq recover", "gpuq recover --all --from-scratch", "gpuq recover --all"):
            run(line)
        for line in [
            "gpuq add -q --dir exp05 train.py",
            "gpuq add --urgent eval.py",
            "gpuq add -q --gpus 2 train.py",
            "gpuq add -q --gpu-mem 20G train.py",
            "gpuq add -q --mem 32G --cpus 8 train.py",
            "gpuq add -q --gpu-mem 20G --retry-oom 2 train.py",
            "gpuq add -q --keep-checkpoints 2 train.py --output_dir out",
            "gpuq add -q --sweep lr=1e-4,3e-4 train.py --lr {lr}",
            "gpuq add --dry-run --json --sweep lr=1e-4,3e-4 train.py --lr {lr}",
            "gpuq add -q --time 4h train.py",
            "gpuq add -q --begin 02:00 train.py",
            "gpuq add -q --snapshot train.py",
        ]:
            run(line)
        run("gpuq add -q --notify ntfy://TOPIC train.py", **{"_ntfy://TOPIC": "json://127.0.0.1:9/x"})  # not ntfy.sh
        systemd = service_supported() is None  # else the one-line refusal, exit 1
        run("gpuq service install", expect=0 if systemd else 1)
        run("gpuq service install --web", expect=0 if systemd else 1)
        assert (tmp_path / "config" / "systemd" / "user" / "gpuq.service").exists() == systemd
        run("gpuq stop --drain")
        run("gpuq stop --kill-jobs")
        run("gpuq clear")
        run("gpuq status")
    finally:
        gq.gpuq("stop", "--kill-jobs", check=False)
        sleeper.kill()
        sleeper.wait()
    assert run.wrong == []
    assert set(command_lines(SKILL.read_text())) - ON_SLURM == run.ran


def test_the_skills_slurm_commands_run_on_a_real_cluster(gq: Env, slurm: Any) -> None:
    gq.env["SLURM_CONF"] = slurm.env["SLURM_CONF"]
    run = Skill(gq)
    jobs = [gq.add("--gpus", "0", "--", "sh", "-c", "echo on slurm") for _ in range(3)]
    run("gpuq slurm submit 3 4", _3=jobs[0], _4=jobs[1])
    run("gpuq slurm submit --all")
    run("gpuq slurm sync")
    assert run.wrong == [] and run.ran == ON_SLURM
    assert gq.files("pending") == [] and len(gq.files("slurm")) + len(gq.files("done")) == 3
