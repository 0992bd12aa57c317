"""The command line as a new user meets it (issue 26): the original gpuq's `add eval.py --after 1`
refused rather than run too early, `--time`'s bare number read as minutes, and shell completion
that offers only the ids a command takes."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import Env, spool_with_true_jobs
from test_day import bash_complete

from gpuq.cli.options import ADD
from gpuq.cli.parser import parse
from gpuq.core.errors import UsageError
from gpuq.core.states import (
    CANCELLED,
    DONE,
    FAILED,
    HELD,
    INTERRUPTED,
    PENDING,
    PREEMPTED,
    RAY,
    RUNNING,
    SLURM,
    STATES,
)

# ---- gpuq's scheduling options after the script ----------------------------------------------

SAMPLE = {"after": "1,2", "after_any": "1", "time": "2", "begin": "+2h", "priority": "3"}  # by dest


def late_spellings() -> list[list[str]]:
    """Every dependency or scheduling option of the table as it may follow the script: `--after 1,2`
    and `--after=1,2` for one that takes a value, the flag alone for one that does not."""
    out = []
    for opt in ADD.options:
        if opt.before_script:
            for flag in opt.flags:
                value = SAMPLE[opt.dest] if opt.takes_value else None
                out += [[flag, value], [f"{flag}={value}"]] if value else [[flag]]
    return out


@pytest.mark.parametrize("command", ADD.names)
def test_every_scheduling_option_after_the_script_is_refused(command: str) -> None:
    spellings = late_spellings()
    assert {"--after", "--after-any", "--begin", "--hold", "--urgent", "--priority", "--time"} <= {
        words[0].split("=")[0] for words in spellings
    }
    for words in spellings:
        line = [command, "-q", "eval.py", "--lr", "3", *words]
        with pytest.raises(UsageError) as refused:
            parse(list(line))
        message = f"{refused.value.prefix}: {refused.value}"
        assert message.startswith(f"gpuq {command}: {' '.join(words)} comes after the script, so eval.py"), message
        assert f"gpuq {command} -q {' '.join(words)} eval.py --lr 3 (or `--` before" in message, message
        assert "\n" not in message
    with pytest.raises(UsageError, match=r"^--after 1, --time 2h come after the script.*: gpuq \w+ --after 1 --time"):
        parse([command, "eval.py", "--after", "1", "--time", "2h"])


def test_add_help_names_every_option_refused_after_the_script() -> None:
    named = {flag.split("=")[0] for opt in ADD.options if opt.before_script for flag in opt.flags}
    assert [flag for flag in named if f"{flag}," not in ADD.description and f"{flag})" not in ADD.description] == []


def test_after_the_script_is_refused_and_nothing_is_queued(gq: Env) -> None:
    gq.script("eval.py", "")
    proc = gq.gpuq("add", "eval.py", "--after", "1", check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "gpuq add: --after 1 comes after the script, so eval.py would get it and the job would start without "
        "waiting; put it before the script: gpuq add --after 1 eval.py (or `--` before the script to pass it "
        "to eval.py)\n"
    )
    assert not gq.home.exists() or gq.files(PENDING) == []


def test_after_a_double_dash_the_script_gets_them_and_other_options_get_a_note(gq: Env) -> None:
    gq.script("eval.py", "")
    passed = gq.gpuq("add", "-q", "--", "eval.py", "--after", "1")
    assert passed.stderr == ""
    job = gq.job(int(passed.stdout))
    assert job["cmd"][-3:] == ["eval.py", "--after", "1"] and job["after"] == []
    noted = gq.gpuq("add", "-q", "eval.py", "--name", "x")  # not a scheduling option: queued, with a note
    assert "note: --name comes after the script, so eval.py gets it" in noted.stderr
    assert "(gpuq add -q --name x eval.py ...)" in noted.stderr
    job = gq.job(int(noted.stdout))
    assert job["cmd"][-2:] == ["--name", "x"] and job["name"] != "x"


def test_time_2_is_two_minutes_and_the_help_says_so(gq: Env) -> None:
    gq.script("t.py", "")
    assert gq.job(gq.add("--time", "2", "t.py"))["time_limit"] == 120
    help_text = " ".join(gq.gpuq("add", "--help", env=dict(gq.env, COLUMNS="400")).stdout.split())
    assert "a bare number is minutes, as in Slurm (--time 2: two minutes)" in help_text
    assert "+2h or +1h30m (from now; a unit is needed)" in help_text


# ---- completion: the ids a command takes -------------------------------------------------------

ONE_OF_EACH = (PENDING, RUNNING, DONE, FAILED, PREEMPTED, INTERRUPTED, CANCELLED, HELD, SLURM, RAY)  # ids 1-10


def _id(*states: str) -> set[str]:
    return {str(ONE_OF_EACH.index(state) + 1) for state in states}


OFFERED = {  # what TAB offers after each command: the jobs it acts on
    ("kill",): _id(RUNNING),
    ("preempt",): _id(RUNNING),
    ("cancel",): _id(PENDING, RUNNING, PREEMPTED, INTERRUPTED, HELD, SLURM, RAY),
    ("retry",): _id(FAILED, CANCELLED),
    ("hold",): _id(PENDING),
    ("release",): _id(HELD),
    ("edit",): _id(PENDING, HELD),
    ("resume",): _id(PREEMPTED, INTERRUPTED),
    ("recover", "--jobs"): _id(INTERRUPTED),
    ("eta",): _id(PENDING, RUNNING),
    ("wait",): _id(PENDING, RUNNING, SLURM, RAY),
    ("slurm", "submit"): _id(PENDING),
    ("ray", "submit"): _id(PENDING),
    ("log",): _id(*STATES),
    ("show",): _id(*STATES),
}


@pytest.fixture
def one_job_in_each_state(gq: Env, tmp_path: Path) -> Env:
    """The gq spool with job 1 pending, 2 running, ... 9 on Slurm, 10 on Ray (ONE_OF_EACH): moved there
    through the spool's own code, as the commands move them; completion reads only their names."""
    spool, jobs = spool_with_true_jobs(tmp_path, len(ONE_OF_EACH))
    assert spool.home == str(gq.home)
    for (ref, job), state in zip(jobs, ONE_OF_EACH):
        if state != PENDING:
            spool.jobs.move(ref, job, state, {})
    return gq


