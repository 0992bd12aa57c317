"""`gpuq mcp` as a client starts it (issue 30): a process speaking newline-delimited JSON-RPC on its
stdin and stdout, spoken to by hand here (no SDK on this side), every read bounded in time."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import Env

pytest.importorskip("mcp.server.mcpserver", reason="the MCP SDK 2 (the mcp extra, Python >= 3.10) is not installed")


class Peer:
    """The server process, and a thread that hands over each line it writes on stdout."""

    def __init__(self, gq: Env) -> None:
        script = Path(sys.executable).with_name("gpuq")  # the installed command a client is told to start
        command = [str(script)] if script.exists() else [sys.executable, "-m", "gpuq"]
        self.proc = subprocess.Popen(
            [*command, "mcp"],
            cwd=gq.work,
            env=gq.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 0
        self.others: list[dict[str, Any]] = []  # what came while waiting for an answer: notifications, errors

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def send(self, message: dict[str, Any]) -> None:
        self.proc.stdin.write(json.dumps(dict(message, jsonrpc="2.0")) + "\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
        self.next_id += 1
        self.send({"id": self.next_id, "method": method, "params": params})
        while True:
            try:
                answer = json.loads(self.lines.get(timeout=timeout))
            except queue.Empty:
                raise AssertionError(f"no answer to {method} within {timeout}s; stderr: {self.stop()}") from None
            if answer.get("id") == self.next_id:  # notifications (logging) are not answers
                assert "error" not in answer, answer
                return answer["result"]
            self.others.append(answer)

    def stop(self) -> str:
        """Its stderr, once it has ended (killed if it still runs)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        return self.proc.stderr.read()


HELLO = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}


def test_gpuq_mcp_speaks_json_rpc_on_stdio(gq: Env) -> None:
    peer = Peer(gq)
    try:
        hello = peer.request("initialize", HELLO)
        assert hello["serverInfo"]["name"] == "gpuq" and "tools" in hello["capabilities"]
        peer.send({"method": "notifications/initialized"})

        listed = {tool["name"]: tool for tool in peer.request("tools/list", {})["tools"]}
        assert listed["queue"]["annotations"]["readOnlyHint"] is True
        assert listed["cancel"]["annotations"]["destructiveHint"] is True
        assert listed["add"]["annotations"] == dict(
            listed["add"]["annotations"], readOnlyHint=False, destructiveHint=False
        )

        added = peer.request("tools/call", {"name": "add", "arguments": {"cmd": ["true"], "gpus": 0}})
        assert not added.get("isError"), added
        (job,) = json.loads(added["content"][0]["text"])["jobs"]
        assert gq.files("pending") == [f"{job['id']:06d}-work-true.json"]

        missing = peer.request("tools/call", {"name": "cancel", "arguments": {"ids": [99]}})
        assert missing["isError"] is True and missing["content"][0]["text"] == "no such job #99"

        peer.proc.stdin.close()  # the client goes away: the server ends
        assert peer.proc.wait(timeout=15) == 0
        assert "Traceback" not in peer.stop()
    finally:
        peer.stop()


def test_an_argument_that_is_no_utf8_is_answered_escaped_as_status_json_does(gq: Env) -> None:
    """A Latin-1 file name among a job's words reads as a lone surrogate: the SDK's writer failed on it,
    so `queue`, `job` and `gpuq://queue` got no answer and the server exited 1, on every restart."""
    job_id = gq.add("--hold", "--", "cat", "caf\udce9.csv")
    peer = Peer(gq)
    try:
        peer.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}},
        )
        peer.send({"method": "notifications/initialized"})
        queue_text = peer.request("tools/call", {"name": "queue", "arguments": {}})["content"][0]["text"]
        assert json.loads(queue_text) == gq.status_json()  # `\udce9` in the text, as the CLI prints it
        assert "\\udce9" in queue_text
        shown = peer.request("tools/call", {"name": "job", "arguments": {"id": job_id}})
        assert shown["structuredContent"]["cmd"][-1] == "caf\\udce9.csv"
        (resource,) = peer.request("resources/read", {"uri": "gpuq://queue"})["contents"]
        assert json.loads(resource["text"]) == gq.status_json()
        assert peer.request("tools/call", {"name": "gpus", "arguments": {}}).get("isError") is not True
        peer.proc.stdin.close()
        assert peer.proc.wait(timeout=15) == 0
        assert "Traceback" not in peer.stop()
    finally:
        peer.stop()


def test_a_line_that_is_no_json_is_answered_with_a_parse_error_and_the_server_goes_on(gq: Env) -> None:
    """JSON-RPC 2.0 answers a line that is no JSON with its parse error (-32700, id null): the SDK only
    logged it, and a client waited for an answer that never came. A blank line is no message: no answer."""
    peer = Peer(gq)
    try:
        peer.request("initialize", HELLO)
        peer.send({"method": "notifications/initialized"})
        peer.proc.stdin.write('{"jsonrpc": "2.0", "id": 7, "method": \n\n')  # cut short, then a blank line
        assert "queue" in {tool["name"] for tool in peer.request("tools/list", {})["tools"]}
        errors = [answer for answer in peer.others if "error" in answer]
        assert [(e["id"], e["error"]["code"]) for e in errors] == [(None, -32700)], peer.others
        peer.proc.stdin.close()
        assert peer.proc.wait(timeout=15) == 0
        assert "Traceback" not in peer.stop()
    finally:
        peer.stop()


