"""The manual cannot drift from the code: its command reference is what the command line prints,
every block of example output is either printed again by a test or marked as an illustration, and
CHANGELOG.md's newest version is what `gpuq --version` says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "docs"))

import gen_reference  # noqa: E402  (docs/ is no package: its script is imported from its folder)


def test_the_command_reference_is_what_the_command_line_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # the page fixes its own width, whatever the terminal's
    written = gen_reference.PAGE.read_text()
    assert written == gen_reference.page(), "docs/reference/commands.md is stale: run python docs/gen_reference.py"


def test_an_option_added_without_its_page_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: an option added to the table changes the page."""
    from gpuq.cli import commands
    from gpuq.cli.options import FLAG, Opt

    status = next(c for c in commands.COMMANDS if c.names[0] == "status")
    monkeypatch.setattr(status, "options", (*status.options, Opt("--brand-new", kind=FLAG, help="a new option")))
    page = gen_reference.page()
    assert "--brand-new" in page and page != gen_reference.PAGE.read_text()


def test_every_command_has_its_section() -> None:
    from gpuq.cli.commands import COMMANDS

    page = gen_reference.PAGE.read_text()
    listed = [c.names[0] for c in COMMANDS if c.help is not None]
    assert listed and all(f"\n## gpuq {name}\n" in page for name in listed)


def test_the_changelog_names_the_version_gpuq_prints() -> None:
    newest = re.search(r"^## \[(\d+\.\d+\.\d+)\]", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert newest is not None, "CHANGELOG.md has no released version"
    printed = subprocess.run([sys.executable, "-m", "gpuq", "--version"], capture_output=True, text=True, cwd=REPO)
    assert printed.stdout.strip() == f"gpuq {newest.group(1)}"


PAGES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md") if p != gen_reference.PAGE)]
ILLUSTRATION = "<!-- output: illustration, copied from a real session -->"
DEMO = "<!-- output: gpuq demo -->"


def output_blocks(text: str) -> list[tuple[str, str]]:
    """(the marker line before it, the block's text) of each fenced block without a language:
    output, as opposed to ```sh commands or ```json files."""
    found, lines, at = [], text.splitlines(), 0
    while at < len(lines):
        if lines[at] == "```":
            end = lines.index("```", at + 1)
            before = next((line for line in reversed(lines[:at]) if line.strip()), "")
            found.append((before, "\n".join(lines[at + 1 : end])))
            at = end
        elif lines[at].startswith("```"):
            at = lines.index("```", at + 1)
        at += 1
    return found


def test_every_output_block_is_printed_by_a_test_or_marked_as_an_illustration() -> None:
    unmarked = [
        f"{page.relative_to(REPO)}: {block.splitlines()[0] if block else ''}"
        for page in PAGES
        for before, block in output_blocks(page.read_text())
        if before not in (ILLUSTRATION, DEMO)
    ]
    assert unmarked == []


def test_the_check_sees_an_unmarked_block() -> None:
    text = "Some words.\n\n```\n$ gpuq status\n```\n\n```sh\ngpuq run\n```\n"
    assert output_blocks(text) == [("Some words.", "$ gpuq status")]


def _normal(text: str) -> str:
    """Demo output with what differs between runs made alike: paths, times, pids, run times."""
    text = re.sub(r"/tmp/gpuq-demo-\w+", "DEMO", text)
    text = re.sub(r"--python \S+", "--python PYTHON", text)
    text = re.sub(r"\[\d\d:\d\d:\d\d\]", "[TIME]", text)
    text = re.sub(r"worker \d+", "worker PID", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+[+-]\d\d:\d\d", "WHEN", text)
    text = re.sub(r"after \d+\.\ds", "after Ns", text)
    return re.sub(r" \d+s  exit=", " Ns  exit=", text)


def test_the_readme_demo_output_is_what_gpuq_demo_prints(tmp_path: Path) -> None:
    (block,) = [block for before, block in output_blocks((REPO / "README.md").read_text()) if before == DEMO]
    env = {k: v for k, v in os.environ.items() if k != "GPUQ_HOME"}
    env["PYTHONUNBUFFERED"] = "1"  # its lines and its commands' in the order a terminal shows them
    command = [sys.executable, "-m", "gpuq", "demo"]
    printed = subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert printed.returncode == 0, printed.stdout
    assert _normal(printed.stdout.rstrip("\n")) == _normal(block)