@pytest.mark.skipif(not shutil.which("gpuq", path=os.path.dirname(sys.executable)), reason="no gpuq entry point")
def test_bash_completion_offers_only_the_ids_each_command_takes(one_job_in_each_state: Env, tmp_path: Path) -> None:
    gq = one_job_in_each_state
    script = tmp_path / "gpuq.bash"
    script.write_text(gq.gpuq("completion", "bash").stdout)
    assert "gpuq _ids --state running 2>/dev/null" in script.read_text()
    for words, ids in OFFERED.items():
        assert set(bash_complete(gq, script, ["gpuq", *words, ""])) == ids, words


def test_ids_lists_the_jobs_of_the_states_asked(one_job_in_each_state: Env) -> None:
    gq = one_job_in_each_state
    assert gq.gpuq("_ids").stdout.split() == [str(i) for i in range(1, len(ONE_OF_EACH) + 1)]
    assert gq.gpuq("_ids", "--state", "failed,cancelled").stdout.split() == ["4", "7"]
    assert gq.gpuq("_ids", "--state", "nope", check=False).returncode == 2


def test_zsh_completion_asks_for_each_commands_ids(gq: Env) -> None:
    out = gq.gpuq("completion", "zsh").stdout
    assert "$(gpuq _ids --state failed,cancelled 2>/dev/null)" in out
    assert "$(gpuq _ids --state preempted,interrupted 2>/dev/null)" in out