def test_a_tool_says_the_first_use_import_of_the_original_queue_in_its_result(gq: Env) -> None:
    """The original gpuq's queue.json in the spool was imported by the first tool call, its report on
    stderr, which no assistant reads. Now the result says it after the tool's JSON. Two calls at once
    (as assistants make them) imported it side by side, each saying the other's jobs were not imported:
    now one imports and says so, the other waits for it."""
    gq.home.mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "data" / "original" / "queue.json", gq.home)
    peer = Peer(gq)
    try:
        peer.request("initialize", HELLO)
        peer.send({"method": "notifications/initialized"})
        calls = {101: ("queue", {"all": True}), 102: ("job", {"id": 3})}
        for n, (name, arguments) in calls.items():
            peer.send({"id": n, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
        results: dict[int, Any] = {}
        while len(results) < len(calls):
            answer = json.loads(peer.lines.get(timeout=30))
            results.update({answer["id"]: answer["result"]} if answer.get("id") in calls else {})
        assert sorted(job["id"] for job in json.loads(results[101]["content"][0]["text"])) == [1, 2, 3]
        assert results[102]["structuredContent"]["id"] == 3
        said = [content["text"] for result in results.values() for content in result["content"][1:]]
        assert said == [
            f"gpuq: imported the original gpuq's queue {gq.home / 'queue.json'}: 1 done, 1 failed, 1 pending\n"
            "gpuq:   renamed queue.json -> queue.json.bak"
        ], said
        again = peer.request("tools/call", {"name": "job", "arguments": {"id": 3}})
        assert len(again["content"]) == 1
        peer.proc.stdin.close()
        assert peer.proc.wait(timeout=15) == 0
        assert "imported" not in peer.stop()  # said once, where the assistant reads it
    finally:
        peer.stop()


IMPORTED = (
    "gpuq: imported the original gpuq's queue {}: 1 done, 1 failed, 1 pending\n"
    "gpuq:   renamed queue.json -> queue.json.bak"
)


def started_on_the_original_queue(gq: Env) -> Peer:
    """The server, initialized, on a spool holding the original gpuq's queue.json (three jobs)."""
    gq.home.mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "data" / "original" / "queue.json", gq.home)
    peer = Peer(gq)
    peer.request("initialize", HELLO)
    peer.send({"method": "notifications/initialized"})
    return peer


def answer(peer: Peer, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The whole answer, an error too (Peer.request takes results only)."""
    peer.next_id += 1
    peer.send({"id": peer.next_id, "method": method, "params": params})
    while True:
        said = json.loads(peer.lines.get(timeout=30))
        if said.get("id") == peer.next_id:
            return said


@pytest.mark.parametrize("uri", ["gpuq://queue", "gpuq://jobs/3/log"])
def test_a_resource_read_first_imports_the_original_queue_and_says_so(gq: Env, uri: str) -> None:
    """An assistant reading the queue resource before any tool call got `[]` (and the log of job #3,
    "no such job #3"): only tool calls imported the original gpuq's queue. A read imports it too, its
    report a text item after the resource's own."""
    peer = started_on_the_original_queue(gq)
    try:
        contents = peer.request("resources/read", {"uri": uri})["contents"]
        assert len(contents) == 2, contents
        assert contents[1] == {"uri": uri, "mimeType": "text/plain", "text": IMPORTED.format(gq.home / "queue.json")}
        (again,) = peer.request("resources/read", {"uri": "gpuq://queue"})["contents"]  # said once
        assert sorted(job["id"] for job in json.loads(again["text"])) == [1, 2, 3]
        if uri == "gpuq://queue":
            assert contents[0]["text"] == again["text"]
    finally:
        peer.stop()


@pytest.mark.parametrize("where", ["tool", "resource"])
def test_an_error_keeps_the_import_report_in_lines(gq: Env, where: str) -> None:
    """A tool's error result is one line, and the import's report after it was flattened into one
    line too (`... 1 pending gpuq:   renamed ...`): only the error is. A resource's error says the
    report after its one line."""
    peer = started_on_the_original_queue(gq)
    report = IMPORTED.format(gq.home / "queue.json")
    try:
        if where == "tool":
            missing = peer.request("tools/call", {"name": "job", "arguments": {"id": 99}})
            assert missing["isError"] is True and missing["content"] == [
                {"type": "text", "text": "no such job #99"},
                {"type": "text", "text": report},
            ], missing
        else:
            error = answer(peer, "resources/read", {"uri": "gpuq://jobs/99/log"})["error"]
            assert error["message"] == f"no such job #99\n{report}", error
            again = answer(peer, "resources/read", {"uri": "gpuq://jobs/99/log"})["error"]
            assert again["message"] == "no such job #99"
    finally:
        peer.stop()


def test_a_bad_spool_is_a_tools_error_and_a_resources_error_in_one_line(gq: Env) -> None:
    """A spool others can write to came back, for every tool call and resource read, as a JSON-RPC
    error of code 0 with a traceback on stderr: the first-use import raised in the middleware. A
    tool call gets its error result again, a resource read its -32603 with the uri, in one line."""
    gq.home.mkdir(parents=True)
    gq.home.chmod(0o777)
    peer = Peer(gq)
    try:
        peer.request("initialize", HELLO)
        peer.send({"method": "notifications/initialized"})
        result = peer.request("tools/call", {"name": "queue", "arguments": {}})
        (said,) = result["content"]
        assert result["isError"] is True and "is writable by group or others" in said["text"], result
        assert "\n" not in said["text"]
        error = answer(peer, "resources/read", {"uri": "gpuq://queue"})["error"]
        assert error["code"] == -32603 and error["data"] == {"uri": "gpuq://queue"}, error
        assert error["message"] == said["text"]
        peer.proc.stdin.close()
        assert peer.proc.wait(timeout=15) == 0
        assert "Traceback" not in peer.stop()
    finally:
        peer.stop()
