"""Host memory and CPUs (issue 31): what a job asks of the machine (`--mem`, `--cpus`, a dropped
file's `mem`/`cpus`), and the rule by which a worker admits it."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gpuq.engine.lifecycle import intake
from gpuq.spool import Spool


def _drop(gq: Any, name: str, fields: dict[str, Any]) -> None:
    (gq.home / "pending" / name).write_text(json.dumps({"cmd": ["true"], **fields}))


def test_a_dropped_file_says_mem_and_cpus_or_is_rejected_with_the_reason(gq: Any) -> None:
    spool = Spool(gq.home).ensure()
    _drop(gq, "sized.json", {"mem": "32G", "cpus": 8})
    _drop(gq, "mib.json", {"mem": 2048})
    _drop(gq, "bad-mem.json", {"mem": "lots"})
    _drop(gq, "zero-mem.json", {"mem": 0})
    _drop(gq, "bad-cpus.json", {"cpus": 0})
    _drop(gq, "text-cpus.json", {"cpus": "8"})
    outcomes = dict(intake.take_in_some(spool, time.time() + 60)[0])  # every quiet period is over
    assert outcomes["sized.json"].startswith("job #") and outcomes["mib.json"].startswith("job #")
    asked = sorted((job.mem_mib, job.cpus) for _ref, job in spool.jobs.load_many("pending"))
    assert asked == [(2048, None), (32768, 8)]
    assert "'mem': cannot read 'lots' as a size" in outcomes["bad-mem.json"]
    assert "'mem' must be a size of host memory" in outcomes["zero-mem.json"]
    for name in ("bad-cpus.json", "text-cpus.json"):
        assert "'cpus' must be how many CPUs the job needs" in outcomes[name]


@pytest.mark.parametrize(
    ("line", "message"),
    [(["--mem", "0"], "--mem: '0' is not a positive size"), (["--cpus", "0"], "not a number of CPUs (1 or more)")],
)
def test_add_refuses_a_bad_size_in_one_line(gq: Any, line: list[str], message: str) -> None:
    proc = gq.gpuq("add", *line, "true", check=False)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_add_and_edit_set_the_request(gq: Any) -> None:
    job_id = gq.add("--mem", "1.5G", "--cpus", "3", "true")
    assert (gq.job(job_id)["mem_mib"], gq.job(job_id)["cpus"]) == (1536, 3)
    gq.gpuq("edit", str(job_id), "--set", "mem=512M", "--set", "cpus=1")
    assert (gq.job(job_id)["mem_mib"], gq.job(job_id)["cpus"]) == (512, 1)
    refused = gq.gpuq("edit", str(job_id), "--set", "cpus=-1", check=False)
    assert refused.returncode == 1 and "'cpus' must be" in refused.stderr
