"""What a work tree is, read from its files without running git: when nothing changed since git
last answered for it, gitinfo.provenance gives that answer again instead of running git (issue 27).

A `Look` reads HEAD and the ref it names (a loose ref file or packed-refs), the index (versions
2-4) and the lstat of every tracked file. A tracked file is *settled* when its stat matches its
index entry (mode, size, inode, mtime and ctime) and the entry is not racy (its mtime is older
than the index file's, git's own racy-clean rule): git trusts such a file to hold the indexed
blob, and so do we. Every other tracked file (modified, deleted, racy) is fingerprinted by its
content. The key of a look digests all of it, with the index file's stat and trailer, the config
files' stat and the environment's git variables: two looks with the same key see the same HEAD,
index and tracked content, so git would answer the same for both.

Anything unusual is not read here, and `look` returns None so that the caller runs git: a
repository of another user, a mount point on the way up, GIT_DIR and the like, a `core.worktree`,
sha256 or reftable repository, config includes, a split or sparse index, intent-to-add, unmerged
or submodule entries, more than MAX_ENTRIES entries, more than MAX_HASHED bytes of changed files.
"""

from __future__ import annotations

import os
import stat
import struct

from gpuq.core import jsontext

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional, Protocol

    class CacheFiles(Protocol):
        """spool.cache (spool/files.py Caches): system/ cannot import the spool, a layer up."""

        def read(self, name: str) -> Optional[bytes]: ...

        def write(self, name: str, data: bytes) -> None: ...


MAX_ENTRIES = 20_000  # past this, git's C stat loop is faster than this Python one
MAX_HASHED = 32 << 20  # bytes of changed tracked files fingerprinted per look
VERSION = 1  # of the cache files' content: another version's are not used
# GIT_* variables that cannot change what `git status` and `git diff` say, left out of the key so
# that the worker's environment and the user's shell share an entry. Any other one is in the key,
# and those that move the repository (GIT_DIR...) send every look to git.
HARMLESS_ENV = ("GIT_AUTHOR_", "GIT_COMMITTER_", "GIT_EDITOR", "GIT_SEQUENCE_EDITOR", "GIT_PAGER", "GIT_SSH")
HARMLESS_ENV += ("GIT_ASKPASS", "GIT_TERMINAL_PROMPT", "GIT_OPTIONAL_LOCKS", "GIT_PS1_", "GIT_TRACE", "GIT_MERGE_")
MOVES_REPOSITORY = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY")
MOVES_REPOSITORY += ("GIT_CEILING_DIRECTORIES", "GIT_DISCOVERY_ACROSS_FILESYSTEM", "GIT_NAMESPACE")
# Repository config that changes where the work tree is or how it is read: git decides then.
UNUSUAL_CONFIG = (b"worktree", b"objectformat", b"refstorage", b"sparse", b"include", b"bare = true")
ENTRY = struct.Struct(">10I20sH")  # ctime s, ns, mtime s, ns, dev, ino, mode, uid, gid, size; oid; flags
FILE, EXECUTABLE, LINK = 0o100644, 0o100755, 0o120000
U32 = 0xFFFFFFFF


class Unusual(Exception):
    """Not read here: git decides."""


class Look:
    """A work tree as its files say now: `top` (the real path of its top directory), `commit`
    (None before the first commit), `branch` (None when detached) and `key`."""

    __slots__ = ("top", "commit", "branch", "key")

    def __init__(self, top: str, commit: Optional[str], branch: Optional[str], key: str) -> None:
        self.top, self.commit, self.branch, self.key = top, commit, branch, key


def look(cwd: str) -> Optional[Look]:
    """The look of the work tree holding `cwd`, or None when it must be left to git (not found,
    unusual, unreadable, or changing while it was read)."""
    if any(name in os.environ for name in MOVES_REPOSITORY):
        return None
    try:
        return _look(os.path.realpath(cwd))
    except (OSError, ValueError, Unusual, struct.error):  # UnicodeError is a ValueError
        return None


