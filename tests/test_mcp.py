"""`gpuq mcp` (issue 30): the server's tools and resources through the SDK's in-memory client (no
subprocess: the server runs in this process, on the spool of GPUQ_HOME), the skill and the tools
against each other, and `gpuq mcp install`. tests/test_mcp_stdio.py speaks to the real process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import REPO, WAIT_FOR_GO, Env, wait_for
from test_triage import _bytes_read as bytes_read

pytest.importorskip("mcp.server.mcpserver", reason="the MCP SDK 2 (the mcp extra, Python >= 3.10) is not installed")

import anyio  # noqa: E402  (after the skip: the SDK brings it)
from mcp import Client  # noqa: E402

from gpuq.cli.assistant import install, server, tools  # noqa: E402
from gpuq.cli.options import ADD  # noqa: E402
from gpuq.spool.logs import TAIL_LINES_MAX_BYTES  # noqa: E402

READ_ONLY = {"queue", "job", "log_tail", "eta", "gpus", "history", "triage", "add_dry_run"}
DESTRUCTIVE = {"cancel", "kill", "preempt"}


@pytest.fixture
def spool_env(gq: Env, monkeypatch: pytest.MonkeyPatch) -> Env:
    """The in-process server works on the test's spool, from the test's directory."""
    monkeypatch.setenv("GPUQ_HOME", str(gq.home))
    monkeypatch.chdir(gq.work)
    return gq


def talk(session: Callable[[Client], Any]) -> Any:
    """Run `session(client)` against a fresh server over the SDK's in-memory transport."""

    async def main() -> Any:
        async with Client(server.build()) as client:
            return await session(client)

    return anyio.run(main)


def call(name: str, arguments: dict[str, Any]) -> Any:
    return talk(lambda client: client.call_tool(name, arguments))


def value(result: Any) -> Any:
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


def error(result: Any) -> str:
    assert result.is_error
    (content,) = result.content
    assert "\n" not in content.text and "Traceback" not in content.text
    return content.text


# ---- the tools ----------------------------------------------------------------------------------


def test_the_tools_are_listed_with_their_hints() -> None:
    listed = {tool.name: tool for tool in talk(lambda client: client.list_tools()).tools}
    assert set(listed) == {tool.name for tool in tools.TOOLS}
    assert READ_ONLY | DESTRUCTIVE | {"add", "hold", "release", "retry", "resume", "edit"} == set(listed)
    for name, tool in listed.items():
        hints = tool.annotations
        assert hints.read_only_hint is (name in READ_ONLY), name
        assert hints.destructive_hint is (name in DESTRUCTIVE), name  # said even where false: true is the default
        assert ("confirm with the user" in tool.description) is (name not in READ_ONLY), name
    # every option of `gpuq add` is a parameter of the add tool, with its help
    parameters = listed["add"].input_schema["properties"]
    # add's options that are no request: how the CLI prints (-q, --json), --dry-run (a tool of its own)
    options = {opt.dest for opt in ADD.options if opt.dest not in ("quiet", "dry_run", "json")}
    assert options | {"cmd"} == set(parameters) and listed["add"].input_schema["required"] == ["cmd"]
    assert "GPU memory it needs" in parameters["gpu_mem"]["description"]
    assert listed["add_dry_run"].input_schema == listed["add"].input_schema | {"title": "add_dry_runArguments"}


