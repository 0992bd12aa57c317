"""The manual's reference documents every command, option and environment variable; the README's
links resolve; and the CI runs exactly the README's two commands."""

from __future__ import annotations

import argparse
import re
from typing import Iterator

from conftest import REPO

from gpuq.cli import build_parser

# GPUQ_ words in gpuq/ that are not environment variables
NOT_VARIABLES = {"GPUQ_JOB_JSON"}  # the here-document delimiter of run/slurm_batch.py


def _commands() -> list[str]:
    parser = build_parser()
    names = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    return sorted(n for n in names if not n.startswith("_"))  # `_ids` serves shell completion only


REFERENCE = REPO / "docs" / "reference" / "index.md"


def test_every_command_is_in_the_reference() -> None:
    reference = REFERENCE.read_text()
    missing = [c for c in _commands() if not re.search(rf"`gpuq {c}\b", reference) and f"(or `{c}`)" not in reference]
    assert missing == []


def _options(parser: argparse.ArgumentParser, command: str = "gpuq") -> Iterator[tuple[str, str]]:
    """(command, option string) of every option --help shows, sub-commands included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{command} {name}")
        elif action.help != argparse.SUPPRESS:
            yield from ((command, opt) for opt in action.option_strings if opt not in ("-h", "--help"))


def test_every_option_is_in_the_reference() -> None:
    reference = REFERENCE.read_text()
    missing = [
        f"{command} {opt}"
        for command, opt in _options(build_parser())
        if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", reference)
    ]
    assert missing == []


def test_every_environment_variable_is_in_the_reference() -> None:
    reference = REFERENCE.read_text()
    code = "\n".join(p.read_text() for p in (REPO / "gpuq").rglob("*.py"))
    names = set(re.findall(r"\bGPUQ_[A-Z_]*[A-Z]\b", code)) - NOT_VARIABLES
    assert names and sorted(n for n in names if f"`{n}`" not in reference) == []


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_to_its_own_sections_resolve() -> None:
    readme = (REPO / "README.md").read_text()
    outside_code = re.sub(r"```.*?```", "", readme, flags=re.S)
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", outside_code, flags=re.M)}
    links = set(re.findall(r"\]\(#([^)]+)\)", readme))
    assert sorted(links - anchors) == []
    files = set(re.findall(r"\]\(([\w./-]+)\)", readme))
    assert files and sorted(f for f in files if not (REPO / f).exists()) == []


def test_the_readme_is_short() -> None:
    """A guide a person reads; the manual in docs/ has the rest."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 400


def test_ci_runs_the_readme_quickstart() -> None:
    readme = (REPO / "README.md").read_text()
    for tag in ("ci:install", "ci:test"):
        block = readme.split(f"<!-- {tag} -->", 1)[1].split("```")[1]
        command = block.split("\n", 1)[1].strip()
        assert command.startswith("python3 -m venv .venv &&"), command
    assert "readme_command install" in (REPO / ".ci" / "run").read_text()


def test_pyproject_lists_every_package() -> None:
    """setuptools gets an explicit package list (skill/ is mapped in as gpuq.skill)."""
    text = (REPO / "pyproject.toml").read_text()
    listed = set(re.findall(r'"(gpuq(?:\.\w+)*)"', text.split("packages = [", 1)[1].split("]", 1)[0]))
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "gpuq").rglob("__init__.py")}
    assert found | {"gpuq.skill"} == listed
