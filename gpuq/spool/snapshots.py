"""snapshots/: copies of a repository's code, one per `gpuq add --snapshot` (named by the id of its
first job, shared by the jobs of a sweep), each with the ids of its jobs beside it (NNNNNN.ids),
so that `gpuq clear` removes a copy once no job of it is left."""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from gpuq.spool.files import Files, read_small, unlink_quietly
from gpuq.spool.layout import Layout
from gpuq.system import procs


class Snapshots:
    def __init__(self, layout: Layout, files: Files):
        self.layout, self.files = layout, files

    def create(self, first_id: int, ids: list[int], copy: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
        """Make the copy with `copy(destination)` and record its jobs; what `copy` returns."""
        dest = self.layout.snapshot_path(first_id)
        info = copy(dest)
        try:
            self.files.replace(dest + ".ids", json.dumps(ids).encode(), "snapshot")
        except BaseException:
            _remove_tree(dest)
            raise
        return info

    def release_unused(self, remaining: set[int]) -> int:
        """Remove every copy none of whose jobs is in `remaining`, and the partial ones
        abandoned by their writer; bytes freed."""
        names = os.listdir(self.layout.internal_dir("snapshots"))
        return sum(self.release(int(n), remaining) for n in names if n.isdigit()) + self.clean_partial()

    def clean_partial(self) -> int:
        """Remove the partial copies (`.NNNNNN.tmp-PID-RANDOM`) of an `add --snapshot` that died
        before renaming its copy into place; bytes freed."""
        top = self.layout.internal_dir("snapshots")
        freed = 0
        for name in os.listdir(top):
            pid = name.partition(".tmp-")[2].split("-")[0]
            path = os.path.join(top, name)
            if not (name.startswith(".") and pid.isdigit()) or os.path.islink(path) or not os.path.isdir(path):
                continue
            # Its writer's pid alone decides, not its age (tmp/'s rule): a live add stays on its
            # copy however long it takes, and would go on into a folder removed under it.
            if procs.pid_alive(int(pid)):
                continue
            try:
                freed += _tree_bytes(path)
            except FileNotFoundError:
                continue  # removed meanwhile by another cleaner
            _remove_tree(path)
        return freed

    def release(self, first_id: int, remaining: set[int]) -> int:
        """Remove the copy named `first_id` if none of its jobs is in `remaining`; bytes freed."""
        dest = self.layout.snapshot_path(first_id)
        ids_file = dest + ".ids"
        data = read_small(ids_file, mine=True)
        try:
            ids = set(json.loads(data)) if data else {first_id}
        except (ValueError, TypeError):
            ids = {first_id}
        if ids & remaining or not os.path.isdir(dest) or os.path.islink(dest):
            return 0
        freed = _tree_bytes(dest)
        _remove_tree(dest)
        unlink_quietly(ids_file)
        return freed


def _tree_bytes(top: str) -> int:
    """The disk space of everything under `top`, links not followed."""
    total, stack = 0, [top]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                total += entry.stat(follow_symlinks=False).st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total


def _remove_tree(path: str) -> None:
    import shutil  # copies of code (`add --snapshot`, `clear`): not on every command's path

    shutil.rmtree(path, ignore_errors=True)