def test_a_job_added_through_the_tool_is_in_the_spool(spool_env: Env) -> None:
    gq = spool_env
    added = value(call("add", {"cmd": ["echo", "{lr}"], "sweep": ["lr=1,2"], "gpus": 0, "priority": 3}))
    ids = [job["id"] for job in added["jobs"]]
    assert len(ids) == 2 and added["worker_running"] is False
    assert gq.files("pending") == [f"{i:06d}-work-echo-lr-{lr}.json" for i, lr in zip(ids, (1, 2))]
    assert [gq.job(i)["cmd"] for i in ids] == [["echo", "1"], ["echo", "2"]]
    assert {gq.job(i)["priority"] for i in ids} == {3}
    held = value(call("add", {"cmd": ["true"], "after": [ids[0]], "hold": True, "time": "1h"}))["jobs"][0]
    assert held["state"] == "held" and gq.job(held["id"])["after"] == [ids[0]]
    assert gq.job(held["id"])["time_limit"] == 3600
    # as the CLI refuses them, in one line
    assert error(call("add", {"cmd": ["true"], "after": [99]})) == "--after: no such job #99"
    assert "retries" in error(call("add", {"cmd": ["true"], "retries": -1}))
    assert "cmd Field required" in error(call("add", {"gpus": 1}))  # the SDK's check of the arguments, one line too
    assert len(gq.files("pending")) == 2 and gq.files("held") == [f"{held['id']:06d}-work-true.json"]


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("cancel", {"ids": [99]}),
        ("kill", {"ids": [99]}),
        ("hold", {"ids": [99]}),
        ("release", {"ids": [99]}),
        ("retry", {"ids": [99]}),
        ("resume", {"ids": [99]}),
        ("preempt", {"id": 99}),
        ("edit", {"id": 99, "changes": ["priority=5"]}),
        ("job", {"id": 99}),
        ("log_tail", {"id": 99}),
        ("triage", {"id": 99}),
    ],
)
def test_a_missing_job_is_a_tool_error_with_gpuqs_message(spool_env: Env, name: str, arguments: dict) -> None:
    assert error(call(name, arguments)) == "no such job #99"


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("hold", {"ids": [True]}),
        ("cancel", {"ids": [True]}),
        ("edit", {"id": True, "changes": ["priority=5"]}),
        ("job", {"id": True}),
        ("eta", {"id": True}),
        ("add", {"cmd": ["true"], "after": [True]}),
        ("hold", {"ids": [1.0]}),
        ("hold", {"ids": ["1"]}),
        ("add", {"cmd": ["true"], "gpus": True}),  # add's other integers too: true was one GPU
        ("add", {"cmd": ["true"], "priority": True}),
        ("add", {"cmd": ["true"], "cpus": True}),
        ("add", {"cmd": ["true"], "retries": True}),
        ("add", {"cmd": ["true"], "keep_checkpoints": True}),
    ],
)
def test_a_job_id_that_is_no_json_integer_is_refused(spool_env: Env, name: str, arguments: dict) -> None:
    """Python's bool is an int: true was taken as job #1, and acted on."""
    gq = spool_env
    first = gq.add("true")
    assert "Input should be a valid integer" in error(call(name, arguments))
    assert gq.files("pending") == [f"{first:06d}-work-true.json"] and gq.job(first)["priority"] == 0


@pytest.mark.parametrize(
    "name, arguments, unknown",
    [
        ("add", {"cmd": ["echo"], "name": "eval", "after_job": 1, "gpu_memory": "20G"}, "after_job, gpu_memory"),
        ("add_dry_run", {"cmd": ["true"], "gpu": 1}, "gpu"),
        ("hold", {"ids": [1], "id": 2}, "id"),
        ("job", {"id": 1, "envs": True}, "envs"),
        ("queue", {"al": True}, "al"),
    ],
)
def test_an_argument_a_tool_does_not_take_is_refused(spool_env: Env, name: str, arguments: dict, unknown: str) -> None:
    """As the CLI refuses an unknown option: the SDK dropped them, and a misspelt `after` queued a job
    waiting for nothing, on a whole GPU."""
    gq = spool_env
    first = gq.add("--hold", "true")
    assert error(call(name, arguments)).startswith(f"{name}: no such argument: {unknown} (")
    assert gq.files("pending") == [] and gq.files("held") == [f"{first:06d}-work-true.json"]


def test_the_changing_tools_act_on_the_queue(spool_env: Env) -> None:
    gq = spool_env
    first, second = gq.add("true"), gq.add("true")
    held = value(call("hold", {"ids": [first, 99]}))
    assert [j["id"] for j in held["jobs"]] == [first] and held["refused"] == [{"id": 99, "error": "no such job #99"}]
    assert gq.state_of(first) == "held"
    assert value(call("edit", {"id": first, "changes": ["priority=5"]}))["changed"] == ["priority"]
    assert gq.job(first)["priority"] == 5
    value(call("release", {"ids": [first]}))
    cancelled = value(call("cancel", {"ids": [first, second]}))["jobs"]
    assert [(j["id"], j["killed"]) for j in cancelled] == [(first, False), (second, False)]
    assert gq.state_of(first) == gq.state_of(second) == "cancelled"
    assert value(call("retry", {"ids": [second]}))["jobs"][0]["state"] == "pending"
    assert error(call("kill", {"ids": [second]})) == f"job #{second} is pending, not running"


