"""Installing a file that the user may later edit (the assistant skill), never losing their edits:
the copy ends with the hash of what gpuq wrote; a changed copy is kept (the new one beside it as
NAME.new) or, with `force`, moved to NAME.bak first. A NAME.new left by an earlier install goes
once the copy is installed, unless the user changed it."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

STAMP = "<!-- installed by gpuq; unchanged while this hash matches: sha256:{} -->\n"


@dataclass
class Installed:
    path: Path
    action: str  # "created", "updated", "unchanged", "kept" (the user's changed copy), "replaced"
    other: Optional[Path] = None  # "kept": where the new version went; "replaced": the user's backup

    def summary(self) -> str:
        if self.action == "kept":
            return (
                f"kept your changed {self.path}; the new version is in {self.other} "
                "(--force replaces yours, keeping it as .bak)"
            )
        if self.action == "replaced":
            return f"replaced your changed {self.path} (yours is now {self.other})"
        return {"created": "installed", "updated": "updated", "unchanged": "already up to date:"}[self.action] + (
            f" {self.path}"
        )


def stamped(text: str) -> str:
    body = text if text.endswith("\n") else text + "\n"
    return body + STAMP.format(_hash(body))


def install(path: Path, text: str, force: bool = False) -> Installed:
    """Install `text` at `path` as described above."""
    done = _install(path, text, force)
    beside = path.with_name(path.name + ".new")
    if done.action != "kept" and beside.is_file() and _untouched(_read(beside) or ""):
        beside.unlink()  # an earlier install's new version, left beside a copy it no longer stands for
    return done


def _install(path: Path, text: str, force: bool) -> Installed:
    new = stamped(text)
    old = _read(path)
    if old is None:
        _write(path, new)
        return Installed(path, "created")
    if old == new:
        return Installed(path, "unchanged")
    if _untouched(old):
        _write(path, new)
        return Installed(path, "updated")
    if force:
        backup = path.with_name(path.name + ".bak")
        _write(backup, old)
        _write(path, new)
        return Installed(path, "replaced", backup)
    beside = path.with_name(path.name + ".new")
    _write(beside, new)
    return Installed(path, "kept", beside)


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None


def _untouched(text: str) -> bool:
    """True if `text` is a stamped copy whose content still has the hash it was written with."""
    body, _, last = text.rstrip("\n").rpartition("\n")
    prefix = STAMP.split("{}")[0]
    if not last.startswith(prefix):
        return False
    return last[len(prefix) :].split(" ", 1)[0] == _hash(body + "\n")


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _write(path: Path, text: str) -> None:
    """A complete file or none: written beside it, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
