"""`gpuq mcp`: an MCP server on stdio that gives an AI assistant the queue as typed tools and
resources (server.py, tools.py, changes.py), and `gpuq mcp install` (install.py), which tells a
client how to start it. Built on the MCP SDK (the `mcp` extra: command.py names the command that
installs it); no other command imports the server or the SDK (command.py checks for it before
anything else is imported), only its help and options for the command table (entry.py).
"""