def test_preempt_resume_and_kill_a_running_job(spool_env: Env) -> None:
    gq = spool_env
    gq.script("loop.py", WAIT_FOR_GO)  # runs until killed: `go` is never written
    job_id = gq.add("loop.py")
    gq.start_worker("--watch")
    wait_for(lambda: gq.state_of(job_id) == "running" and gq.job(job_id).get("pid"), what="the job to run")
    preempted = value(call("preempt", {"id": job_id, "timeout": 10}))
    assert (preempted["state"], preempted["checkpoint"]) == ("preempted", None) and gq.state_of(job_id) == "preempted"
    assert value(call("resume", {"ids": [job_id]}))["jobs"][0]["state"] == "pending"
    wait_for(lambda: gq.state_of(job_id) == "running" and gq.job(job_id).get("pid"), what="the job to run again")
    killed = value(call("kill", {"ids": [job_id]}))["jobs"]
    assert [(j["id"], j["state"]) for j in killed] == [(job_id, "cancelled")] and gq.state_of(job_id) == "cancelled"


@pytest.mark.parametrize("no_resume", [False, True])
def test_preempt_gives_the_checkpoint_it_continues_from(spool_env: Env, no_resume: bool) -> None:
    """A --no-resume job starts over whatever checkpoints it wrote: `preempt` answered its newest
    one as `checkpoint`, as if `resume` would continue from it. It is null for such a job."""
    gq = spool_env
    saves = "mkdir -p ckpt/step-1 && echo x > ckpt/step-1/model && exec sleep 60"
    job_id = gq.add(*(["--no-resume"] if no_resume else []), "--ckpt-glob", "ckpt/*", "--", "sh", "-c", saves)
    gq.start_worker("--watch")
    wait_for(lambda: (gq.work / "ckpt" / "step-1" / "model").exists(), 20, what="the job's checkpoint")
    preempted = value(call("preempt", {"id": job_id, "timeout": 10}))
    assert gq.job(job_id)["preemptions"][-1]["checkpoint"] == str(gq.work / "ckpt" / "step-1")
    assert preempted["checkpoint"] == (None if no_resume else str(gq.work / "ckpt" / "step-1")), preempted
    assert "no_resume" in next(tool.description for tool in tools.TOOLS if tool.name == "preempt")


def test_the_read_only_tools_give_the_clis_json(spool_env: Env) -> None:
    gq = spool_env
    job_id = gq.add("--name", "exp/a", "true")
    rows = value(call("queue", {"all": True}))
    cli_rows = gq.status_json()
    assert [r["id"] for r in rows] == [r["id"] for r in cli_rows] == [job_id]
    assert set(rows[0]) == set(cli_rows[0]) and rows[0]["state"] == "pending"
    cli = json.loads(gq.gpuq("show", "--json", str(job_id)).stdout)
    assert value(call("job", {"id": job_id, "env": True})) == cli
    shown = value(call("job", {"id": job_id}))  # the shell's variables by name only: their values may be tokens
    assert shown == dict({k: v for k, v in cli.items() if k != "shell_env"}, shell_env_names=sorted(cli["shell_env"]))
    assert "PATH" in shown["shell_env_names"]
    assert [row["id"] for row in value(call("eta", {}))] == [job_id]
    assert value(call("gpus", {})) == json.loads(gq.gpuq("gpus", "--json").stdout)
    assert value(call("history", {"by": "script"})) == json.loads(gq.gpuq("history", "--by", "script", "--json").stdout)
    assert "by:" in error(call("history", {"by": "week"}))


NOTIFY_URLS = ["tgram://123456:AAHsecretBOT/987", "json://user:hunter2@host.example/hook?token=S"]


def test_the_job_tool_gives_notify_urls_cut_as_show_prints_them(spool_env: Env) -> None:
    """The rest of a URL (bot token, password, query) is a secret: `show` prints scheme and host only."""
    gq = spool_env
    job_id = gq.add("--hold", "--notify", NOTIFY_URLS[0], "--notify", NOTIFY_URLS[1], "--", "true")
    assert gq.job(job_id)["notify_urls"] == NOTIFY_URLS  # the job keeps them whole, to send to
    for env in (False, True):
        shown = value(call("job", {"id": job_id, "env": env}))
        assert shown["notify_urls"] == ["tgram://...", "json://host.example"]
        assert "secret" not in json.dumps(shown) and "hunter2" not in json.dumps(shown)
    assert "tgram://..., json://host.example\n" in gq.gpuq("show", str(job_id)).stdout  # the same cut


