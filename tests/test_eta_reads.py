"""`gpuq eta` estimates running and pending jobs only: it reads no finished job's file (plain
`status` reads the newest few, which it shows)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

# The CLI in-process, with an audit hook that notes every path opened (os.open raises "open").
OPENS = """
import sys
sys.path.insert(0, sys.argv[1])
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" else None)
from gpuq.cli import main
code = main(sys.argv[2:])
import json
sys.stdout.flush()
print("\\nOPENED " + json.dumps(opened))
raise SystemExit(code)
"""


def opened_by(gq: Any, *args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-S", "-c", OPENS, str(REPO), *args],
        cwd=gq.work,
        env=gq.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return list(json.loads(proc.stdout.rsplit("OPENED ", 1)[1]))


def finished_files(gq: Any, opened: list[str]) -> list[str]:
    return [path for path in opened if Path(path).parent == gq.home / "cancelled"]


@pytest.mark.parametrize("command", [("eta",), ("status",)])
def test_eta_reads_no_finished_file_and_status_reads_the_newest(gq: Any, command: tuple[str, ...]) -> None:
    gq.gpuq("add", "-q", "--sweep", "x=1,2,3", "true", "{x}")
    gq.gpuq("cancel", "1", "2", "3")
    gq.add("true")  # waiting (no worker): eta estimates when it starts
    opened = opened_by(gq, *command)
    assert any(Path(path).parent == gq.home / "pending" for path in opened)  # the probe saw the reads
    if command == ("eta",):
        assert finished_files(gq, opened) == []
        assert "#4" in gq.gpuq("eta").stdout
    else:
        assert len(finished_files(gq, opened)) == 3
