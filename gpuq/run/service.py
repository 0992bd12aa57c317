"""A systemd user service that keeps a `gpuq run --watch --recover` worker up: the unit's text, and
writing or removing it (the CLI prints the systemctl commands). The one decision that matters is
`KillMode=process`: systemd's default would kill every job's supervisor with the worker.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Optional

from gpuq.core.errors import Refused

UNIT_NAME = "gpuq.service"
WEB_UNIT_NAME = "gpuq-web.service"  # `service install --web`: `gpuq web` beside the worker
WEB_PORT, WEB_PORTS = 8737, 1000  # its ports: see web_port
MARKER = "# Written by `gpuq service install`; `gpuq service uninstall` removes it."
LINGER_COMMAND = "loginctl enable-linger $USER"
ENABLE_COMMANDS = [
    "systemctl --user daemon-reload",
    "systemctl --user enable --now gpuq.service",
    LINGER_COMMAND,
]
LINGER_WHY = "keeps the service (and its jobs) running after you log out"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass
class InstallResult:
    path: Path  # the unit file
    action: str  # "created", "unchanged", "replaced", "removed" or "absent"
    summary: str  # one line for the user
    backup: Optional[Path] = None  # where a replaced unit was kept
    commands: list[str] = field(default_factory=list)  # what the user runs next, in order


def supported() -> Optional[str]:
    if not sys.platform.startswith("linux"):
        return f"systemd services exist only on Linux (this is {sys.platform})"
    if shutil.which("systemctl") is None:
        return "systemctl not found: this system does not use systemd"
    if not os.path.isdir("/run/systemd/system"):  # what sd_booted() checks
        return "systemd is not running here (no /run/systemd/system: a container, or WSL without systemd)"
    return None


def default_dir() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or ""
    base = Path(config) if os.path.isabs(config) else Path.home() / ".config"
    return base / "systemd" / "user"


def unit_text(
    gpuq_argv: list[str], spool_home: str, recover: bool = True, extra_env: Optional[dict[str, str]] = None
) -> str:
    """The unit running `<gpuq_argv> run --watch [--recover]`. ValueError for a relative path (systemd
    resolves nothing against a directory), a line break or NUL, or a bad environment name."""
    if not gpuq_argv or not os.path.isabs(gpuq_argv[0]):
        raise ValueError(f"the gpuq command must start with an absolute path, not {gpuq_argv[:1]}")
    if not os.path.isabs(spool_home):
        raise ValueError(f"the spool must be an absolute path, not {spool_home!r}")
    env = {"GPUQ_HOME": spool_home, **(extra_env or {})}
    bad = [name for name in env if not _ENV_NAME.match(name)]
    if bad:
        raise ValueError(f"not an environment variable name: {bad[0]!r}")
    unit = [
        f"Description=gpuq worker for the queue in {_specifiers(_one_line(spool_home))}",
        "# A worker that keeps failing at once (say, another worker holds the spool) is given up",
        "# after 5 starts in 5 minutes instead of being restarted forever.",
        "StartLimitIntervalSec=300",
        "StartLimitBurst=5",
    ]
    service = [
        "# Signal only the worker on stop and restart: the jobs' supervisors live in this control",
        "# group too, and must go on recording how their jobs end (the next worker waits for them).",
        "KillMode=process",
        "# A job killed by the kernel's OOM killer must not take the worker down with it.",
        "OOMPolicy=continue",
    ]
    environment = [f"Environment={_quoted(f'{name}={value}')}" for name, value in env.items()]
    argv = [*gpuq_argv, "run", "--watch", *(["--recover"] if recover else [])]
    return _unit(unit, environment, argv, service)


def web_unit_text(gpuq_argv: list[str], spool_home: str, port: int) -> str:
    """The unit running `<gpuq_argv> web --port PORT` beside the worker's (on 127.0.0.1: the token
    is in the spool, and `ssh -L` reaches it from a laptop). ValueError as unit_text."""
    worker = unit_text(gpuq_argv, spool_home)  # the same checks of the command and the spool
    environment = [line for line in worker.splitlines() if line.startswith("Environment=")]
    unit = [f"Description=gpuq web page of the queue in {_specifiers(_one_line(spool_home))}", f"After={UNIT_NAME}"]
    return _unit(unit, environment, [*gpuq_argv, "web", "--port", str(port)], [])


def _unit(unit: list[str], environment: list[str], argv: list[str], service: list[str]) -> str:
    lines = [
        MARKER,
        "[Unit]",
        *unit,
        "",
        "[Service]",
        "Type=exec",
        *environment,
        "ExecStart=" + " ".join(_exec_word(word, i == 0) for i, word in enumerate(argv)),
        "WorkingDirectory=~",
        "Restart=on-failure",
        "RestartSec=5",
        *service,
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def web_port(uid: int) -> int:
    """The page's port unless --web-port: fixed, so the URL stays the same across restarts, and
    the user's own (8737 + uid % 1000), since a user whose server held another's port would be
    sent the token in the URL its owner opens."""
    return WEB_PORT + uid % WEB_PORTS


def install_web_port(uid: int, dest_dir: Optional[Path] = None) -> int:
    """The page's port when --web-port does not say: the one the unit there names already, whichever
    (its server likely holds it, and one given by --web-port once was chosen: a reinstall must not
    move the URL), else the user's own, or when something listens there now, the first free one
    1000, 2000... above it, which is no other user's own."""
    unit = _read(Path(dest_dir or default_dir()) / WEB_UNIT_NAME) or ""
    named = re.search(r"^ExecStart=.* web --port (\d{1,5})$", unit, re.MULTILINE)
    if named and 0 < int(named.group(1)) < 65536:
        return int(named.group(1))
    ports = range(web_port(uid), 65536, WEB_PORTS)
    return next((port for port in ports if not port_taken(port)), ports[0])