def test_triage_names_a_cuda_oom_with_its_size(spool_env: Env) -> None:
    from test_triage import OOM_SCRIPT  # what PyTorch prints when the GPU runs out

    gq = spool_env
    gq.script("train.py", OOM_SCRIPT)
    job_id = gq.add("train.py", "--batch_size", "32")
    gq.gpuq("run")  # runs it in the foreground, then returns
    found = value(call("triage", {"id": job_id}))
    assert (found["state"], found["exit_code"]) == ("failed", 1)
    assert found["reason"] == "CUDA out of memory (tried to allocate 2.00 GiB)"
    assert found["log_tail"][-1].startswith("torch.OutOfMemoryError")
    assert f"gpuq retry {job_id}" in [fix["command"] for fix in found["fixes"]]


def test_the_dry_run_writes_nothing(spool_env: Env) -> None:
    from test_dry_run import tree  # every file under the spool: bytes, mtime, size

    gq = spool_env
    held = gq.add("--hold", "true")
    before = tree(gq.home)
    arguments = {"cmd": ["echo", "{lr}"], "sweep": ["lr=1,2"], "after": [held], "gpus": 0, "time": "2h"}
    plan = value(call("add_dry_run", arguments))
    assert tree(gq.home) == before
    assert [(job["id"], job["command"][-1]) for job in plan["jobs"]] == [(held + 1, "1"), (held + 2, "2")]
    assert all(job["would_start"]["now"] is False for job in plan["jobs"])  # after a held job
    assert error(call("add_dry_run", {"cmd": ["true"], "after": [99]})) == "--after: no such job #99"
    assert value(call("add", arguments))["jobs"][0]["id"] == held + 1  # no id was taken


def test_a_log_tail_stays_bounded_on_a_1_gib_log(spool_env: Env) -> None:
    gq = spool_env
    job_id = gq.add("bash", "-c", "for i in $(seq 1 700); do echo line $i; done")
    gq.gpuq("run")  # runs it in the foreground, then returns
    assert gq.state_of(job_id) == "done"
    tail = value(call("log_tail", {"id": job_id, "lines": 4}))  # the last line is gpuq's: how it ended
    assert tail["log"].splitlines()[:3] == ["line 698", "line 699", "line 700"] and tail["state"] == "done"
    assert value(call("log_tail", {"id": job_id, "lines": 10_000}))["log"].count("\n") == tools.LOG_LINES_MAX - 1

    log = gq.home / "logs" / f"{job_id:06d}.log"
    subprocess.run(["truncate", "-s", "1G", str(log)], check=True)  # sparse: a GiB of NULs, no line break
    with open(log, "a") as fh:
        fh.write("\nthe last line\n")
    read_before = bytes_read()
    tail = value(call("log_tail", {"id": job_id, "lines": 500}))
    read = bytes_read() - read_before  # counted by the kernel: load cannot change it (timed in bench/latencies.py)
    assert read < 4 * TAIL_LINES_MAX_BYTES, f"read {read} bytes"  # the tail, a few MiB at most: not the GiB
    assert tail["log"].endswith("\nthe last line") and tail["cut"] is True
    assert len(tail["log"]) <= tools.LOG_CHARS_MAX
    text = talk(lambda client: client.read_resource(f"gpuq://jobs/{job_id}/log")).contents[0].text
    assert text.endswith("\nthe last line") and len(text) <= tools.LOG_CHARS_MAX


def test_the_queue_tool_lists_a_damaged_job_file(spool_env: Env) -> None:
    """A pending file cut short (a crash) was in `gpuq status` but not in the queue tool: the
    assistant saw no trace of it. Now it is an entry saying `damaged`, as in `status --json`."""
    gq = spool_env
    job_id = gq.add("true")
    (gq.home / "pending" / "000007-cut.json").write_text('{"schema_version": 1, "id": 7, ')
    rows = value(call("queue", {}))
    assert rows == gq.status_json()
    assert [(r["id"], r["state"], r["damaged"]) for r in rows] == [(job_id, "pending", False), (7, "pending", True)]
    assert rows[1]["file"] == "000007-cut.json" and "not valid JSON" in rows[1]["reason"]
    assert "`damaged`" in next(tool for tool in tools.TOOLS if tool.name == "queue").description


