"""`gpuq mcp`'s help and options for cli/commands.py: every command imports it, so it imports
nothing of the server or the SDK."""

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
