"""The worker's own inotify watch (system/inotify.py): real directories, real renames."""

from __future__ import annotations

import os
import select
import sys
from pathlib import Path

import pytest

from gpuq.system import inotify
from gpuq.system.inotify import Watcher

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux only")


def _events(watcher: Watcher) -> list[tuple[str, int, str]]:
    assert select.select([watcher.fd], [], [], 5)[0], "no event within 5 s"
    return watcher.read()


def test_events_name_the_file_and_its_directory(tmp_path: Path) -> None:
    pending, running, other = tmp_path / "pending", tmp_path / "running", tmp_path / "tmp"
    for d in (pending, running, other):
        d.mkdir()
    watcher = Watcher({"pending": str(pending), "running": str(running)})
    try:
        (other / "x.json").write_text("{}")
        os.rename(other / "x.json", running / "000001-x.json")
        got = _events(watcher)
        assert [(s, n) for s, _m, n in got] == [("running", "000001-x.json")]
        assert got[0][1] & inotify.IN_MOVED_TO
        os.unlink(running / "000001-x.json")
        (other / "y.json").write_text("{}")  # not watched: no event
        [(state, mask, name)] = _events(watcher)
        assert (state, name) == ("running", "000001-x.json") and mask & inotify.IN_DELETE
        (pending / "sub").mkdir()  # a directory is not a job file: left out
        (pending / "z.json").write_text("{}")
        names = {(s, n) for s, _m, n in _events(watcher)}
        assert names == {("pending", "z.json")}
        assert not watcher.broken
        os.rmdir(pending / "sub")
        os.rename(pending, tmp_path / "elsewhere")  # the watched directory itself went
        _events(watcher)
        assert watcher.broken
    finally:
        watcher.close()


def test_a_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        Watcher({"pending": str(tmp_path / "nope")})