def test_the_resources_read(spool_env: Env) -> None:
    gq = spool_env
    job_id = gq.add("echo", "hello")
    gq.gpuq("run")

    async def session(client: Client) -> Any:
        listed = await client.list_resources()
        templates = await client.list_resource_templates()
        queue = await client.read_resource("gpuq://queue")
        log = await client.read_resource(f"gpuq://jobs/{job_id}/log")
        try:
            await client.read_resource("gpuq://jobs/99/log")
        except Exception as exc:  # the SDK raises the server's error
            missing = str(exc)
        return listed, templates, queue, log, missing

    listed, templates, queue, log, missing = talk(session)
    assert [str(r.uri) for r in listed.resources] == ["gpuq://queue"]
    assert [t.uri_template for t in templates.resource_templates] == ["gpuq://jobs/{id}/log"]
    assert [row["id"] for row in json.loads(queue.contents[0].text)] == [job_id]
    assert "\nhello\n=== gpuq: exit 0" in "\n" + log.contents[0].text
    assert missing == "no such job #99"


# ---- the skill and the tools say the same ------------------------------------------------------


def skill_commands() -> set[str]:
    from test_skill import SKILL, command_lines

    return {line.split()[1] for line in command_lines(SKILL.read_text())}


def test_every_tool_stands_for_a_command_of_the_skill() -> None:
    in_skill = skill_commands()
    assert [tool.cli for tool in tools.TOOLS if tool.command not in in_skill] == []
    assert [tool.name for tool in tools.TOOLS if f"`{tool.cli}`" not in tool.description] == []


def test_every_command_of_the_skill_has_a_tool_or_a_reason() -> None:
    with_tools = {tool.command for tool in tools.TOOLS}
    assert sorted(skill_commands() - with_tools - set(tools.CLI_ONLY)) == []
    assert sorted(set(tools.CLI_ONLY) & with_tools) == []  # a command is one or the other
    assert sorted(set(tools.CLI_ONLY) - skill_commands()) == []  # no reason for what the skill does not say


# ---- only `gpuq mcp` imports the SDK ------------------------------------------------------------

PROBE = """
import sys
from gpuq.cli import main
code = main(sys.argv[1:])
print("MODULES " + " ".join(sorted(sys.modules)))
raise SystemExit(code)
"""


@pytest.mark.parametrize("command", [("status",), ("status", "--json"), ("add", "-q", "true"), ("show", "1")])
def test_other_commands_import_nothing_of_the_server(gq: Env, command: tuple[str, ...]) -> None:
    """With the SDK installed (no `-S`, unlike tests/test_startup_imports.py), a command other than
    `gpuq mcp` imports neither it nor what it brings."""
    gq.add("true")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *command], cwd=gq.work, env=gq.env, capture_output=True, text=True, timeout=60
    )
    modules = proc.stdout.rsplit("MODULES ", 1)[1].split()
    sdk = ("mcp", "mcp_types", "pydantic", "anyio")
    entry = ("gpuq.cli.assistant", "gpuq.cli.assistant.entry")  # the command's entry in the table, and its package
    assert [m for m in modules if m.split(".")[0] in sdk or m.startswith("gpuq.cli.assistant") and m not in entry] == []