def cached(cache: CacheFiles, now: Look) -> Optional[dict[str, Any]]:
    """git's last answer for this work tree, if it was given for a look with the same key."""
    try:
        data = cache.read(cache_name(now.top))
        entry = jsontext.loads(data) if data else None
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("v") != VERSION or entry.get("key") != now.key:
        return None
    answer = entry.get("answer")
    return answer if isinstance(answer, dict) and answer.get("repo") == entry.get("top") else None


def remember(cache: CacheFiles, before: Look, answer: dict[str, Any], cwd: str) -> bool:
    """Keep git's `answer` for the look taken before git ran, if the work tree still looks the
    same now that git has answered (nothing changed while it ran) and git agrees with what the
    files said (the same top, commit and branch). Whether it was kept."""
    if (answer.get("repo"), answer.get("commit"), answer.get("branch")) != (before.top, before.commit, before.branch):
        return False
    after = look(cwd)
    if after is None or after.key != before.key:
        return False
    entry = {"v": VERSION, "top": before.top, "key": before.key, "answer": answer}
    try:
        cache.write(cache_name(before.top), jsontext.dumps(entry).encode())
    except OSError:  # no spool yet, a full disk: the next add runs git again
        return False
    return True


def cache_name(top: str) -> str:
    """cache/git-DIGEST: one file per work tree, holding git's last answer for it."""
    return "git-" + _digest(os.fsencode(top), 16)


def _digest(data: bytes, size: int = 32) -> str:
    try:  # blake2 alone: the `hashlib` package loads OpenSSL, some ms of `gpuq add` (bench/PROFILE.md)
        from _blake2 import blake2b
    except ImportError:  # an interpreter without it
        from hashlib import blake2b
    return blake2b(data, digest_size=size).hexdigest()


def _look(cwd: str) -> Look:
    top, gitdir = _find(cwd)
    common = _common_dir(gitdir)
    config = _read(os.path.join(common, "config")).lower()
    if any(word in config for word in UNUSUAL_CONFIG) or os.path.lexists(os.path.join(gitdir, "config.worktree")):
        raise Unusual("config")
    commit, branch, head = _head(gitdir, common)
    parts = [top, gitdir, head, commit or "-", *_index(top, os.path.join(gitdir, "index"))]
    parts += _surroundings(common)
    return Look(top, commit, branch, _digest("\0".join(parts).encode("utf-8", "surrogateescape")))


def _find(cwd: str) -> tuple[str, str]:
    """(top, git directory) of the work tree holding `cwd` (a real path), as git finds it."""
    path = cwd
    device = os.stat(path).st_dev
    while True:
        dotgit = os.path.join(path, ".git")
        try:
            st = os.lstat(dotgit)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                gitdir = dotgit
            elif stat.S_ISREG(st.st_mode):  # a linked worktree's (or a submodule's) `.git` file
                text = _read(dotgit).decode()
                if not text.startswith("gitdir: "):
                    raise Unusual(".git file")
                gitdir = os.path.normpath(os.path.join(path, text[len("gitdir: ") :].strip()))
            else:
                raise Unusual(".git")
            _owned(path, gitdir)
            return path, gitdir
        if os.path.lexists(os.path.join(path, "HEAD")) and os.path.isdir(os.path.join(path, "objects")):
            # in a git directory itself, or a bare repository
            raise Unusual("in a git directory")
        parent = os.path.dirname(path)
        if parent == path or os.stat(parent).st_dev != device:  # git stops at a mount point
            raise Unusual("no work tree")
        path = parent


def _owned(top: str, gitdir: str) -> None:
    """git refuses another user's repository (safe.directory): git decides then."""
    me = os.geteuid()
    if os.stat(top).st_uid != me or os.stat(gitdir).st_uid != me or (me == 0 and "SUDO_UID" in os.environ):
        raise Unusual("owner")


