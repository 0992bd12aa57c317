"""The finished index read in parts (gpuq/spool/cache/index.py): a plain look reads its head alone,
the rows only when something needs them, and rows asked for after the file was written again come
from the job files, never from the newer file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import Env
from test_status_cache import _many

from gpuq.spool import Spool
from gpuq.spool.cache import index


def _settled(spool: Spool) -> None:
    for state in ("done", "failed"):
        old = os.stat(spool.layout.state_dir(state)).st_mtime - 60
        os.utime(spool.layout.state_dir(state), (old, old))  # settled: the index stamps it


def test_a_long_head_is_read_in_two_parts_and_rows_only_when_asked(gq: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "HEAD_PROBE_BYTES", 1024)  # a head longer than the first read
    spool = _many(gq, 100)
    _settled(spool)
    assert gq.gpuq("status", "-a").stdout.count("exp/run-") == 100  # writes the index
    path = Path(spool.layout.cache_path(index.NAME))
    data = path.read_bytes()
    head_end = index.HEAD_SIZE_BYTES + int.from_bytes(data[: index.HEAD_SIZE_BYTES], "little")
    assert index.HEAD_PROBE_BYTES < head_end < len(data)
    read, _identity, at = spool.finished._head_bytes(str(path))
    assert (read, at) == (data[:head_end], head_end)
    heads, _stamp, _kept, _runs, rows = spool.finished._load()
    assert all(entry.rows is None for entry in heads.values())  # the head alone
    assert {state: len(found) for state, found in rows().items()} == {s: len(e.ids) for s, e in heads.items()}


def test_rows_asked_after_the_index_was_written_again_come_from_the_files(gq: Env) -> None:
    spool = _many(gq, 12)
    _settled(spool)
    gq.gpuq("status", "-a")
    heads, _stamp, _kept, _runs, rows = spool.finished._load()
    path = Path(spool.layout.cache_path(index.NAME))
    path.write_bytes(path.read_bytes()[: index.HEAD_SIZE_BYTES + 10] + b"another version")  # written again
    found = rows()
    want = Spool(gq.home).finished._rows_from_files(heads)
    assert found == want and sum(len(r) for r in found.values()) == 12
