"""Which code a job runs: git facts about its working directory (gitsnapshot.py copies a repository).

Everything runs the `git` binary, bounded by a timeout, read-only (`GIT_OPTIONAL_LOCKS=0`: looking
never races the user's own git commands). `dirty`, `diff_hash` and snapshots cover *tracked* files
only: jobs often write outputs into the repository, and counting those would report every later
job of a queue as "code changed".
"""

from __future__ import annotations

import os
import select
import subprocess
import time
import zlib
from typing import Any, Iterator, Optional

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


class Git:
    """A started `git -C CWD ARGS`: never prompting or taking optional locks, stdin and stderr
    /dev/null, stdout a pipe read in chunks until a deadline (then git is killed). None of gpuq's
    descriptors reach it (`close_fds`): a claim's lock must not outlive its supervisor in a git
    still running."""

    def __init__(self, cwd: str, *args: str, timeout: float = GIT_TIMEOUT) -> None:
        self.args = args
        self.deadline = time.monotonic() + timeout
        self.proc: Optional[subprocess.Popen] = None
        env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", LC_ALL="C")
        quiet = subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                ["git", "-C", cwd, *args], env=env, stdin=quiet, stdout=subprocess.PIPE, stderr=quiet
            )
        except OSError as exc:
            raise GitFailed(str(exc)) from None

    @property
    def pid(self) -> int:
        """Its process id while it runs unreaped; 0 once reaped."""
        return self.proc.pid if self.proc is not None else 0

    def chunks(self) -> Iterator[bytes]:
        """stdout as it comes, each chunk at most CHUNK bytes; then git is reaped. GitFailed when
        git did not end well or in time."""
        assert self.proc is not None and self.proc.stdout is not None
        out = self.proc.stdout.fileno()
        poller = select.poll()  # a blocking read cannot time out by itself
        poller.register(out, select.POLLIN)
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                self.stop()
                raise GitFailed(f"git {self.args[0]} took longer than its timeout")
            chunk = os.read(out, CHUNK)
            if not chunk:
                break
            yield chunk
        code = self._reap()  # its stdout closed: git is ending
        if code != 0:
            raise GitFailed(f"git {self.args[0]} exited {code}")

    def output(self) -> bytes:
        return b"".join(self.chunks())

    def _reap(self) -> int:
        proc, self.proc = self.proc, None
        assert proc is not None and proc.stdout is not None
        proc.stdout.close()
        return proc.wait()

    def stop(self) -> None:
        """Killed if it still runs, and reaped (its answer is not wanted, or came too late)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self._reap()

    def __del__(self) -> None:  # a question dropped unanswered (a request refused after it was asked)
        self.stop()


def git(cwd: str, *args: str, timeout: float = GIT_TIMEOUT) -> bytes:
    """stdout of `git ARGS` run in `cwd`; GitFailed on any failure."""
    return Git(cwd, *args, timeout=timeout).output()


def _fingerprint_of(proc: Git) -> tuple[int, str]:
    """(size, "SIZE-CRC32") of a started git's output, read in chunks: it tells one diff from a later
    one, no defence against a forged one (a cryptographic hash would load OpenSSL into `gpuq add`)."""
    crc, size = 0, 0
    for chunk in proc.chunks():
        crc = zlib.crc32(chunk, crc)
        size += len(chunk)
    return size, f"{size}-{crc:08x}"


def status(cwd: str, timeout: float) -> tuple[Optional[str], Optional[str]]:
    """(commit or None when the branch has no commit yet, branch or None when detached)."""
    out = git(cwd, "status", "--porcelain=v2", "--branch", "--untracked-files=no", "-z", timeout=timeout)
    commit: Optional[str] = None
    branch: Optional[str] = None
    for entry in out.split(b"\0"):
        if entry.startswith(b"# branch.oid "):
            value = entry[len(b"# branch.oid ") :].decode()
            commit = None if value == "(initial)" else value
        elif entry.startswith(b"# branch.head "):
            value = entry[len(b"# branch.head ") :].decode("utf-8", "replace")
            branch = None if value == "(detached)" else value
    return commit, branch


class Asked:
    """`provenance` asked of git and not yet answered: `rev-parse` and `diff` against HEAD run at
    once, while the caller does other work (`gpuq add` reads the answer where it writes the job);
    whether the diff is empty says whether tracked files changed."""

    def __init__(self, cwd: str) -> None:
        self.cwd = cwd
        self.diff: Optional[Git] = None
        self.head: Optional[Git] = None
        self.answered = False
        self.result: Optional[dict[str, Any]] = None
        try:
            # run from `cwd` while rev-parse finds the top: diff.relative=false makes it the whole
            # tree's diff from a subdirectory too, whatever the user's config says
            self.diff = Git(cwd, "-c", "diff.relative=false", "diff", *DIFF_OPTIONS, "HEAD", "--")
            self.head = Git(cwd, "rev-parse", "--show-toplevel", "HEAD", "--abbrev-ref", "HEAD")
        except GitFailed:
            self.answered = True  # git cannot be started: no answer

    def answer(self) -> Optional[dict[str, Any]]:
        """{"repo", "commit" (None: no commit yet), "branch" (None: detached), "dirty",
        "diff_hash" (None: clean)} of the code in the directory; None when it is not in a work tree
        git will answer for. Never prints or raises."""
        if not self.answered:
            self.answered = True
            try:
                self.result = self._read()
            except GitFailed:
                self.result = None
            finally:
                for proc in (self.head, self.diff):
                    if proc is not None:
                        proc.stop()
        return self.result

    def _read(self) -> Optional[dict[str, Any]]:
        assert self.head is not None and self.diff is not None
        top, commit, branch = _head(self.cwd, self.head)
        if not top:  # inside .git itself: no work tree
            return None
        if commit is None:  # before the first commit: the diff against the empty tree
            self.diff.stop()
            empty_tree = git(top, "hash-object", "-t", "tree", "/dev/null").decode().strip()
            self.diff = Git(top, "diff", *DIFF_OPTIONS, empty_tree, "--")
        size, digest = _fingerprint_of(self.diff)
        dirty = size > 0
        return {"repo": top, "commit": commit, "branch": branch, "dirty": dirty, "diff_hash": digest if dirty else None}


def ask(cwd: str) -> Asked:
    """The git processes of `provenance(cwd)` started; `.answer()` reads them."""
    return Asked(cwd)


def provenance(cwd: str) -> Optional[dict[str, Any]]:
    """Asked.answer's record of the code in `cwd`, asked now."""
    return ask(cwd).answer()


def _head(cwd: str, asked: Git) -> tuple[str, Optional[str], Optional[str]]:
    """(the work tree's top, its commit, its branch) from the `rev-parse` asked; before the first
    commit (HEAD names nothing, rev-parse fails) from `rev-parse --show-toplevel` and `status`."""
    try:
        lines = asked.output().split(b"\n")
        if len(lines) > 3:
            branch = None if lines[2] == b"HEAD" else lines[2].decode("utf-8", "replace")
            return os.fsdecode(lines[0]), lines[1].decode(), branch
    except GitFailed:
        pass
    top = os.fsdecode(git(cwd, "rev-parse", "--show-toplevel")).strip()
    if not top:
        return "", None, None
    return (top, *status(top, GIT_TIMEOUT))


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
