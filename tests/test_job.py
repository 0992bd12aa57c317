"""The job record (gpuq/core/job.py): each field read as an attribute, its default for a file that
lacks it, the file itself unchanged, and every way a job is obtained giving a Job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuq.core import schema, transitions
from gpuq.core.job import FIELDS, Job
from gpuq.spool import Spool


def _job(job_id: int = 1, **options: object) -> Job:
    return schema.new_job(job_id=job_id, name="n", cmd=["true"], cwd="/", log="", options=options)


def test_a_file_without_a_field_reads_its_default() -> None:
    """A file from before a field existed: the attribute (and `job[name]`) is the record's default,
    `get` stays the plain dict's, and nothing is added to the file."""
    old = Job({k: v for k, v in _job().items() if k not in ("gpu_request", "after_any", "urgent")})
    assert (old.gpu_request, old.after_any, old.urgent) == (1, [], False)
    assert old["gpu_request"] == 1 and old.get("gpu_request") is None
    assert "gpu_request" not in old
    old.after_any.append(5)  # a default is the job's own copy, never shared
    assert Job().after_any == [] and "after_any" not in old


def test_required_and_unknown_fields_are_key_errors() -> None:
    with pytest.raises(KeyError):
        _ = Job().id
    with pytest.raises(KeyError):
        _ = Job()["no_such_field"]


def test_attributes_are_the_dict() -> None:
    job = _job(7, gpu_request=0, urgent="force")
    assert (job.id, job.gpu_request, job.urgent, job.cmd) == (7, 0, "force", ["true"])
    job.note = "written"
    assert job["note"] == "written"
    assert list(job) == [f.name for f in FIELDS.values() if not f.later]  # a new file's order


def test_every_way_to_obtain_a_job_gives_a_job(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool").ensure()
    job = _job(spool.ids.allocate())
    ref = spool.jobs.publish(job)
    assert type(job) is Job and type(schema.validate(dict(job))) is Job
    assert type(spool.jobs.load(ref)) is Job
    assert all(type(j) is Job for _r, j in spool.jobs.load_many("pending"))
    changes = transitions.start(job, slot=None, gpus=None, boot_id="b", host="h", log="l")
    ref, running = spool.jobs.move(ref, job, "running", changes)
    assert type(running) is Job and running.rev == 1 and running.attempts == 1
    assert type(spool.jobs.rewrite(ref, running, note="x")) is Job


def test_the_file_is_the_dict(tmp_path: Path) -> None:
    """JSON in and out exactly as before: a Job encodes as the dict it is."""
    spool = Spool(tmp_path / "spool").ensure()
    job = _job(spool.ids.allocate())
    ref = spool.jobs.publish(job)
    on_disk = (tmp_path / "spool" / "pending" / ref.name).read_text()
    assert json.loads(on_disk) == dict(job) == json.loads(json.dumps(spool.jobs.load(ref)))
