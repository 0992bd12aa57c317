"""cli/quick.py reads plain `status`, `add` and `eta` command lines without argparse: whatever it reads, it
must read exactly as parser.py does, and whatever it cannot, it must leave to parser.py (None)."""

from __future__ import annotations

import contextlib
import io

import pytest

from gpuq.cli import quick
from gpuq.cli.parser import _add_parser, _commands, build_parser, parse

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
    *("--mem", "32G", "--cpus", "8"),
    *("-e", "A=1", "--env", "B=2=3", "--quiet", "--dry-run", "--json", "bash", "-c", "exit 0"),
]

SAME = [
    ["status"],
    ["status", "-a"],
    ["status", "--all", "--json"],
    ["status", "--watch", "--interval", "5"],
    ["status", "--interval=0.5", "-a"],
    ["add", "-q", "true"],
    ["add", "true"],
    ["enqueue", "-q", "python", "train.py", "--lr", "3"],
    EVERY_ADD_OPTION,
    ["add", "--name=a=b", "--dir=/tmp", "true"],
    ["add", "--", "-q", "x"],
    ["add", "-q", "--", "true", "--name", "x"],
    ["add", "--name", "", "true"],
    ["add", "true", "-q", "--x"],
    ["add", "--retries", " 3", "--gpus", "0", "true"],
    ["add", "--name", "last", "--name", "wins", "--after", "3", "--after", "3", "true"],
    ["add", "--urgent=force", "true"],
    ["add", "--urgent=force", "--urgent", "true"],
    ["add", "--notify", "python", "train.py"],
    ["add", "--notify", "ntfy://t", "--notify", "python", "train.py"],
    ["eta"],
    ["eta", "12"],
]

LEFT_TO_ARGPARSE = [
    ["status", "--json", "--watch"],  # mutually exclusive
    ["status", "x"],
    ["status", "-h"],
    ["status", "--interval", "0"],
    ["status", "--al"],  # an abbreviation
    ["add", "-q", "true", "--name", "x"],  # a misplaced option: parser.py notes it
    ["add", "true", "--help=1"],
    ["add", "--retries", "-1", "true"],
    ["add", "--pri", "2", "true"],
    ["add", "-qd", "x", "true"],
    ["add"],
    ["add", "-q"],
    ["add", "--gpus", "x", "true"],
    ["add", "--after", "0", "true"],
    ["add", "-e", "noeq", "true"],
    ["add", "--name", "-x", "true"],
    ["add", "--resume-arg", "--resume {ckpt}", "true"],
    ["add", "-", "x"],
    ["add", "-h"],
    ["add", "--quiet=1", "true"],
    ["add", "--retries", "2x", "true"],
    ["add", "-dx", "true"],
    ["cancel", "3"],
    ["--version"],
    ["eta", "0"],
    ["eta", "x"],
    ["eta", "-1"],
    ["eta", "-h"],
    ["eta", "--", "3"],
    ["eta", "3", "4"],
]


def full(argv: list[str]) -> dict:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return vars(parse(list(argv)))


@pytest.mark.parametrize("argv", SAME, ids=" ".join)
def test_quick_reads_as_argparse_does(argv: list[str]) -> None:
    args = quick.parse(list(argv))
    assert args is not None, "the quick reading should take this plain command line"
    assert vars(args) == full(argv)


@pytest.mark.parametrize("argv", LEFT_TO_ARGPARSE, ids=" ".join)
def test_quick_leaves_the_rest_to_argparse(argv: list[str]) -> None:
    assert quick.parse(list(argv)) is None


def test_every_add_and_status_option_is_known() -> None:
    """A new option in parser.py must be taught to quick.py (else plain lines would lack its default)."""
    add, status = _add_parser(build_parser()), _commands(build_parser())["status"]
    add_options = {s for a in add._actions for s in a.option_strings} - {"-h", "--help"}
    assert add_options == set(quick.ADD_FLAGS) | set(quick.ADD_VALUES)
    status_options = {s for a in status._actions for s in a.option_strings} - {"-h", "--help"}
    assert status_options == set(quick.STATUS_FLAGS) | set(quick.STATUS_VALUES)
    assert {a.dest for a in add._actions} - {"help", "script", "args"} == set(quick.ADD_DEFAULTS)
    eta = _commands(build_parser())["eta"]
    assert {a.dest for a in eta._actions} - {"help"} == {quick.ETA_ID.dest}


def test_the_whole_add_line_is_read() -> None:
    """Every option of EVERY_ADD_OPTION is away from its default: the comparison above saw them all."""
    args = vars(quick.parse(list(EVERY_ADD_OPTION)))
    assert all(args[dest] != default for dest, default in quick.ADD_DEFAULTS.items())
