"""The README documents every command, and the CI runs exactly the README's two commands."""

from __future__ import annotations

import re

from conftest import REPO

from gpuq.cli import build_parser


def _commands() -> list[str]:
    parser = build_parser()
    names = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    return sorted(n for n in names if not n.startswith("_"))  # `_ids` serves shell completion only


def test_every_command_is_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    missing = [c for c in _commands() if not re.search(rf"`gpuq {c}\b", readme) and f"(or `{c}`)" not in readme]
    assert missing == []


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
