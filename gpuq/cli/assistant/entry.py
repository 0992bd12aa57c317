"""`gpuq mcp`'s help and options, which cli/commands.py's entry of it takes from here (beside the
server, and keeping commands.py within 450 lines). It imports nothing but the table's vocabulary:
every command parsed by argparse imports it, and nothing of the server or the SDK comes with it."""

from __future__ import annotations

from gpuq.cli.options import FLAG, Opt

CLIENTS = ("claude", "claude-desktop", "codex")  # the clients `gpuq mcp install` knows

HELP = "an MCP server on stdio: the queue as tools for an AI assistant (needs the mcp extra)"
OPTIONS = (
    Opt("action", nargs="?", choices=("install",), help="install: how a client starts it"),
    Opt("--client", choices=CLIENTS, help="install: for this client only"),
    Opt("--write", kind=FLAG, help="install: add it to the client's configuration file (kept as .bak-TIME)"),
    Opt("--force", kind=FLAG, help="install --write: replace a different gpuq entry"),
)
