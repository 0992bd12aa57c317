"""`gpuq mcp` (the server, imported only once the SDK is known to be there) and `gpuq mcp install`:
what a client needs to start it (GPUQ_HOME too: a client starts servers with its own environment),
printed or, with --write, added to its configuration file (Codex's TOML as text: Python has no TOML
writer)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Optional

from gpuq.cli.commands import MCP_CLIENTS
from gpuq.cli.parser import said_by
from gpuq.core.errors import Refused, UsageError
from gpuq.system.extras import install_command

if sys.version_info >= (3, 11):
    import tomllib  # to read a config file that is already there
else:  # Python 3.10 and older: the text is compared instead
    tomllib = None

NAME = "gpuq"  # the server's name in every client's configuration


def cmd_mcp(args: argparse.Namespace) -> int:
    problem = sdk_problem()
    if args.action == "install":
        if problem:  # the lines are right all the same: the SDK may be installed afterwards
            print(f"note: {problem}", file=sys.stderr)
        if not args.write:
            for client in [args.client] if args.client else MCP_CLIENTS:
                print("\n".join(instructions(client)))
            return 0
        if not args.client:
            raise UsageError(f"--write needs --client ({', '.join(MCP_CLIENTS)})")
        print(write(args.client, args.force))
        return 0
    if args.client or args.write or args.force:
        raise UsageError("--client, --write and --force go with `gpuq mcp install`")
    if problem:
        raise said_by("gpuq mcp", Refused(problem))
    from gpuq.cli.assistant import server  # the SDK (pydantic, anyio): only once it is known to be there

    server.serve()
    return 0


def sdk_problem() -> Optional[str]:
    if sys.version_info < (3, 10):
        return f"the MCP SDK needs Python 3.10 or newer; this gpuq runs on {sys.version.split()[0]}"
    if find_spec("mcp") is None:  # found without importing it (the SDK takes a second to import)
        return f"the MCP SDK is not installed: {install_command('mcp')}"
    try:
        installed = version("mcp")
    except PackageNotFoundError:  # importable but not installed by pip (a checkout): let it try
        return None
    if not installed.split(".")[0].isdigit() or int(installed.split(".")[0]) < 2:  # 1.x: FastMCP, another API
        return f"the MCP SDK 2 or newer is needed, mcp {installed} is installed: {install_command('mcp')} --upgrade"
    return None


def server_command() -> list[str]:
    """The script pip installed beside this interpreter, else `python -m gpuq`."""
    script = Path(sys.executable).parent / "gpuq"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script.absolute()), "mcp"]
    return [str(Path(sys.executable).absolute()), "-m", "gpuq", "mcp"]


def server_env() -> dict[str, str]:
    home = os.environ.get("GPUQ_HOME")
    return {"GPUQ_HOME": str(Path(home).expanduser().absolute())} if home else {}


def json_entry(client: str) -> dict[str, Any]:
    command = server_command()
    entry: dict[str, Any] = {"type": "stdio"} if client == "claude" else {}
    entry.update(command=command[0], args=command[1:])
    if server_env():
        entry["env"] = server_env()
    return entry


def config_path(client: str) -> Path:
    home = Path.home()
    if client == "claude":
        return home / ".claude.json"
    if client == "codex":
        return Path(os.environ.get("CODEX_HOME") or home / ".codex") / "config.toml"
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "Claude" / "claude_desktop_config.json"
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA") or home) / "Claude" / "claude_desktop_config.json"
    return Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "Claude" / "claude_desktop_config.json"


def toml_table() -> str:
    command = server_command()
    lines = [f"[mcp_servers.{NAME}]", f"command = {json.dumps(command[0])}", f"args = {json.dumps(command[1:])}"]
    env = server_env()
    if env:
        lines.append("env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }")
    return "\n".join(lines) + "\n"


def instructions(client: str) -> list[str]:
    path = config_path(client)
    if client == "claude":
        env = "".join(f" -e {k}={shlex.quote(v)}" for k, v in server_env().items())
        command = " ".join(shlex.quote(w) for w in server_command())
        return ["Claude Code: run", f"  claude mcp add --scope user{env} {NAME} -- {command}"]
    if client == "codex":
        return [f"Codex: add to {path}", *(f"  {line}" for line in toml_table().splitlines())]
    text = json.dumps({"mcpServers": {NAME: json_entry(client)}}, indent=2)
    return [f"Claude Desktop: add to {path}", *(f"  {line}" for line in text.splitlines())]


def write(client: str, force: bool) -> str:
    path = config_path(client)
    old = path.read_text(encoding="utf-8") if path.exists() else None
    new = _with_toml_entry(path, old, force) if client == "codex" else _with_json_entry(client, path, old, force)
    if new is None:
        return f"{path} already starts this gpuq: nothing to do"
    backup = None
    if old is not None:  # kept beside it, a stamp in its name (and a number if that one is taken)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        backup, n = path.with_name(f"{path.name}.bak-{stamp}"), 1
        while backup.exists():
            backup, n = path.with_name(f"{path.name}.bak-{stamp}-{n}"), n + 1
        shutil.copy2(path, backup)
    _replace(path, new)
    kept = f" (the old file is {backup})" if backup else ""
    return f"added the {NAME} MCP server to {path}{kept}; restart the client to use it"


def _with_json_entry(client: str, path: Path, old: Optional[str], force: bool) -> Optional[str]:
    try:
        config = json.loads(old) if old and old.strip() else {}
    except ValueError as exc:
        raise Refused(f"{path} is not JSON ({exc}); left as it is") from None
    if not isinstance(config, dict) or not isinstance(config.get("mcpServers", {}), dict):
        raise Refused(f"{path} does not hold an object with an mcpServers object; left as it is")
    servers = config.setdefault("mcpServers", {})
    entry = json_entry(client)
    if servers.get(NAME) == entry:
        return None
    if NAME in servers and not force:
        raise Refused(f"{path} has a different {NAME!r} entry ({json.dumps(servers[NAME])}); --force replaces it")
    servers[NAME] = entry
    return json.dumps(config, indent=2, ensure_ascii=False) + "\n"


TABLE = re.compile(r"""^\s*\[\s*mcp_servers\s*\.\s*("gpuq"|'gpuq'|gpuq)\s*(\.[^\]]*)?\]""")  # ours, or a sub-table
# `gpuq = {...}` under [mcp_servers], or `mcp_servers.gpuq.command = ...`: an entry that is no table of its own
KEY = re.compile(r"""^\s*(mcp_servers\s*\.\s*)?("gpuq"|'gpuq'|gpuq)\s*[.=]""")


def _with_toml_entry(path: Path, old: Optional[str], force: bool) -> Optional[str]:
    lines = (old or "").splitlines(keepends=True)
    found = _toml_entry(path, old or "")
    if not any(TABLE.match(line) for line in lines):
        if found is not None or any(KEY.match(line) for line in lines):
            if found == _toml_entry(path, toml_table()):
                return None
            raise Refused(f"{path} has a {NAME!r} entry that is not a [mcp_servers.{NAME}] table; change it by hand")
        text = "".join(lines)
        return text + ("\n" if text and not text.endswith("\n") else "") + ("\n" if text else "") + toml_table()
    kept: list[str] = []
    dropped: list[str] = []
    dropping = False
    for line in lines:
        if line.lstrip().startswith("["):
            dropping = bool(TABLE.match(line))
        (dropped if dropping else kept).append(line)
    if _same_table("".join(dropped), toml_table()):
        return None
    if not force:
        raise Refused(f"{path} has a different [mcp_servers.{NAME}] table; --force replaces it")
    text = "".join(kept).rstrip("\n")
    return (text + "\n\n" if text else "") + toml_table()


def _toml_entry(path: Path, text: str) -> Optional[dict]:
    """The `mcp_servers.gpuq` entry of a TOML text, None without one or without tomllib (Python 3.10)."""
    if tomllib is None:
        return None
    try:
        servers = tomllib.loads(text).get("mcp_servers", {})
    except ValueError as exc:
        raise Refused(f"{path} is not TOML ({exc}); left as it is") from None
    entry = servers.get(NAME) if isinstance(servers, dict) else None
    return entry if isinstance(entry, dict) else None


def _same_table(found: str, ours: str) -> bool:
    if tomllib is None:
        meaningful = [line.strip() for line in found.splitlines() if line.strip() and not line.strip().startswith("#")]
        return meaningful == ours.strip().splitlines()
    try:
        return tomllib.loads(found) == tomllib.loads(ours)
    except ValueError:
        return False


def _replace(path: Path, text: str) -> None:
    path = Path(os.path.realpath(path))  # a link into the user's dotfiles stays a link: its target is written
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    tmp = path.with_name(f".{path.name}.gpuq-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
