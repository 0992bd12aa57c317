"""`add --snapshot`: a copy of a repository's tracked files, for jobs that must not see later edits."""

from __future__ import annotations

import os
import shutil
import stat
from typing import Any

from gpuq.system.gitinfo import GitFailed, git, status

SNAPSHOT_MAX_BYTES = 200 * 1024 * 1024


def snapshot(repo: str, dest: str, max_bytes: int = SNAPSHOT_MAX_BYTES, timeout: float = 60.0) -> dict[str, Any]:
    """Copy the tracked files of `repo`'s work tree (submodules' included, links as links, modes less
    group/other write) to the new directory `dest`, made aside and renamed into place. ValueError
    for no work tree, an existing `dest` or more than `max_bytes`. {"path", "files", "bytes",
    "commit", "skipped" (tracked but missing), "untracked" (left out)}."""
    dest = os.path.abspath(dest)
    if os.path.lexists(dest):
        raise ValueError(f"snapshot destination already exists: {dest}")
    try:
        top = git(repo, "rev-parse", "--show-toplevel", timeout=timeout).decode("utf-8", "surrogateescape").strip()
        names = git(top, "ls-files", "-z", "--recurse-submodules", timeout=timeout).split(b"\0")
        # --directory: a wholly untracked directory (data, outputs) counts once and is not walked
        others = ("ls-files", "-z", "--others", "--exclude-standard", "--directory", "--no-empty-directory")
        untracked = git(top, *others, timeout=timeout).count(b"\0")
        commit = status(top, timeout)[0]
    except GitFailed:
        raise ValueError(f"cannot snapshot {repo}: not a git work tree (or git is missing or refused it)") from None
    paths = sorted({os.fsdecode(name) for name in names if name})
    plan, skipped, total = _plan(top, paths)
    if total > max_bytes:
        raise ValueError(
            f"refusing to snapshot {top}: its tracked files hold {total / 2**20:.0f} MiB, over the "
            f"{max_bytes / 2**20:.0f} MiB limit; run the job without --snapshot"
        )
    tmp = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.mkdir(tmp)
    try:
        files, copied, vanished = _copy(top, tmp, plan, max_bytes)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "path": dest,
        "files": files,
        "bytes": copied,
        "commit": commit,
        "skipped": skipped + vanished,
        "untracked": untracked,
    }


def _plan(top: str, paths: list[str]) -> tuple[list[tuple[str, os.stat_result]], int, int]:
    """(path, lstat) of each tracked path that is a file or link now; the number skipped; the bytes."""
    plan: list[tuple[str, os.stat_result]] = []
    skipped = total = 0
    for rel in paths:
        try:
            st = os.lstat(os.path.join(top, rel))
        except FileNotFoundError:  # deleted in the work tree: the job would not see it either
            skipped += 1
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
        elif not stat.S_ISLNK(st.st_mode):  # an uninitialised submodule's directory, a FIFO...
            skipped += 1
            continue
        plan.append((rel, st))
    return plan, skipped, total


def _copy(top: str, into: str, plan: list[tuple[str, os.stat_result]], max_bytes: int) -> tuple[int, int, int]:
    """Copy the plan into `into`: (files and links copied, bytes copied, paths that vanished meanwhile)."""
    files = copied = vanished = 0
    made: set[str] = set()
    for rel, st in plan:
        target = os.path.join(into, rel)
        parent = os.path.dirname(target)
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        source = os.path.join(top, rel)
        try:
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(source), target)
            else:
                shutil.copyfile(source, target, follow_symlinks=False)
                # Without group/other write: the copy lives in the spool, and code that others could
                # edit there would run as the user.
                os.chmod(target, stat.S_IMODE(st.st_mode) & ~0o022)
                copied += os.path.getsize(target)
        except FileNotFoundError:  # deleted by the user while we copied
            vanished += 1
            continue
        files += 1
        if copied > max_bytes:  # files grew while we copied: still never fill the disk
            raise ValueError(f"refusing to snapshot {top}: its tracked files grew past the limit while copying")
    return files, copied, vanished


def snapshot_cwd(job_cwd: str, repo: str, snap: str) -> str:
    """The directory in snapshot `snap` at `job_cwd`'s place in `repo` (it may be missing if it holds
    no tracked file); ValueError when `job_cwd` is not inside `repo`."""
    rel = os.path.relpath(os.path.realpath(job_cwd), os.path.realpath(repo))
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        raise ValueError(f"{job_cwd} is not inside the repository {repo}")
    return os.path.normpath(os.path.join(snap, rel))
