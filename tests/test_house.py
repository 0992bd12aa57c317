"""Docs that cannot rot: every path of the package named in a comment, a docstring or the design
documents exists; ARCHITECTURE.md's module map names every module; code comments carry no issue
numbers and no millisecond figures (those belong in bench/PROFILE.md)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "gpuq"
DOCS = ("ARCHITECTURE.md", "spool_layout.md", "lease_layout.md", "README.md")
# a path inside the package as the code and docs write it: gpuq/run/worker.py, engine/schedule/,
# run/supervisor/start.py (the layer directories are the package's top level)
LAYERS = "core|system|spool|engine|run|cli|integrations"
PATH = re.compile(rf"(?<![\w./-])(?:gpuq/)?((?:{LAYERS})/[\w/]*[\w](?:\.py)?/?)")


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def comments_and_docstrings(path: Path) -> str:
    """The text of a module's comments and string literals (docstrings among them)."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            out.append(tok.string)
    return "\n".join(out)


def named_paths(text: str) -> set[str]:
    return {m.group(1) for m in PATH.finditer(text)}


def exists(named: str) -> bool:
    target = PACKAGE / named.rstrip("/")
    if target.exists() or target.with_suffix(".py").exists():
        return True
    # a module named with a function after it (engine/lifecycle/repairs.reconcile) is not a path
    return False


def test_every_package_path_named_in_code_or_docs_exists() -> None:
    missing = []
    for path in modules():
        missing += [
            f"{path.relative_to(REPO)}: {n}" for n in named_paths(comments_and_docstrings(path)) if not exists(n)
        ]
    for doc in DOCS:
        missing += [f"{doc}: {n}" for n in named_paths((REPO / doc).read_text()) if not exists(n)]
    assert not missing, "\n".join(missing)


def test_the_module_map_names_every_module() -> None:
    text = (REPO / "ARCHITECTURE.md").read_text()
    missing = []
    for path in modules():
        if path.name == "__init__.py":
            continue
        rel = path.relative_to(PACKAGE)
        # named by its path below its layer's heading (`store.py` under spool), or in full
        if f"`{path.name}`" not in text and f"{rel.as_posix()}" not in text:
            missing.append(rel.as_posix())
    assert not missing, "\n".join(missing)


def test_code_comments_carry_no_issue_numbers_or_milliseconds() -> None:
    found = []
    for path in modules():
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and tok.string.startswith(('"""', "'''"))):
                if re.search(r"\bissues? \d+\b|\b\d+(\.\d+)? ?ms\b", tok.string):
                    found.append(f"{path.relative_to(REPO)}:{tok.start[0]}: {tok.string.strip()[:80]}")
    assert not found, "\n".join(found)
