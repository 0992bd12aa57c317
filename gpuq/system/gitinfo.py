"""Which code a job runs: git facts about its working directory (gitsnapshot.py copies a repository).

Everything runs the `git` binary, bounded by a timeout, read-only (`GIT_OPTIONAL_LOCKS=0`: looking
never races the user's own git commands). `dirty`, `diff_hash` and snapshots cover *tracked* files
only: jobs often write outputs into the repository, and counting those would report every later
job of a queue as "code changed".
"""

from __future__ import annotations

import os
import subprocess
import threading
import zlib
from typing import Any, Optional

GIT_TIMEOUT = 5.0
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


def git(cwd: str, *args: str, timeout: float = GIT_TIMEOUT) -> bytes:
    """stdout of `git ARGS` run in `cwd`; GitFailed on any failure."""
    try:
        proc = subprocess.run(["git", *args], **_git_io(cwd), timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise GitFailed(str(exc)) from None
    if proc.returncode != 0:
        raise GitFailed(f"git {args[0]} exited {proc.returncode}")
    return proc.stdout


def _start(cwd: str, *args: str) -> subprocess.Popen:
    try:
        return subprocess.Popen(["git", *args], **_git_io(cwd))
    except OSError as exc:
        raise GitFailed(str(exc)) from None


def _fingerprint_of(proc: subprocess.Popen) -> tuple[int, str]:
    """(size, fingerprint) of the output of a started git, read in chunks (a diff of a large file is
    never held whole). The fingerprint, "SIZE-CRC32", tells one diff from a later one; it is no
    defence against a forged diff, which nobody here has a reason to make (a cryptographic hash
    would load OpenSSL into every `gpuq add`)."""
    # A blocking read cannot time out by itself: a timer kills git, which ends the read.
    timer = threading.Timer(GIT_TIMEOUT, proc.kill)
    timer.start()
    crc, size = 0, 0
    try:
        assert proc.stdout is not None
        while chunk := proc.stdout.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
        proc.stdout.close()
        code = proc.wait()
    finally:
        timer.cancel()
    if code != 0:
        raise GitFailed(f"git diff exited {code}")
    return size, f"{size}-{crc:08x}"


def status(cwd: str, timeout: float) -> tuple[Optional[str], Optional[str], bool]:
    """(commit or None when the branch has no commit yet, branch or None when detached, dirty)."""
    out = git(cwd, "status", "--porcelain=v2", "--branch", "--untracked-files=no", "-z", timeout=timeout)
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
    Never prints or raises. Two git processes at once: `rev-parse` and `diff` against HEAD, whose
    output, empty or not, says whether tracked files changed (before the first commit, one after
    the other: `rev-parse`, `status`, `diff` against the empty tree)."""
    diff = None
    try:
        # started first, run from `cwd` while rev-parse finds the top: diff.relative=false makes it
        # the whole tree's diff from a subdirectory too, whatever the user's config says
        diff = _start(cwd, "-c", "diff.relative=false", "diff", *DIFF_OPTIONS, "HEAD", "--")
        top, commit, branch = _head(cwd)
        if not top:  # inside .git itself: no work tree
            return None
        if commit is None:
            _stop(diff)
            empty_tree = git(top, "hash-object", "-t", "tree", "/dev/null").decode().strip()
            diff = _start(top, "diff", *DIFF_OPTIONS, empty_tree, "--")
        size, digest = _fingerprint_of(diff)
    except GitFailed:
        return None
    finally:
        _stop(diff)
    dirty = size > 0
    return {"repo": top, "commit": commit, "branch": branch, "dirty": dirty, "diff_hash": digest if dirty else None}


def _stop(proc: Optional[subprocess.Popen]) -> None:
    """A git whose answer is not wanted (or was read) ended and reaped."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc is not None and proc.stdout is not None:
        proc.stdout.close()


def _head(cwd: str) -> tuple[str, Optional[str], Optional[str]]:
    """(the work tree's top, its commit, its branch) from one `rev-parse`; before the first commit
    (HEAD names nothing, rev-parse fails) from `rev-parse --show-toplevel` and `status`."""
    try:
        lines = git(cwd, "rev-parse", "--show-toplevel", "HEAD", "--abbrev-ref", "HEAD").split(b"\n")
        if len(lines) > 3:
            branch = None if lines[2] == b"HEAD" else lines[2].decode("utf-8", "replace")
            return os.fsdecode(lines[0]), lines[1].decode(), branch
    except GitFailed:
        pass
    top = os.fsdecode(git(cwd, "rev-parse", "--show-toplevel")).strip()
    if not top:
        return "", None, None
    commit, branch, _dirty = status(top, GIT_TIMEOUT)
    return top, commit, branch


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
    if _fingerprints_differ(queued.get("diff_hash"), now.get("diff_hash")):
        return PREFIX + "uncommitted changes differ"
    return None


def _fingerprints_differ(queued: Optional[str], now: Optional[str]) -> bool:
    """Whether two diff fingerprints differ; one of the 64-digit sha256 of job files queued by
    gpuq 0.1.0 cannot be compared with a newer one, and is taken as the same."""
    if queued and now and ("-" in queued) != ("-" in now):
        return False
    return queued != now


def _short(commit: Optional[str]) -> str:
    return commit[:7] if commit else "(no commit)"
