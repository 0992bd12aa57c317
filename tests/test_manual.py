"""The manual cannot drift from the code: its command reference is what the command line prints,
and CHANGELOG.md's newest version is what `gpuq --version` says."""

from __future__ import annotations

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
