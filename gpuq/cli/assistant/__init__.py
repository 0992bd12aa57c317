"""`gpuq mcp`: an MCP server on stdio, the queue as typed tools for an AI assistant. No other
command imports the server or the SDK, only its help and options for the command table (entry.py).
"""
