"""`gpuq mcp`: an MCP server on stdio that gives an AI assistant the queue as typed tools and
resources (server.py, tools.py, changes.py), and `gpuq mcp install` (install.py), which tells a
client how to start it. Built on the MCP SDK (`pip install 'gpuq-spool[mcp]'`); no other command
imports the server or the SDK (command.py checks for it before anything else is imported), only
its help and options for the command table (entry.py).
"""
