"""A user's default destinations: GPUQ_NOTIFY (URLs separated by spaces or commas), else `notify = [...]`
in ~/.config/gpuq/config.toml; the worker's default when it is given no `--notify URL`.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from gpuq.core.job import is_url

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9 and 3.10: the tomli dependency
    import tomli as tomllib

ENV = "GPUQ_NOTIFY"


def config_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "gpuq", "config.toml")


def read_config() -> dict[str, Any]:
    """The settings of the config file ({} without one); OSError or ValueError if it cannot be read."""
    path = config_path()
    if not os.path.exists(path):
        return {}
    with open(path, "rb") as fh:
        return tomllib.load(fh)  # TOMLDecodeError is a ValueError


def default_urls() -> list[str]:
    """GPUQ_NOTIFY's URLs, else the config file's; ValueError for a bad URL or an unreadable file."""
    text = os.environ.get(ENV, "").strip()
    if text:
        return _checked([u for u in re.split(r"[\s,]+", text) if u], ENV)
    path = config_path()
    try:
        urls = read_config().get("notify", [])
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if isinstance(urls, str):
        urls = [urls]
    if not isinstance(urls, list):
        raise ValueError(f"{path}: notify must be a list of URLs")
    return _checked(urls, f"{path}: notify")


def _checked(urls: list[Any], where: str) -> list[str]:
    for url in urls:
        if not is_url(url):
            raise ValueError(f"{where}: not a URL such as ntfy://my-topic: {url!r}")
    return list(dict.fromkeys(urls))
