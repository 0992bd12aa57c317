"""Property tests (issue 7): whatever bytes land in the spool, the loader either yields a valid job
or rejects the file with a reason; no exception escapes, and a valid job is one that every part of
gpuq that reads jobs can use (scheduler, status table, supervisor environment, file names).

Files are real files in a temporary spool; hypothesis chooses their contents.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuq.cli import render
from gpuq.core import schema
from gpuq.engine.lifecycle import intake
from gpuq.engine.schedule import queue_read, scheduler
from gpuq.engine.schedule.planner import Planner
from gpuq.engine.views.status import Row
from gpuq.run.supervisor import start as supervisor_start
from gpuq.spool import JobRef, Spool
from gpuq.system.gpus import Gpu, GpuLook

SETTINGS = settings(
    max_examples=int(os.environ.get("GPUQ_PROPERTY_EXAMPLES", "150")),  # raise it for a long hunt
    deadline=None,  # each example writes and fsyncs real files
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # one spool for all examples, on purpose
)
CANONICAL_ID = 7
NO_GPUS = GpuLook((), "none", "no NVIDIA driver", 0.0)
TWO_GPUS = GpuLook(tuple(Gpu(i, "Fake", f"GPU-{i}", 81559, 0, ()) for i in range(2)), "fake", None, 0.0)


class Loader:
    """Throws contents at a real spool and checks the outcome of each."""

    def __init__(self, home: Path):
        old = os.umask(0o022)
        os.umask(old)
        self.spool = Spool(home).ensure()
        os.umask(old)
        self.counter = itertools.count()
        done = schema.new_job(job_id=1, name="dep", cmd=["true"], cwd="/", log="/dev/null")
        self.spool.jobs.publish(done, "done")  # so that `after: [1]` can be valid

    def _write(self, name: str, data: bytes) -> None:
        fd = os.open(self.spool.layout.job_path("pending", name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def dropped(self, data: bytes) -> str:
        """A hand-dropped file: becomes a job, or goes to rejected/ with its reason."""
        name = f"drop{next(self.counter)}.json"
        self._write(name, data)
        outcome = intake.take_in(self.spool, name, time.time() + 60)  # its quiet period is long over
        assert name not in os.listdir(self.spool.layout.state_dir("pending")), outcome
        assert not [n for n in os.listdir(self.spool.layout.state_dir("pending")) if n.startswith(".")]
        if outcome.startswith("rejected: "):
            why = outcome[len("rejected: ") :]
            assert why.strip() and "\n" not in why
            assert Path(self.spool.layout.rejected_path(f"{name}.reason")).read_text() == why + "\n"
            return outcome
        assert outcome.startswith("job #"), outcome
        ref = self.spool.jobs.find(int(outcome[len("job #") :]), ("pending",))
        assert ref is not None
        job = self.spool.jobs.load(ref)
        assert job["source"] == f"dropped:{name}"
        use_everywhere(self.spool, job)
        self.spool.jobs.remove(ref)
        return outcome

    def canonical(self, data: bytes) -> str:
        """A file already named like a job: loads as a valid job, or InvalidJob with a reason."""
        name = schema.filename(CANONICAL_ID, "x")
        self._write(name, data)
        try:
            try:
                job = self.spool.jobs.load(JobRef(CANONICAL_ID, "pending", name))
            except schema.InvalidJob as exc:
                assert str(exc).strip() and "\n" not in str(exc)
                snap, invalid = queue_read.read_queue(self.spool)  # the worker sees it as invalid too
                assert [ref.name for ref, _why in invalid] == [name] and snap.pending == []
                return f"invalid: {exc}"
            use_everywhere(self.spool, job)
            return "valid"
        finally:
            os.unlink(self.spool.layout.job_path("pending", name))


def use_everywhere(spool: Spool, job: dict[str, Any]) -> None:
    """Everything gpuq does with a job it has loaded; none of it may raise."""
    snap, invalid = queue_read.read_queue(spool)
    assert invalid == [] and [j["id"] for j in snap.pending] == [job["id"]]
    for labels, look in ((None, NO_GPUS), (["0", "1"], NO_GPUS), (None, TWO_GPUS), (["1"], TWO_GPUS)):
        Planner(labels, look=lambda look=look: look).plan(snap, {})
    reasons = scheduler.waiting_reasons(snap)
    scheduler.has_startable_future(snap)
    for state in ("pending", "running", "done", "failed", "interrupted"):
        render.status_table([Row(job, state, reasons.get(job["id"]))])
        render.info(job, state)
    env = supervisor_start.job_environment(spool, job, "0")
    assert all(isinstance(k, str) and isinstance(v, str) and "\0" not in k + v for k, v in env.items())
    file_name = schema.filename(job["id"], job["name"])
    assert "/" not in file_name and file_name.startswith(f"{job['id']:06d}-")
    assert all(isinstance(word, str) and "\0" not in word for word in job["cmd"]) and job["cmd"][0]


@pytest.fixture
def loader(tmp_path: Path) -> Loader:
    return Loader(tmp_path / "spool")


# ---- strategies -------------------------------------------------------------------------------
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
tricky = st.sampled_from(
    ["", " ", "../../etc/passwd", "/abs/path", "a\x00b", "\n", "x" * 300, -1, 0, 1, 2**31, 2**63, 1.5, True, None]
    + [[], [""], ["true"], ["true", 1], {}, {"A": "b"}, {"A": 1}, {"": "x"}, {"A=B": "c"}, [1], [1, 1], [7], [-3]]
    + ["2024-01-01T00:00:00+00:00", "yesterday", "0001-01-01T00:00:00", float("nan"), float("inf")]
    + ["\ud800", "\udcff", ["true", "\ud800"], {"A": "\ud800"}, {"\udcff": "x"}]
)
# byte strings that JSON parsers and job code have tripped on
FRAGMENTS = [b"NaN", b"-Infinity", b"1e999", b"9" * 5000, b"\xff", b"\\u0000", b'"\\ud800"', b"[" * 2000]
values = tricky | json_values

DROPPED_BASE = {"cmd": ["true"], "name": "n", "cwd": "/", "env": {"A": "b"}, "after": [1], "retries": 1, "priority": 2}
DROPPED_KEYS = sorted(DROPPED_BASE) + ["after_any", "id", "log", "schema_version", "bogus"]
CANONICAL_BASE = schema.new_job(job_id=CANONICAL_ID, name="n", cmd=["true"], cwd="/", log="/dev/null", after=[1])
CANONICAL_KEYS = sorted(CANONICAL_BASE) + ["bogus"]


@st.composite
def mutated(draw: Any, base: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """`base` with one to three fields set to odd values, or removed."""
    obj = dict(base)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(keys))
        if draw(st.booleans()) and key in obj:
            del obj[key]
        else:
            obj[key] = draw(values)
    return obj


@st.composite
def damaged(draw: Any, base: dict[str, Any]) -> bytes:
    """The bytes of a valid file, truncated, with a byte changed, or with a key given twice."""
    data = json.dumps(base, indent=1).encode()
    how = draw(st.sampled_from(["truncate", "flip", "insert", "duplicate"]))
    at = draw(st.integers(0, len(data) - 1))
    if how == "truncate":
        return data[:at]
    if how == "flip":
        return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    if how == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=4) | st.sampled_from(FRAGMENTS)) + data[at:]
    key = draw(st.sampled_from(sorted(base)))
    return data.replace(b"{", b'{"' + key.encode() + b'": null,', 1)


def encode(value: Any) -> bytes:
    """JSON text as a program would write it (non-ASCII as \\u escapes, lone surrogates included)."""
    return json.dumps(value).encode()


# ---- properties -------------------------------------------------------------------------------
@SETTINGS
@given(data=st.binary(max_size=2048))
def test_arbitrary_bytes_dropped(loader: Loader, data: bytes) -> None:
    loader.dropped(data)


@SETTINGS
@given(data=st.binary(max_size=2048))
def test_arbitrary_bytes_as_a_job_file(loader: Loader, data: bytes) -> None:
    loader.canonical(data)


@SETTINGS
@given(value=json_values)
def test_arbitrary_json_dropped(loader: Loader, value: Any) -> None:
    loader.dropped(encode(value))


@SETTINGS
@given(value=json_values)
def test_arbitrary_json_as_a_job_file(loader: Loader, value: Any) -> None:
    loader.canonical(encode(value))


@SETTINGS
@given(obj=mutated(DROPPED_BASE, DROPPED_KEYS))
def test_near_valid_dropped_file(loader: Loader, obj: dict[str, Any]) -> None:
    loader.dropped(encode(obj))


@SETTINGS
@given(obj=mutated(CANONICAL_BASE, CANONICAL_KEYS))
def test_near_valid_job_file(loader: Loader, obj: dict[str, Any]) -> None:
    loader.canonical(encode(obj))


@SETTINGS
@given(data=damaged(DROPPED_BASE))
def test_damaged_dropped_file(loader: Loader, data: bytes) -> None:
    loader.dropped(data)


@SETTINGS
@given(data=damaged(CANONICAL_BASE))
def test_damaged_job_file(loader: Loader, data: bytes) -> None:
    loader.canonical(data)


def test_the_bases_are_valid(loader: Loader) -> None:
    """The near-valid strategies start from files that are valid, so they probe the boundary."""
    assert loader.dropped(encode(DROPPED_BASE)).startswith("job #")
    assert loader.canonical(encode(CANONICAL_BASE)) == "valid"