def port_taken(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port now (or it cannot be had)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def install(
    dest_dir: Optional[Path] = None,
    gpuq_argv: Optional[list[str]] = None,
    spool_home: Optional[str] = None,
    recover: bool = True,
    force: bool = False,
    extra_env: Optional[dict[str, str]] = None,
) -> InstallResult:
    """Write the unit. One written by gpuq is replaced (kept as `.bak`); any other only with `force`."""
    text = lambda argv, home: unit_text(argv, home, recover, extra_env)  # noqa: E731
    return _install(UNIT_NAME, dest_dir, gpuq_argv, spool_home, force, text, list(ENABLE_COMMANDS))


def install_web(
    port: int, dest_dir: Optional[Path] = None, spool_home: Optional[str] = None, force: bool = False
) -> InstallResult:
    """Write the web page's unit, as `install` writes the worker's."""
    commands = ["systemctl --user daemon-reload", f"systemctl --user enable --now {WEB_UNIT_NAME}"]
    return _install(WEB_UNIT_NAME, dest_dir, None, spool_home, force, partial(web_unit_text, port=port), commands)


def _install(
    name: str,
    dest_dir: Optional[Path],
    gpuq_argv: Optional[list[str]],
    spool_home: Optional[str],
    force: bool,
    text_of: Callable[[list[str], str], str],
    commands: list[str],
) -> InstallResult:
    path = Path(dest_dir or default_dir()) / name
    argv = gpuq_argv or [os.path.abspath(sys.executable), "-m", "gpuq"]  # a venv's python keeps its venv
    home = spool_home or os.path.abspath(os.path.expanduser(os.environ.get("GPUQ_HOME") or "~/.gpuq"))
    try:
        text = text_of(argv, home)
    except ValueError as exc:
        raise Refused(f"cannot write {path}: {exc}") from None
    old = _read(path)
    if old == text:
        return InstallResult(path, "unchanged", f"{path} is already this unit", commands=commands)
    if old is not None and MARKER not in old and not force:
        raise Refused(f"{path} exists and was not written by gpuq; look at it, then use --force to replace it")
    backup = None
    if old is not None:
        backup = path.with_name(path.name + ".bak")
        _write(backup, old)
    _write(path, text)
    if backup is None:
        return InstallResult(path, "created", f"wrote {path}", commands=commands)
    return InstallResult(path, "replaced", f"replaced {path} (the old one is {backup})", backup, commands)


def uninstall(dest_dir: Optional[Path] = None, force: bool = False, name: str = UNIT_NAME) -> InstallResult:
    """Remove the unit and its `default.target.wants` link; one gpuq did not write only with `force`."""
    directory = Path(dest_dir or default_dir())
    path = directory / name
    old = _read(path)
    if old is None:
        return InstallResult(path, "absent", f"no gpuq unit at {path}")
    if MARKER not in old and not force:
        raise Refused(f"{path} was not written by gpuq; not removed (use --force to remove it anyway)")
    wanted = directory / "default.target.wants" / name
    if wanted.is_symlink() and os.path.abspath(os.path.join(wanted.parent, os.readlink(wanted))) == str(path):
        wanted.unlink()
    path.unlink()
    commands = [f"systemctl --user stop {name}", "systemctl --user daemon-reload"]
    return InstallResult(path, "removed", f"removed {path}", commands=commands)


def _read(path: Path) -> Optional[str]:
    with suppress(FileNotFoundError):
        return path.read_text(encoding="utf-8", errors="replace")
    return None


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o644)  # a unit must be readable by the user manager whatever gpuq's umask
    os.replace(tmp, path)


def _one_line(value: str) -> str:
    if any(c in value for c in "\n\r\0"):
        raise ValueError(f"a line break or NUL in {value!r}")
    return value


def _specifiers(value: str) -> str:
    return value.replace("%", "%%")  # systemd expands %h, %u... in most settings


def _quoted(value: str) -> str:
    escaped = _one_line(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{_specifiers(escaped)}"'


def _exec_word(word: str, executable: bool) -> str:
    """One ExecStart word. In the arguments `$` would expand an environment variable, so it is
    doubled; systemd does not expand the executable's path (measured: `$$` there stays `$$`)."""
    plain = re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", word) and word != ";"
    word = _one_line(word) if executable else _one_line(word).replace("$", "$$")
    return _specifiers(word) if plain else _quoted(word)