def _common_dir(gitdir: str) -> str:
    """Where the shared refs and config are: the main repository's git directory for a linked
    worktree (its `commondir` file), else the git directory itself."""
    try:
        text = _read(os.path.join(gitdir, "commondir")).decode().strip()
    except FileNotFoundError:
        return gitdir
    return os.path.normpath(os.path.join(gitdir, text))


def _head(gitdir: str, common: str) -> tuple[Optional[str], Optional[str], str]:
    """(commit or None when the branch has none yet, branch or None when detached, HEAD's text)."""
    head = _read(os.path.join(gitdir, "HEAD")).decode().strip()
    if _is_oid(head):
        return head, None, head
    if not head.startswith("ref: refs/heads/"):
        raise Unusual("HEAD")
    ref = head[len("ref: ") :]
    try:
        loose = _read(os.path.join(common, ref)).decode().strip()
    except FileNotFoundError:
        return _packed(common, ref), ref[len("refs/heads/") :], head
    if not _is_oid(loose):  # a symbolic ref
        raise Unusual("ref")
    return loose, ref[len("refs/heads/") :], head


def _packed(common: str, ref: str) -> Optional[str]:
    """The commit of `ref` in packed-refs, or None: a branch without a commit yet."""
    try:
        text = _read(os.path.join(common, "packed-refs")).decode()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        oid, _space, name = line.partition(" ")
        if name == ref and _is_oid(oid):
            return oid
    return None


def _is_oid(text: str) -> bool:
    return len(text) == 40 and all(c in "0123456789abcdef" for c in text)


def _index(top: str, path: str) -> list[str]:
    """The index file's stat and trailer, then each tracked file that is not settled with its
    content's fingerprint."""
    data, st = _read_stat(path)
    if len(data) < 32 or data[:4] != b"DIRC":
        raise Unusual("index")
    version, count = struct.unpack_from(">II", data, 4)
    if version not in (2, 3, 4) or count > MAX_ENTRIES:
        raise Unusual("index version")
    parts = [f"index {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {data[-20:].hex()}"]
    budget = [MAX_HASHED]
    offset, name = 12, b""
    top_slash = os.fsencode(top) + b"/"  # bytes paths: no decoding per entry
    directories = {b""}
    for _ in range(count):
        offset, name, fields = _entry(data, offset, version, name)
        parent = name.rpartition(b"/")[0]
        if parent not in directories:
            _real_directories(top_slash, parent, directories)
        try:
            now: Optional[os.stat_result] = os.lstat(top_slash + name)
        except FileNotFoundError:
            now = None
        if now is None or not _settled(fields, now, st.st_mtime_ns):
            parts.append(f"{os.fsdecode(name)} {_fingerprint(top_slash + name, now, budget)}")
    _extensions(data, offset)
    return parts


def _real_directories(top_slash: bytes, directory: bytes, known: set[bytes]) -> None:
    """Each directory on the way to a tracked file must be one, not a link to one: git does not
    follow such a link (the files beyond it are deleted for git) while lstat does."""
    while directory not in known:
        try:
            if stat.S_ISLNK(os.lstat(top_slash + directory).st_mode):
                raise Unusual("a link on the way to a tracked file")
        except FileNotFoundError:  # the files in it are missing: their entries say so
            pass
        known.add(directory)
        directory = directory.rpartition(b"/")[0]


def _entry(data: bytes, offset: int, version: int, previous: bytes) -> tuple[int, bytes, tuple]:
    """(offset of the next entry, path, stat fields and mode) of the entry at `offset`."""
    fields = ENTRY.unpack_from(data, offset)
    flags = fields[11]
    pos = offset + ENTRY.size
    if flags & 0x3000:  # a merge stage: unmerged
        raise Unusual("unmerged")
    if flags & 0x4000:  # extended flags: skip-worktree (sparse) and intent-to-add
        if version < 3 or struct.unpack_from(">H", data, pos)[0] & 0x6000:
            raise Unusual("extended flags")
        pos += 2
    if version == 4:  # the path: drop N bytes of the previous one, add the rest
        strip = data[pos] & 0x7F  # git's offset varint (varint.c)
        while data[pos] & 0x80:
            pos += 1
            strip = ((strip + 1) << 7) | (data[pos] & 0x7F)
        pos += 1
        end = data.index(b"\0", pos)
        name = previous[: len(previous) - strip] + data[pos:end]
        following = end + 1
    else:
        end = data.index(b"\0", pos)
        name = data[pos:end]
        following = offset + ((pos - offset + len(name) + 8) & ~7)
    if fields[6] not in (FILE, EXECUTABLE, LINK):  # a submodule (gitlink): its state is its own repository's
        raise Unusual("mode")
    return following, name, fields


