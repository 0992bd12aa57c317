"""Which code a job runs: git facts about its working directory, and snapshots of a repository.

Everything runs the `git` binary, bounded by a timeout, read-only (`GIT_OPTIONAL_LOCKS=0`: looking
never races the user's own git commands). `dirty`, `diff_hash` and snapshots cover *tracked* files
only: jobs often write outputs into the repository, and counting those would report every later
job of a queue as "code changed".
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import threading
from typing import Any, Optional

GIT_TIMEOUT = 5.0
SNAPSHOT_MAX_BYTES = 200 * 1024 * 1024
CHUNK = 1 << 20

# Pinned so that the hash depends on the change only, not on diff.noprefix, diff.context,
# diff.algorithm, diff.renames, color or external diff drivers in the user's config.
DIFF_OPTIONS = (
    "--binary",
    "--full-index",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-renames",
    "--unified=3",
    "--diff-algorithm=myers",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)


class GitFailed(Exception):
    """git is missing, refused (not a repository, `safe.directory`), failed or timed out."""


def _git_io(cwd: str) -> dict[str, Any]:
    """How every git gpuq runs is started: never prompting or taking optional locks, stderr swallowed."""
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    quiet = subprocess.DEVNULL
    return {"cwd": cwd, "env": env, "stdin": quiet, "stdout": subprocess.PIPE, "stderr": quiet}


def _git(cwd: str, *args: str, timeout: float = GIT_TIMEOUT) -> bytes:
    """stdout of `git ARGS` run in `cwd`; GitFailed on any failure."""
    try:
        proc = subprocess.run(["git", *args], **_git_io(cwd), timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise GitFailed(str(exc)) from None
    if proc.returncode != 0:
        raise GitFailed(f"git {args[0]} exited {proc.returncode}")
    return proc.stdout


def _git_sha256(cwd: str, *args: str) -> str:
    """sha256 of the output of `git ARGS`, read in chunks (a diff of a large file is never held whole)."""
    try:
        proc = subprocess.Popen(["git", *args], **_git_io(cwd))
    except OSError as exc:
        raise GitFailed(str(exc)) from None
    # A blocking read cannot time out by itself: a timer kills git, which ends the read.
    timer = threading.Timer(GIT_TIMEOUT, proc.kill)
    timer.start()
    digest = hashlib.sha256()
    try:
        assert proc.stdout is not None
        while chunk := proc.stdout.read(CHUNK):
            digest.update(chunk)
        proc.stdout.close()
        code = proc.wait()
    finally:
        timer.cancel()
    if code != 0:
        raise GitFailed(f"git {args[0]} exited {code}")
    return digest.hexdigest()


def _status(cwd: str, timeout: float) -> tuple[Optional[str], Optional[str], bool]:
    """(commit or None when the branch has no commit yet, branch or None when detached, dirty)."""
    out = _git(cwd, "status", "--porcelain=v2", "--branch", "--untracked-files=no", "-z", timeout=timeout)
    commit: Optional[str] = None
    branch: Optional[str] = None
    dirty = False
    for entry in out.split(b"\0"):
        if entry.startswith(b"# branch.oid "):
            value = entry[len(b"# branch.oid ") :].decode()
            commit = None if value == "(initial)" else value
        elif entry.startswith(b"# branch.head "):
            value = entry[len(b"# branch.head ") :].decode("utf-8", "replace")
            branch = None if value == "(detached)" else value
        elif entry[:2] in (b"1 ", b"2 ", b"u "):  # changed, renamed/copied, unmerged tracked entries
            dirty = True
    return commit, branch, dirty


def provenance(cwd: str) -> Optional[dict[str, Any]]:
    """{"repo", "commit" (None: no commit yet), "branch" (None: detached), "dirty", "diff_hash"
    (None: clean)} of the code in `cwd`; None when it is not in a work tree git will answer for.
    Never prints or raises."""
    try:
        top = _git(cwd, "rev-parse", "--show-toplevel").decode("utf-8", "surrogateescape").strip()
        if not top:  # inside .git itself: no work tree
            return None
        commit, branch, dirty = _status(top, GIT_TIMEOUT)
        diff_hash: Optional[str] = None
        if dirty:
            base = commit or _git(top, "hash-object", "-t", "tree", "/dev/null").decode().strip()  # the empty tree
            diff_hash = _git_sha256(top, "diff", *DIFF_OPTIONS, base, "--")
    except GitFailed:
        return None
    return {"repo": top, "commit": commit, "branch": branch, "dirty": dirty, "diff_hash": diff_hash}


PREFIX = "code changed since it was queued: "


def changed(queued: Optional[dict[str, Any]], now: Optional[dict[str, Any]]) -> Optional[str]:
    """One line saying how the code at start differs from the code at add time, or None (a branch
    switch that keeps the commit and changes is no change of code)."""
    if not queued:
        return None
    if not now:
        return "cannot tell whether the code changed: no git work tree when the job started"
    if queued.get("repo") != now.get("repo"):
        return f"{PREFIX}repository {queued.get('repo')} -> {now.get('repo')}"
    if queued.get("commit") != now.get("commit"):
        line = f"{PREFIX}commit {_short(queued.get('commit'))} -> {_short(now.get('commit'))}"
        return line + (" (with uncommitted changes)" if now.get("dirty") else "")
    if queued.get("dirty") != now.get("dirty"):
        return PREFIX + ("uncommitted changes made since" if now.get("dirty") else "uncommitted changes discarded")
    if queued.get("diff_hash") != now.get("diff_hash"):
        return PREFIX + "uncommitted changes differ"
    return None


def _short(commit: Optional[str]) -> str:
    return commit[:7] if commit else "(no commit)"


def snapshot(repo: str, dest: str, max_bytes: int = SNAPSHOT_MAX_BYTES, timeout: float = 60.0) -> dict[str, Any]:
    """Copy the tracked files of `repo`'s work tree (submodules' included, links as links, modes less
    group/other write) to the new directory `dest`, made aside and renamed into place. ValueError
    for no work tree, an existing `dest` or more than `max_bytes`. {"path", "files", "bytes",
    "commit", "skipped" (tracked but missing), "untracked" (left out)}."""
    dest = os.path.abspath(dest)
    if os.path.lexists(dest):
        raise ValueError(f"snapshot destination already exists: {dest}")
    try:
        top = _git(repo, "rev-parse", "--show-toplevel", timeout=timeout).decode("utf-8", "surrogateescape").strip()
        names = _git(top, "ls-files", "-z", "--recurse-submodules", timeout=timeout).split(b"\0")
        # --directory: a wholly untracked directory (data, outputs) counts once and is not walked
        others = ("ls-files", "-z", "--others", "--exclude-standard", "--directory", "--no-empty-directory")
        untracked = _git(top, *others, timeout=timeout).count(b"\0")
        commit, _, _ = _status(top, timeout)
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
