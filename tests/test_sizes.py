"""Sizes a reader can hold: no module of more than 600 lines, no function of more than 100 lines
(argparse declarations included). Modules are cut by meaning, not by a count per directory."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gpuq"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 100


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_is_longer_than_600_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, long


def test_no_function_is_longer_than_100_lines() -> None:
    long = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE.parent)}:{node.name}"] = lines
    assert not long, long
