"""The MCP server of `gpuq mcp`: the tools of tools.py and two resources. An error is the tool's
error carrying gpuq's one-line message, never a traceback.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Awaitable, Callable

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import INTERNAL_ERROR, PARSE_ERROR, CallToolResult, ErrorData, JSONRPCError, TextContent, ToolAnnotations
from pydantic import ValidationError

from gpuq import __version__
from gpuq.cli.assistant import tools
from gpuq.cli.common import first_use_import_report
from gpuq.core.errors import GpuqError
from gpuq.core.words import utf8

INSTRUCTIONS = (
    "gpuq is the GPU job queue of this machine. The read-only tools "
    f"({', '.join(tool.name for tool in tools.READING)}) are safe to call at any time; every other tool "
    "changes the queue: say what it will do and ask the user first. Errors are gpuq's one-line messages: "
    "report them, do not retry the same call. Nothing starts unless a worker runs (the queue tool's jobs "
    "wait; `gpuq run --daemon` in a shell starts one). A result, a resource or an error may end with lines "
    "beginning `gpuq: `, the import of the original gpuq's queue found in the spool: tell the user what they say."
)


def build() -> MCPServer:
    server = MCPServer(
        "gpuq", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING", middleware=[one_line_errors]
    )
    for tool in tools.TOOLS:
        read = tool.effect == tools.READ  # said in full: the protocol's defaults for the others are destructive
        hints = {"read_only_hint": read, "destructive_hint": tool.effect == tools.DESTROY, "idempotent_hint": read}
        annotations = ToolAnnotations(title=tool.cli, open_world_hint=False, **hints)
        server.add_tool(_handler(tool), name=tool.name, description=tool.description, annotations=annotations)
    server.resource(
        "gpuq://queue",
        name="queue",
        description="The queue as `gpuq status --json` gives it: one object per job or damaged job file.",
        mime_type="application/json",
    )(_queue)
    server.resource(
        "gpuq://jobs/{id}/log",
        name="job log",
        description=f"The last {tools.LOG_LINES_DEFAULT} lines of a job's log, read from its end.",
        mime_type="text/plain",
    )(_log)
    return server


def serve() -> None:
    if sys.stdin.isatty():  # a person typed it: say what it is, on stderr (stdout is the protocol's)
        print("gpuq mcp: an MCP server speaking on stdin/stdout, for an assistant to start", file=sys.stderr)
        print("(`gpuq mcp install` says how); Ctrl-C stops it", file=sys.stderr)
    anyio.run(_stdio, build())


async def _stdio(server: MCPServer) -> None:
    """`server.run("stdio")`, but a line that is no JSON is answered with JSON-RPC's parse error: the SDK
    only logs it (at debug level), and has no hook for it."""
    lowlevel = getattr(server, "_lowlevel_server", None)
    if lowlevel is None:  # an SDK without it: served as the SDK serves
        return await server.run_stdio_async()
    async with stdio_server() as (read, write):
        await lowlevel.run(ParseErrors(read, write), write, lowlevel.create_initialization_options())


class ParseErrors:
    """The stdio transport's messages, less the lines that are no JSON: each is answered, id null, as
    JSON-RPC 2.0 says. A blank line is no message: the SDK drops it, unanswered."""

    def __init__(self, read: Any, write: Any) -> None:
        self.read, self.write = read, write

    @property
    def last_context(self) -> Any:  # the sender's context, which the SDK reads off the stream
        return getattr(self.read, "last_context", None)

    async def receive(self) -> Any:
        item = await self.read.receive()
        while isinstance(item, ValidationError) and any(
            e["type"] == "json_invalid" and str(e.get("input", "")).strip() for e in item.errors()
        ):
            error = ErrorData(code=PARSE_ERROR, message="Parse error: a line that is no JSON")
            await self.write.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=None, error=error)))
            item = await self.read.receive()
        return item

    async def aclose(self) -> None:
        await self.read.aclose()

    def __aiter__(self) -> ParseErrors:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> ParseErrors:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _handler(tool: tools.Tool) -> Callable[..., CallToolResult]:

    def handler(**arguments: Any) -> CallToolResult:
        try:
            value = tool.run(**arguments)
        except Exception as exc:  # noqa: BLE001 - every failure is one line for the assistant
            return CallToolResult(content=[TextContent(type="text", text=one_line(exc))], is_error=True)
        text = json.dumps(value, ensure_ascii=False)
        structured = value if isinstance(value, dict) else {"result": value}
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)

    handler.__signature__ = tool.signature().replace(return_annotation=CallToolResult)  # type: ignore[attr-defined]  # the SDK reads it
    handler.__name__ = tool.name
    return handler


PARAMETERS = {tool.name: set(tool.signature().parameters) for tool in tools.TOOLS}


async def one_line_errors(ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """A tool's error in one line also where the SDK wrote it (pydantic's lines, less its links).
    Arguments a tool does not take are refused, as the CLI refuses an unknown option: the SDK would
    drop them (a misspelt `after` queues a job that waits for nothing). A tool call or a resource's
    read first imports the original gpuq's queue found in the spool, as a command's first use
    does, and its report ends the answer (on stderr no assistant would read it). Every answer is
    made writable as UTF-8 (`utf8`)."""
    params: Any = (ctx.params or {}) if ctx.method == "tools/call" else {}
    given = params.get("arguments")
    taken = PARAMETERS.get(params.get("name"))
    unknown = sorted(set(given) - taken) if isinstance(given, dict) and taken is not None else []
    if unknown:
        text = f"{params['name']}: no such argument: {', '.join(unknown)} (its input schema lists those it takes)"
        refused = CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        return refused.model_dump(by_alias=True, mode="json", exclude_none=True)
    imported = ""
    try:  # in a thread: it may wait for another's import
        if ctx.method in ("tools/call", "resources/read"):
            imported = "\n".join(await anyio.to_thread.run_sync(lambda: first_use_import_report(tools.spool())))
    except Exception as exc:  # noqa: BLE001 - a bad spool: the call's own error in one line, as the handlers say it
        if ctx.method == "tools/call":
            failed = CallToolResult(content=[TextContent(type="text", text=one_line(exc))], is_error=True)
            return failed.model_dump(by_alias=True, mode="json", exclude_none=True)
        raise MCPError(INTERNAL_ERROR, one_line(exc), {"uri": str((ctx.params or {}).get("uri"))}) from None
    try:
        result = await call_next(ctx)
    except MCPError as exc:  # a resource's error: the report's lines after its one line
        if imported:
            raise MCPError(exc.code, f"{exc.message}\n{imported}", exc.data) from None
        raise
    if isinstance(result, dict) and result.get("isError"):  # the error, not the report after it
        first = (result.get("content") or [None])[0]
        if isinstance(first, dict) and isinstance(first.get("text"), str):
            lines = (line.strip() for line in first["text"].splitlines())
            first["text"] = " ".join(line for line in lines if line and not line.startswith(PYDANTIC_LINK))
    if imported and isinstance(result, dict) and isinstance(result.get("contents"), list):
        result["contents"].append({"uri": (ctx.params or {}).get("uri"), "mimeType": "text/plain", "text": imported})
    elif imported and isinstance(result, dict) and isinstance(result.get("content"), list):
        result["content"].append({"type": "text", "text": imported})
    return utf8(result)


PYDANTIC_LINK = "For further information visit"


def one_line(exc: BaseException) -> str:
    if isinstance(exc, GpuqError):
        text = str(exc)
    elif isinstance(exc, OSError):
        text = (exc.strerror or str(exc)) + (f": {exc.filename}" if exc.filename else "")
    else:
        text = f"{type(exc).__name__}: {exc}"
    return utf8(" ".join(text.split()))


def _queue() -> str:
    return _resource(lambda: json.dumps(tools.queue(), ensure_ascii=False))


def _log(id: str) -> str:
    if not id.isdigit():
        raise ResourceError(f"not a job id: {id!r}")
    return _resource(lambda: tools.log_tail(int(id))["log"])


def _resource(read: Callable[[], str]) -> str:
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - said as the resource's error, in one line
        raise ResourceError(one_line(exc)) from None
