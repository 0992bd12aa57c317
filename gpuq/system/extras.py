"""The command that installs one of gpuq's optional extras (`notify`, `plot`, `mcp`, `web`). `gpuq` on the
package index is another project, so the extra is installed from the source tree gpuq came from
(editable where gpuq was), else its own packages are named. Only called to say what is missing.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from importlib import metadata
from importlib.util import find_spec
from typing import Optional, Sequence
from urllib.parse import unquote, urlparse

DISTRIBUTION = "gpuq-spool"
# The packages of each extra, as pyproject.toml's [project.optional-dependencies] lists them
# (tests/test_cli_edges.py compares the two), for an installation whose source tree is gone.
NOTIFY_MISSING = "notifications to URLs need Apprise, which is not installed"  # and the command that installs it
PACKAGES = {
    "notify": ("apprise>=1.6",),
    "plot": ("matplotlib>=3.5",),
    "mcp": ("mcp>=2",),
    "web": ("starlette>=0.27", "uvicorn>=0.20"),
}


def install_command(extra: str) -> str:
    """`/venv/bin/python -m pip install [-e] '/src/gpuq[notify]'`, else `... install 'apprise>=1.6'`."""
    python = shlex.quote(sys.executable or "python3")
    tree, editable = source_tree()
    if tree is not None:
        return f"{python} -m pip install {'-e ' if editable else ''}{shlex.quote(f'{tree}[{extra}]')}"
    return f"{python} -m pip install {' '.join(shlex.quote(p) for p in PACKAGES.get(extra, (extra,)))}"


def source_tree() -> tuple[Optional[str], bool]:
    """The directory gpuq can be installed from again (its pyproject.toml names this distribution),
    and whether the installation there is editable: the one this gpuq is imported from (a
    checkout, or an editable install), else the one pip recorded in direct_url.json (PEP 610)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above gpuq/system/
    recorded, editable = _recorded()
    if _is_tree(here):
        return here, editable and recorded is not None and os.path.realpath(recorded) == os.path.realpath(here)
    if recorded is not None and _is_tree(recorded):
        return recorded, editable
    return None, False


def _recorded() -> tuple[Optional[str], bool]:
    """The local directory pip installed this distribution from, and whether editable."""
    try:  # the first of its metadata on the path that says where it came from (an egg-info in a checkout does not)
        texts = (dist.read_text("direct_url.json") for dist in metadata.distributions(name=DISTRIBUTION))
        found = json.loads(next((text for text in texts if text), "null"))
    except (ValueError, OSError):
        return None, False
    url = found.get("url") if isinstance(found, dict) else None
    if not isinstance(url, str) or not url.startswith("file://"):
        return None, False
    info = found.get("dir_info")
    return unquote(urlparse(url).path), isinstance(info, dict) and info.get("editable") is True


def _is_tree(directory: str) -> bool:
    try:
        with open(os.path.join(directory, "pyproject.toml"), encoding="utf-8") as fh:
            return f'name = "{DISTRIBUTION}"' in fh.read()
    except OSError:
        return False


def notify_missing() -> Optional[str]:
    """Why `--notify URL` cannot be served here and the command that fixes it; None when Apprise is
    there (looked for, never imported: it is slow to import)."""
    try:
        found = find_spec("apprise") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"{NOTIFY_MISSING}: {install_command('notify')}"


def unknown_to_apprise(urls: Sequence[str]) -> Optional[str]:
    """The first of `urls` Apprise cannot send to (a misspelt scheme: `nfty://`), found when it is
    given, not when the job has ended; None when it knows them all, or is missing (`notify_missing`)."""
    try:
        import apprise  # the notifications subsystem, slow to import (a second or more): only for URLs typed now
    except ImportError:
        return None
    return next((url for url in urls if not apprise.Apprise().add(url)), None)
