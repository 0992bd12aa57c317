"""The one parser (cli/parser.py, argparse built from cli/options.py's table) reads `add` as a user
types it: every option before SCRIPT is gpuq's, every word from SCRIPT on is the job's, verbatim
(a `--` after SCRIPT included). It replaced a second, hand-written reading of plain `status`,
`add` and `eta` lines (cli/quick.py), whose agreement with argparse this file used to check."""

from __future__ import annotations

import contextlib
import io

import pytest

from gpuq.cli.options import ADD
from gpuq.cli.parser import parse
from gpuq.core.errors import UsageError

EVERY_ADD_OPTION = [
    *(
        "add",
        "-d",
        "/tmp",
        "-p",
        "py",
        "--conda",
        "torch",
        "--name",
        "n",
        "--after",
        "1",
        "--after",
        "2-3",
        "--after-any",
        "4,5",
    ),
    *("--retries", "2", "--sweep", "x=1,2", "--sweep", "y=a", "--yes", "--hold", "--time", "4h", "--begin", "+2h"),
    *("--snapshot", "--gpus", "2", "--notify", "--max-log-size", "1G", "--on-finish", "echo hi", "--gpu-mem", "20G"),
    *("--notify", "ntfy://topic", "--notify=json://host/path"),
    *("--priority", "3", "--urgent", "--preemptible", "--ckpt-glob", "c*", "--no-resume", "--resume-arg", "r={ckpt}"),
    *("--mem", "32G", "--cpus", "8", "--retry-oom", "2", "--keep-checkpoints", "best", "--min-free", "10G"),
    *("-e", "A=1", "--env", "B=2=3", "--quiet", "--dry-run", "--json", "bash", "-c", "exit 0"),
]

JOB_WORDS = [  # a line, and the SCRIPT and ARGS the job gets
    (["add", "-q", "true"], "true", []),
    (["enqueue", "-q", "python", "train.py", "--lr", "3"], "python", ["train.py", "--lr", "3"]),
    (["add", "--", "-q", "x"], "-q", ["x"]),
    (["add", "-q", "--", "true", "--name", "x"], "true", ["--name", "x"]),
    (["add", "true", "--", "x"], "true", ["--", "x"]),
    (["add", "true", "-q", "--x"], "true", ["-q", "--x"]),
    (["add", "-", "x"], "-", ["x"]),
    (["add", "--name=a=b", "--dir=/tmp", "python", "-u", "t.py"], "python", ["-u", "t.py"]),
    (["add", "--urgent=force", "--urgent", "true"], "true", []),
    (["add", "--notify", "python", "train.py"], "python", ["train.py"]),
    # an abbreviation of gpuq's options after SCRIPT, ambiguous (--gpus or --gpu-mem?) or not, is the job's
    (["add", "t.py", "--gpu", "0", "--gpu=1", "--n", "100"], "t.py", ["--gpu", "0", "--gpu=1", "--n", "100"]),
    (["enqueue", "--sweep", "a=1,2", "t.py", "--a", "{a}"], "t.py", ["--a", "{a}"]),
    (
        ["add", "t.py", *("--c", "--d", "--m", "--p", "--r", "--s", "--no", "--pri", "5")],
        "t.py",
        [*("--c", "--d", "--m", "--p", "--r", "--s", "--no", "--pri", "5")],
    ),
]

REFUSED = [
    ["status", "--json", "--watch"],  # mutually exclusive
    ["status", "x"],
    ["status", "--interval", "0"],
    ["add"],
    ["add", "-q"],
    ["add", "--gpus", "x", "true"],
    ["add", "--after", "0", "true"],
    ["add", "-e", "noeq", "true"],
    ["add", "--name", "-x", "true"],
    ["add", "--quiet=1", "true"],
    ["add", "--retries", "2x", "true"],
    ["add", "true", "--after", "1"],  # a scheduling option after SCRIPT (tests/test_first_hour_cli.py)
    ["eta", "0"],
    ["eta", "x"],
    ["eta", "3", "4"],
]


def quietly(argv: list[str]) -> dict:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return vars(parse(list(argv)))


def test_the_whole_add_line_is_read() -> None:
    """Every option of EVERY_ADD_OPTION is read, away from its default."""
    args = quietly(EVERY_ADD_OPTION)
    defaults = {opt.dest: opt.initial() for opt in ADD.options if not opt.positional}
    assert [dest for dest, default in defaults.items() if args[dest] == default] == []
    assert (args["script"], args["args"]) == ("bash", ["-c", "exit 0"])
    assert (args["after"], args["after_any"], args["env"]) == ([1, 2, 3], [4, 5], [("A", "1"), ("B", "2=3")])
    assert (args["notify"], args["notify_url"], args["urgent"]) == (True, ["ntfy://topic", "json://host/path"], True)


@pytest.mark.parametrize("argv, script, words", JOB_WORDS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_the_job_gets_its_words_verbatim(argv: list[str], script: str, words: list[str]) -> None:
    args = quietly(argv)
    assert (args["script"], args["args"]) == (script, words)


def test_plain_status_and_eta_lines() -> None:
    assert quietly(["status", "--interval=0.5", "-a"]) == dict(
        command="status", all=True, json=False, watch=False, interval=0.5, func="cmd_status:cmd_status"
    )
    assert quietly(["eta"])["id"] is None and quietly(["eta", "12"])["id"] == 12


@pytest.mark.parametrize("argv", REFUSED, ids=" ".join)
def test_a_bad_line_is_one_usage_error(argv: list[str]) -> None:
    with pytest.raises(UsageError) as refused:
        quietly(argv)
    assert "\n" not in str(refused.value)


def test_an_abbreviation_before_the_script_is_gpuqs_and_an_ambiguous_one_is_refused() -> None:
    """Before SCRIPT a unique abbreviation is the option it abbreviates; an ambiguous one is refused
    there, naming its matches, and only there: after SCRIPT (or CMD of `lease`) it is the job's."""
    args = quietly(["add", "--pri", "5", "--nam", "x", "t.py", "--pri", "6"])
    assert (args["priority"], args["name"], args["script"], args["args"]) == (5, "x", "t.py", ["--pri", "6"])
    for argv, matches in (
        (["add", "--gpu", "0", "t.py"], "--gpu could match --gpus, --gpu-mem"),
        (["add", "--n", "t.py", "--n"], "--n could match --name, --notify, --notify-url, --no-resume"),
        (["add", "--gpu=0"], "--gpu=0 could match --gpus, --gpu-mem"),
        (["lease", "--g", "1", "--", "nvidia-smi"], "--g could match --gpus, --gpu-mem"),
    ):
        with pytest.raises(UsageError) as refused:
            quietly(argv)
        assert str(refused.value) == f"ambiguous option: {matches} (see `gpuq {argv[0]} --help`)"
        assert refused.value.prefix == f"gpuq {argv[0]}"
    lease = quietly(["lease", "nvidia-smi", "--g", "--gpu", "1", "--no"])
    assert (lease["cmd"], lease["gpus"], lease["no_wait"]) == (["nvidia-smi", "--g", "--gpu", "1", "--no"], None, False)