def test_without_the_sdk_gpuq_mcp_says_what_to_install(gq: Env) -> None:
    """`-S`: an interpreter without site-packages, where the SDK is not importable."""
    env = dict(gq.env, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-S", "-m", "gpuq", "mcp"], cwd=gq.work, env=env, capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"gpuq mcp: the MCP SDK is not installed: {sys.executable} -m pip install '{REPO}[mcp]'\n"


# ---- gpuq mcp install ---------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    for name in ("CODEX_HOME", "XDG_CONFIG_HOME", "GPUQ_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(path))
    return path


def test_install_prints_what_each_client_needs(gq: Env, home: Path) -> None:
    out = gq.gpuq("mcp", "install", env=dict(gq.env, HOME=str(home))).stdout
    command = " ".join(install.server_command())
    assert f"claude mcp add --scope user -e GPUQ_HOME={gq.home} gpuq -- {command}" in out
    assert f"Codex: add to {home}/.codex/config.toml\n  [mcp_servers.gpuq]\n" in out
    assert f'"GPUQ_HOME": "{gq.home}"' in out and "Claude Desktop: add to" in out
    assert not any(home.iterdir())  # printed only


def test_install_write_keeps_the_users_codex_config(home: Path) -> None:
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    mine = 'model = "o3"\n\n[mcp_servers.other]\ncommand = "other"\n'
    config.write_text(mine)
    assert install.write("codex", force=False).startswith(f"added the gpuq MCP server to {config}")
    text = config.read_text()
    assert text.startswith(mine) and text.endswith(install.toml_table())
    (backup,) = home.joinpath(".codex").glob("config.toml.bak-*")
    assert backup.read_text() == mine
    assert install.write("codex", force=False).endswith("nothing to do") and config.read_text() == text

    changed = text.replace('args = ["mcp"]', 'args = ["mcp", "--other"]')
    config.write_text(changed)
    with pytest.raises(install.Refused, match=r"different \[mcp_servers.gpuq\] table; --force replaces it"):
        install.write("codex", force=False)
    assert config.read_text() == changed
    install.write("codex", force=True)
    assert config.read_text() == mine + "\n" + install.toml_table()
    if sys.version_info >= (3, 11):
        import tomllib

        servers = tomllib.loads(config.read_text())["mcp_servers"]
        assert servers["gpuq"]["args"][-1] == "mcp" and servers["other"] == {"command": "other"}


def test_install_write_keeps_the_users_claude_config(home: Path) -> None:
    config = home / ".claude.json"
    mine = {"numStartups": 3, "mcpServers": {"other": {"command": "x"}}}
    config.write_text(json.dumps(mine))
    os.chmod(config, 0o600)
    install.write("claude", force=False)
    written = json.loads(config.read_text())
    assert written["numStartups"] == 3 and written["mcpServers"]["other"] == {"command": "x"}
    assert written["mcpServers"]["gpuq"] == {"type": "stdio", "command": install.server_command()[0], "args": ["mcp"]}
    assert config.stat().st_mode & 0o777 == 0o600
    assert [json.loads(p.read_text()) for p in home.glob(".claude.json.bak-*")] == [mine]
    written["mcpServers"]["gpuq"]["args"] = ["other"]
    config.write_text(json.dumps(written))
    with pytest.raises(install.Refused, match="different 'gpuq' entry"):
        install.write("claude", force=False)
    desktop = install.write("claude-desktop", force=False)  # a file that did not exist: nothing to keep
    assert re.search(r"to \S+/Claude/claude_desktop_config.json; restart", desktop)


@pytest.mark.parametrize("client, name", [("codex", ".codex/config.toml"), ("claude", ".claude.json")])
def test_install_write_writes_through_a_symlinked_config(home: Path, client: str, name: str) -> None:
    """A config file linked from the user's dotfiles stays a link; the file it points to gets the entry."""
    target = home / "dotfiles" / name.replace("/", "-")
    target.parent.mkdir()
    target.write_text("{}" if client == "claude" else 'model = "o3"\n')
    link = home / name
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(target)
    install.write(client, force=True)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert "gpuq" in target.read_text() and list(target.parent.iterdir()) == [target]  # no temporary left


def test_an_add_whose_job_would_be_rejected_is_refused_and_queues_nothing(spool_env: Env) -> None:
    """Arguments the CLI cannot even spell (a `=` in a variable's name, a NUL) came back as queued
    jobs that the worker then rejected, or, held, that no command could see or remove."""
    for arguments in (
        {"cmd": ["echo", "x"], "env": {"A=B": "c"}},
        {"cmd": ["echo", "x\u0000y"]},
        {"cmd": ["echo", "x"], "env": {"X": "a\u0000b"}, "hold": True},
    ):
        said = error(call("add", arguments))
        assert said.startswith("cannot queue this job: ") and "\n" not in said, said
    assert spool_env.files("pending") == spool_env.files("held") == []


@pytest.mark.skipif(sys.version_info < (3, 11), reason="reads the config file with tomllib (Python >= 3.11)")
@pytest.mark.parametrize(
    "entry",
    [
        '[mcp_servers]\ngpuq = { command = "/old/gpuq", args = ["mcp"] }\n',
        'mcp_servers.gpuq.command = "/old/gpuq"\n',
        "[mcp_servers.'gpuq']\ncommand = \"/old/gpuq\"\n",
    ],
)
def test_install_write_never_declares_a_codex_entry_twice(home: Path, entry: str) -> None:
    import tomllib

    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(entry)
    for force in (False, True):
        try:
            install.write("codex", force=force)
        except install.Refused as exc:
            assert "'gpuq' entry" in str(exc) or "different [mcp_servers.gpuq] table" in str(exc)
        tomllib.loads(config.read_text())  # whatever happened, Codex can still read its file
    assert "/old/gpuq" in config.read_text() or install.toml_table() in config.read_text()
    config.write_text("x = [\n")
    with pytest.raises(install.Refused, match="is not TOML"):
        install.write("codex", force=True)
    assert config.read_text() == "x = [\n"
