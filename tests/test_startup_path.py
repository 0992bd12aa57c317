"""Start-up tricks only where they pay (issue 25): imports inside functions, the `TYPE_CHECKING =
False` guard and comments citing bench/PROFILE.md belong to the modules that plain `gpuq status` and
`gpuq add` import, whose start-up is measured (tests/test_startup_imports.py, bench/startup.py).
Everywhere else gpuq is written as plain Python: imports at the top, `from typing import ...`.

The path is found, not listed: the real CLI runs in a queue with finished, running and pending
jobs, inside and outside a git repository, and the modules it imported are the path. An import
left inside a function off the path says why on its line (it would close an import circle or point
up a layer).
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from conftest import wait_for
from test_startup_imports import imported_by

REPO = Path(__file__).resolve().parent.parent
# The packages held to the rule here: all of gpuq's layers.
CHECKED = ("core", "spool", "system", "engine", "cli", "run")
# On the path only where there is a GPU (gpuq status shows them, and their leases), which the tests'
# machine lacks.
ON_GPU_MACHINES = {"gpuq.system.gpus", "gpuq.system.leases", "gpuq.system.lease_io"}


def startup_path(gq: Any) -> set[str]:
    """The gpuq modules that plain `status` (also -a, --json), `add`, `eta` and `history` import,
    in the busiest queue they see: finished jobs past the recent few, one running, one pending
    behind it."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(gq.work)]
    subprocess.run(["git", "init", "-q", str(gq.work)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "first"], check=True)
    gq.gpuq("add", "-q", "--sweep", "x=" + ",".join(str(i) for i in range(12)), "true", "{x}")
    gq.gpuq("cancel", "1-12")
    gq.start_worker("--watch")
    running = gq.add("sleep", "30")
    gq.add("--after", str(running), "true")
    wait_for(lambda: gq.state_of(running) == "running", timeout=15, what="the job to run")
    outside = gq.work.parent / "outside"
    outside.mkdir()
    modules = set()
    for command in [("status",), ("status", "-a"), ("status", "--json"), ("add", "-q", "true")]:
        modules |= imported_by(gq, *command)
    modules |= imported_by(gq, "add", "-q", "--after", f"{running}-{running + 1}", "true")
    modules |= imported_by(gq, "add", "-q", "--time", "4h", "--begin", "+1m", "true")  # the time parser
    modules |= imported_by(SimpleNamespace(work=outside, env=gq.env), "add", "-q", "true")
    for command in [("eta",), ("history",)]:  # measured too since issue 27 (bench/README.md)
        modules |= imported_by(gq, *command)
    return {m for m in modules if m.startswith("gpuq.")} | ON_GPU_MACHINES


def module_files() -> dict[str, Path]:
    files = {}
    for package in CHECKED:
        for path in sorted((REPO / "gpuq" / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def tricks(path: Path) -> list[str]:
    """What a module off the start-up path should not hold."""
    source = path.read_text()
    lines = source.splitlines()
    found = [f"line {n}: the TYPE_CHECKING guard" for n, line in enumerate(lines, 1) if "TYPE_CHECKING = False" in line]
    found += [f"line {n}: cites PROFILE.md" for n, line in enumerate(lines, 1) if "PROFILE.md" in line]
    for func in ast.walk(ast.parse(source)):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and "#" not in lines[node.lineno - 1]:
                    found.append(f"line {node.lineno}: an import inside {func.name}() that does not say why")
    return found


def test_modules_off_the_startup_path_are_plain(gq: Any) -> None:
    path = startup_path(gq)
    # the probe saw the whole path: the ETA of the pending job, the running job's log, git
    assert {"gpuq.engine.tracking.queue_eta", "gpuq.spool.logs", "gpuq.system.gitinfo", "gpuq.core.sweep"} <= path
    off = {name: file for name, file in module_files().items() if name not in path}
    assert "gpuq.engine.lifecycle.actions" in off and "gpuq.core.transitions" in off
    found = {name: tricks(file) for name, file in off.items()}
    assert not {name: what for name, what in found.items() if what}, "start-up tricks off the start-up path"


def test_the_check_sees_a_trick(tmp_path: Path) -> None:
    """The check can fail: each trick is found in a module written with them."""
    source = (
        "TYPE_CHECKING = False  # (bench/PROFILE.md)\n"
        "def f():\n    import shutil\n"
        "def g():\n    import shutil  # here: it would close a circle\n"
    )
    path = tmp_path / "module.py"
    path.write_text(source)
    assert [t.split(":")[0] for t in tricks(path)] == ["line 1", "line 1", "line 3"]
