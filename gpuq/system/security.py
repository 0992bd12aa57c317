"""Who may put files in the spool. Whoever can create a file in pending/ runs commands as the worker's
user, so (like cron and at) gpuq trusts only a real directory, owned by the user, writable by nobody
else. Each check returns what is wrong and how to fix it."""

from __future__ import annotations

import errno
import os
import stat
from typing import Optional

from gpuq.system.fsutil import StrPath

# Errors from opening a job file that say "this file cannot be a job" (rather than "try again"):
# a socket (ENXIO), a symlink (ELOOP; EMLINK on FreeBSD), a file we may not read.
UNREADABLE_ERRNOS = {errno.ENXIO, errno.ELOOP, errno.EMLINK, errno.EACCES, errno.EPERM, errno.EOPNOTSUPP}
# Errors from writing that mean the disk (or a quota or a size limit) is full.
FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def directory_problem(path: StrPath, is_home: bool = False) -> Optional[str]:
    """Why `path` cannot be trusted as (part of) a spool, or None. Only the last component is checked:
    a spool may sit under a symlinked home directory."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    what = "spool" if is_home else "spool directory"
    if stat.S_ISLNK(st.st_mode):
        target = os.path.realpath(path)
        if is_home:
            fix = f"set GPUQ_HOME={target} (the real directory) instead"
        else:
            fix = f"remove the link (`rm {path}`) and let gpuq create the directory"
        return f"{what} {path} is a symbolic link (to {target}); gpuq does not follow it: {fix}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} exists and is not a directory; move it away and gpuq will create the {what}"
    me = os.geteuid()
    if st.st_uid != me:
        return (
            f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {me}); its owner could run commands "
            f"as you: use a spool of your own (GPUQ_HOME), or `chown {me} {path}` if it is yours"
        )
    if st.st_mode & 0o022:
        return (
            f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); anyone who can "
            f"write there can run commands as you: `chmod 700 {path}`"
        )
    return None


def job_file_problem(st: os.stat_result, size_cap: int) -> Optional[str]:
    """Why an opened job file (its fstat) is refused, or None. Checked on the descriptor, so the
    file cannot be swapped between the check and the read."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    me = os.geteuid()
    if st.st_uid != me:
        return f"is owned by uid {st.st_uid}, not by you (uid {me})"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} hard links; a job file must have exactly one (copy it instead of linking)"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); `chmod go-w` it"
    if st.st_size > size_cap:
        return f"is {st.st_size} bytes; the limit is {size_cap}"
    return None


def open_error_reason(exc: OSError) -> Optional[str]:
    """The rejection reason for an error opening a job file; None for one not about the file."""
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return "is a symbolic link (gpuq never follows links in the spool)"
    if exc.errno in UNREADABLE_ERRNOS:
        return f"cannot be opened: {exc.strerror}"
    return None


def display(name: str) -> str:
    """A file name as it may be printed: undecodable bytes and control characters escaped, so a
    hostile name can neither crash a UTF-8 stream nor forge lines in a log."""
    text = name.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
