"""`gpuq mcp` and `gpuq mcp install`. The server's modules are imported only once the SDK is known
to be there: without it, one line says what to install."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from typing import Optional

from gpuq.cli.parser import said_by
from gpuq.core.errors import Refused, UsageError
from gpuq.system.extras import install_command


def cmd_mcp(args: argparse.Namespace) -> int:
    if args.action == "install":
        from gpuq.cli.assistant import install  # the clients' files: only for `gpuq mcp install`

        return install.cmd_install(args, sdk_problem())
    if args.client or args.write or args.force:
        raise UsageError("--client, --write and --force go with `gpuq mcp install`")
    problem = sdk_problem()
    if problem:
        raise said_by("gpuq mcp", Refused(problem))
    from gpuq.cli.assistant import server  # the SDK (pydantic, anyio): only once it is known to be there

    server.serve()
    return 0


def sdk_problem() -> Optional[str]:
    """Why the MCP SDK cannot serve here (one line), or None."""
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
