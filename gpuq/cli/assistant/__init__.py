"""`gpuq mcp`: an MCP server on stdio, the queue as typed tools for an AI assistant. No other
command imports the server or the SDK (its help and options are in the command table)."""
