"""The benchmark's smoke run (issue 4): bench/run.py --smoke runs every measurement end to end
with tiny sizes and no peers, in seconds, so that the benchmark cannot rot unnoticed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SECTIONS = (
    "## Targets",
    "## 1. Dispatch latency",
    "## 2. Back-to-back gap",
    "## 3. Throughput",
    "## 4. CLI latency",
    "## 5. Idle cost",
    "## 6. Log size",
    "## 7. Scale",
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the benchmark reads /proc (Linux only)")
def test_smoke_run_measures_every_item(tmp_path: Path) -> None:
    out, raw = tmp_path / "RESULTS.md", tmp_path / "raw.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--smoke", "--out", str(out), "--raw", str(raw)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = out.read_text()
    for section in SECTIONS:
        assert section in text, f"{section!r} missing from the report:\n{text}"
    assert "smoke run" in text and "not measured here" in text
    data = json.loads(raw.read_text())["results"]
    dispatch = data["dispatch"]["gpuq"]["queued"]
    # real jobs, seconds at most; slightly negative when a waiting supervisor starts the job
    # before `gpuq add` has finished exiting (the job was queued and fsynced before that)
    assert len(dispatch) == 3 and all(-1 < d < 10 for d in dispatch), dispatch
    assert all(0 < g < 10 for g in data["back_to_back"]["gpuq"])
    assert data["throughput"]["gpuq"][0] > 0.5
    for commands in data["cli"].values():
        assert set(commands) == {"python -c pass", "gpuq add", "gpuq status"}
        assert min(commands["gpuq status"]) > 0
    assert data["idle"]["empty"]["gpuq"]["processes"] == 1 and data["idle"]["empty"]["gpuq"]["rss_mb"] > 1
    small, big = data["log"]["sizes"]
    assert small < 4096 and big >= 2**30  # the big case really had a 1 GB log
    assert set(data["scale"]) >= {"gpuq status", "gpuq status -a"}
    # every number in the targets table came from this run, none is a placeholder
    target_rows = [line for line in text.split("## 1.")[0].splitlines() if line.startswith("| ") and "ms" in line]
    assert target_rows and all(re.search(r"\| -?\d+\.\d+ ", row) for row in target_rows)


def test_bad_option_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--only", "nonsense", "--smoke"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--only" in proc.stderr and "Traceback" not in proc.stderr
