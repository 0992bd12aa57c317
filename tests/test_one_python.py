"""One Python (issue 40): every module of the package is plain Python: imports at the top, no
`TYPE_CHECKING = False` guard, and an import inside a function only where a whole optional
subsystem starts or a command is dispatched, saying why on its line; at most 40 of those."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_INNER_IMPORTS = 40


def modules() -> list[Path]:
    return sorted(p for p in (REPO / "gpuq").rglob("*.py") if "__pycache__" not in p.parts)


def inner_imports(path: Path) -> list[tuple[int, str]]:
    """(line, the line's text) of each import written inside a function."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for func in ast.walk(ast.parse(source)):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [
                (n.lineno, lines[n.lineno - 1]) for n in ast.walk(func) if isinstance(n, (ast.Import, ast.ImportFrom))
            ]
    return sorted(set(found))


def tricks(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    found = [f"line {n}: the TYPE_CHECKING guard" for n, line in enumerate(lines, 1) if "TYPE_CHECKING = False" in line]
    found += [
        f"line {n}: an import inside a function that does not say why"
        for n, line in inner_imports(path)
        if "#" not in line
    ]
    return found


def test_every_module_is_plain_python() -> None:
    found = {str(p.relative_to(REPO)): tricks(p) for p in modules()}
    assert not {name: what for name, what in found.items() if what}


def test_few_imports_inside_functions() -> None:
    count = sum(len(inner_imports(p)) for p in modules())
    assert 0 < count <= MAX_INNER_IMPORTS


def test_the_check_sees_a_trick(tmp_path: Path) -> None:
    """The check can fail: each trick is found in a module written with them."""
    source = (
        "TYPE_CHECKING = False\n"
        "def f():\n    import shutil\n"
        "def g():\n    import shutil  # a whole subsystem, started here\n"
    )
    path = tmp_path / "module.py"
    path.write_text(source)
    assert [t.split(":")[0] for t in tricks(path)] == ["line 1", "line 3"]
    assert len(inner_imports(path)) == 2
