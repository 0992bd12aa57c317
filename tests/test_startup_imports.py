"""`gpuq status` and `gpuq add` are typed all day and called in loops by assistants: their start-up
must not pull in heavy modules (issue 15). Untimed: each command runs in a fresh interpreter without
site-packages (`-S`), and the modules it imported are compared with a deny-list, so a new import at
the top of a module on these paths fails here rather than as a few milliseconds in a benchmark.

bench/PROFILE.md says what each of these cost when they were on the path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

DENIED = (
    # heavy or process-starting standard modules
    "subprocess",
    "threading",
    "dataclasses",
    "inspect",
    "shutil",
    "statistics",
    "decimal",
    "fractions",
    "random",
    "logging",
    "sqlite3",
    "hashlib",
    "socket",
    "uuid",
    "tempfile",
    "platform",
    "asyncio",
    # third-party: a start-up must not need them at all
    "watchdog",
    "psutil",
    "pynvml",
    "matplotlib",
    "shtab",
    # gpuq's own heavy layers: the actions of other commands, the worker, the original's reader
    "gpuq.engine.actions",
    "gpuq.engine.legacy",
    "gpuq.engine.history",
    "gpuq.core.transitions",
    "gpuq.run",
)

# Runs the real CLI entry point in-process and prints the modules it added to sys.modules.
PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
before = set(sys.modules)
from gpuq.cli import main
code = main(sys.argv[2:])
sys.stdout.flush()
print("\\nMODULES " + json.dumps(sorted(set(sys.modules) - before)))
raise SystemExit(code)
"""


def imported_by(gq: Any, *args: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-S", "-c", PROBE, str(REPO), *args],
        cwd=gq.work,
        env=gq.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return set(json.loads(proc.stdout.rsplit("MODULES ", 1)[1]))


def denied(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == d or m.startswith(d + ".") for d in DENIED))


@pytest.mark.parametrize(
    "command",
    [
        ("add", "-q", "true"),
        ("add", "-q", "--name", "n", "--priority", "2", "--after", "1", "bash", "-c", "exit 0"),
        ("status",),
        ("status", "-a"),
        ("status", "--json"),
    ],
)
def test_status_and_add_stay_light(gq: Any, command: tuple[str, ...]) -> None:
    # a queue with pending and finished jobs (more than the recent few, so that the finished-row
    # cache is read too), queued and cancelled through the CLI itself
    gq.gpuq("add", "-q", "--sweep", "x=" + ",".join(str(i) for i in range(12)), "true", "{x}")
    gq.gpuq("cancel", *(str(i) for i in range(1, 13)))
    gq.gpuq("add", "-q", "true")
    modules = imported_by(gq, *command)
    assert "gpuq.cli.parser" in modules  # the probe did run the CLI
    assert not denied(modules), f"`gpuq {' '.join(command)}` imports {denied(modules)}"


def test_the_probe_sees_a_heavy_import(gq: Any) -> None:
    """The check can fail: `gpuq cancel` imports engine.actions, and the probe notices."""
    gq.add("true")
    assert "gpuq.engine.actions" in denied(imported_by(gq, "cancel", "1"))
