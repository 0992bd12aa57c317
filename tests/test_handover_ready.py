"""A supervisor loads the no-clobber rename's C binding while its job runs, not when the job ends:
handing the slot on takes the next job's claim by such a rename, and the next job would wait for
the import meanwhile (bench/PROFILE.md section 15). Untimed: the binding's library is looked for
in the supervisor's memory map while its job still runs."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest
from conftest import WAIT_FOR_GO, Env, wait_for


def mapped(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/maps (Linux only)")
def test_a_supervisor_has_the_rename_binding_loaded_while_its_job_runs(gq: Env) -> None:
    ready, release = gq.work / "ready", gq.work / "go"
    gq.script("wait.py", f"open({str(ready)!r}, 'w').close()\n" + WAIT_FOR_GO)
    job_id = gq.add("wait.py")
    gq.start_worker("--watch")
    wait_for(ready.exists, what="the job running")
    supervisor = psutil.Process(gq.job(job_id)["pid"]).parent()
    assert supervisor is not None and "gpuq" in " ".join(supervisor.cmdline())
    wait_for(lambda: mapped(supervisor.pid, "_ctypes"), what="ctypes loaded by the supervisor while its job runs")
    assert gq.state_of(job_id) == "running"
    release.touch()
    wait_for(lambda: gq.state_of(job_id) == "done", what="the job done")