def _settled(fields: tuple, now: os.stat_result, index_mtime_ns: int) -> bool:
    """Whether the file is as its index entry recorded it, and the entry is not racy."""
    ctime_s, ctime_ns, mtime_s, mtime_ns, _dev, ino, mode, _uid, _gid, size = fields[:10]
    mtime = mtime_s * 1_000_000_000 + mtime_ns  # (seconds as 32 bits: right until 2106)
    if mtime >= index_mtime_ns:  # written in the index's own tick: its content may differ
        return False
    if now.st_mtime_ns != mtime or now.st_ctime_ns != ctime_s * 1_000_000_000 + ctime_ns:
        return False
    if now.st_ino & U32 != ino or now.st_size & U32 != size:
        return False
    if mode == LINK:
        return stat.S_ISLNK(now.st_mode)
    return stat.S_ISREG(now.st_mode) and bool(now.st_mode & 0o100) == (mode == EXECUTABLE)


def _fingerprint(path: bytes, now: Optional[os.stat_result], budget: list[int]) -> str:
    """What a tracked file that is not settled holds: its kind, mode and content's digest."""
    if now is None:
        return "missing"
    if stat.S_ISLNK(now.st_mode):
        return "link " + _digest(os.readlink(path))
    if not stat.S_ISREG(now.st_mode):
        return f"other {stat.S_IFMT(now.st_mode)}"
    budget[0] -= now.st_size
    if budget[0] < 0:
        raise Unusual("too much changed")
    data, again = _read_stat(path)
    if (again.st_ino, again.st_size, again.st_mtime_ns) != (now.st_ino, now.st_size, now.st_mtime_ns):
        raise Unusual("changing")  # written while we looked: git decides
    return f"file {now.st_mode & 0o100:o} {_digest(data)}"


def _extensions(data: bytes, offset: int) -> None:
    """The index's extensions: optional ones (an upper-case first letter) are skipped; the split
    index, the sparse index and unknown required ones are for git."""
    end = len(data) - 20
    while offset < end:
        signature = data[offset : offset + 4]
        (size,) = struct.unpack_from(">I", data, offset + 4)
        if not (b"A" <= signature[:1] <= b"Z"):
            raise Unusual("index extension")
        offset += 8 + size
    if offset != end:
        raise Unusual("index length")


def _surroundings(common: str) -> list[str]:
    """What else can change git's answer: the config and attributes files (their stat) and the
    environment's git variables."""
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    files = [os.path.join(common, "config"), os.path.join(common, "info", "attributes"), "/etc/gitconfig"]
    files += [
        os.path.join(home, ".gitconfig"),
        os.path.join(xdg, "git", "config"),
        os.path.join(xdg, "git", "attributes"),
    ]
    files += [os.environ[name] for name in ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM") if os.environ.get(name)]
    parts = []
    for path in files:
        try:
            st = os.stat(path)
            parts.append(f"{path} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}")
        except OSError:
            parts.append(f"{path} -")
    env = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("GIT_") and not k.startswith(HARMLESS_ENV))
    return parts + env


def _read(path: str) -> bytes:
    return _read_stat(path)[0]


def _read_stat(path: str | bytes) -> tuple[bytes, os.stat_result]:
    """A file's content and its stat, without following a link at the end."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unusual(path)
        chunks, left = [], st.st_size
        while True:
            chunk = os.read(fd, max(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)
