"""The honest baseline (issue 15): gpuq measured the way a user runs it.

A user runs the `gpuq` entry point of a venv that holds gpuq and its runtime dependencies, nothing
else. The interpreter the benchmark itself runs on may hold hundreds of packages and `.pth` start-up
hooks, which slow every `python` start two or three times and so hide gpuq's own cost inside the
baseline. So the benchmark builds such a venv from the checkout (`pip install .`, with whatever
index pip is configured for), keeps it under bench/.cache/ keyed by the checkout's content, and
times `<venv>/bin/gpuq` against `<venv>/bin/python -c pass`.

`python bench/honest.py` builds (or finds) it and prints its path. `revision_venv(REV)` does the same
for a git revision's tree (`bench/run.py --compare REV`), kept beside it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(__file__).resolve().parent / ".cache"
PACKAGE_PARTS = ("pyproject.toml", "README.md", "gpuq", "skill")  # what `pip install .` reads


def checkout_key(tree: Path = REPO) -> str:
    """A digest of the interpreter's version and every file the install takes from the tree."""
    digest = hashlib.sha256(sys.version.encode())
    for part in PACKAGE_PARTS:
        root = tree / part
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if _packaged(p))
        for path in files:
            digest.update(str(path.relative_to(tree)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _packaged(path: Path) -> bool:
    return path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"


def honest_venv(log: Optional[Path] = None, tree: Path = REPO, kind: str = "venv") -> Path:
    """The venv for the tree (the checkout) as it is now: built once (about 15 s), then reused.
    One venv of each `kind` is kept: "venv" for the checkout, "compare" for a `--compare` revision."""
    key = checkout_key(tree)
    for ready in sorted(CACHE.glob(f"*-{key}/.ready")):  # the same tree's venv, of either kind
        return ready.parent
    venv = CACHE / f"{kind}-{key}"
    CACHE.mkdir(exist_ok=True)
    for old in CACHE.glob(f"{kind}-*"):  # an older tree's venv: never measured again
        shutil.rmtree(old, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="gpuq-src-") as tmp:
        source = Path(tmp) / "gpuq"
        source.mkdir()
        for part in PACKAGE_PARTS:  # a clean copy: the build leaves build/ and *.egg-info beside it
            src = tree / part
            if not src.exists():  # an older revision may lack one
                continue
            if src.is_dir():
                shutil.copytree(src, source / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(src, source / part)
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=out, stderr=out)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-input", "-q", str(source)]
            subprocess.run(pip, check=True, stdout=out, stderr=out)
        except (OSError, subprocess.CalledProcessError):
            shutil.rmtree(venv, ignore_errors=True)
            raise
        finally:
            if log:
                out.close()  # type: ignore[union-attr]
    (venv / ".ready").write_text("")
    return venv


def revision_venv(rev: str, log: Optional[Path] = None) -> Path:
    """The venv of git revision `rev` of this repository (`git archive` of its tree), built as the
    checkout's is."""
    with tempfile.TemporaryDirectory(prefix="gpuq-rev-") as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        return honest_venv(log, tree=Path(tmp), kind="compare")


def packages(venv: Path) -> str:
    """`name version` of everything in the venv, for the report."""
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "freeze"],
        capture_output=True,
        text=True,
    )
    return ", ".join(line.replace("==", " ") for line in proc.stdout.split())


if __name__ == "__main__":
    print(honest_venv())
