"""The assistant skill (issue 12): every command line in it is one gpuq's own parser accepts, the
installed package carries it, and installing it never loses a copy the user changed."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, Env

from gpuq.cli.parser import build_parser
from gpuq.core.errors import UsageError

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

    replaced = gq.gpuq("skill", "install", "--dest", str(dest), "--force").stdout
    assert "yours is now" in replaced and (dest / "gpuq.md.bak").read_text() == mine
    assert installed.read_text().startswith(SKILL.read_text())


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
