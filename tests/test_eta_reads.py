"""`gpuq eta` estimates running and pending jobs only: it reads no finished job's file (plain
`status` reads the newest few, which it shows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import cli_probe

REPO = Path(__file__).resolve().parent.parent

# The CLI in-process, with an audit hook that notes every path opened (os.open raises "open").
OPENS = """
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" else None)
"""


def opened_by(gq: Any, *args: str) -> list[str]:
    return list(cli_probe(gq, OPENS, "opened", *args))


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
