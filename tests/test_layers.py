"""The package's layers: imports go one way, down, and never close a circle (issue 10).

core -> system -> spool -> engine -> run -> cli, each importing only from its own layer or those
below it. Every import counts, also one written inside a function. gpuq.integrations is imported
by training scripts, not by gpuq, and imports nothing of gpuq outside itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "gpuq"
LAYERS = ["core", "system", "spool", "engine", "run", "cli"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str) -> set[str]:
    """Every gpuq module `path` imports, wherever the import statement stands."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.add(prefix)
            found.update(f"{prefix}.{alias.name}" for alias in node.names)
    return {m for m in found if m == "gpuq" or m.startswith("gpuq.")}


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports_of(path, name) if m in files and m != name} for name, path in files.items()}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_belongs_to_a_layer() -> None:
    strays = [m for m in graph() if layer_of(m) not in LAYERS + ["integrations", "__main__", ""]]
    assert strays == []


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for module, targets in graph().items():
        layer = layer_of(module)
        for target in targets:
            target_layer = layer_of(target)
            if layer == "integrations":
                ok = target_layer == "integrations"
            elif layer in ("", "__main__"):
                ok = target_layer in ("", "cli")  # gpuq/__init__ (the version) and `python -m gpuq`
            elif target_layer == "":
                ok = target == "gpuq"  # the version string, from anywhere
            else:
                ok = target_layer in LAYERS and LAYERS.index(target_layer) <= LAYERS.index(layer)
            if not ok:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_no_import_circles() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert circles == []


def test_the_checks_see_a_wrong_import(tmp_path: Path) -> None:
    """The graph really follows imports inside functions (so the two tests above can fail)."""
    source = tmp_path / "gpuq" / "core" / "x.py"
    source.parent.mkdir(parents=True)
    source.write_text("def f():\n    from gpuq.cli import render\n")
    found = imports_of(source, "gpuq.core.x")
    assert "gpuq.cli.render" in found
