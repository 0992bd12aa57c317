"""The table of options (cli/options.py, cli/commands.py) is the one list: `gpuq run`'s options are
the worker's Settings and reach a background worker as typed; `add`'s are what engine.enqueue's
Request holds; every handler is named, whole, in the table. (The parser's reading of `add`:
tests/test_cli_quick.py.)"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from conftest import Env, wait_for

from gpuq.cli import cmd_worker, commands, options
from gpuq.cli.parser import parse
from gpuq.core.errors import UsageError
from gpuq.engine.lifecycle.enqueue import Request
from gpuq.run.worker import Settings
from gpuq.spool import Spool


def every_command() -> list[options.Command]:
    return [c for top in commands.COMMANDS for c in (top, *top.actions)]


def test_every_handler_is_named_whole_and_exists() -> None:
    """A reader who greps for `cmd_hold` finds the command that runs it."""
    import importlib

    table = "".join(Path(m.__file__).read_text() for m in (commands, options))
    handlers = [c.handler for c in every_command() if c.handler]
    for handler in handlers:
        assert f'"{handler}"' in table, handler
        module, _, name = handler.partition(":")
        assert callable(getattr(importlib.import_module("gpuq.cli" if module == "cli" else f"gpuq.cli.{module}"), name))
    modules = Path(commands.__file__).parent.glob("cmd_*.py")
    defined = {f"{p.stem}:{name}" for p in modules for name in re.findall(r"^def (cmd_\w+)", p.read_text(), re.M)}
    assert defined <= set(handlers)  # no handler that no command reaches


def test_an_option_is_named_as_argparse_names_it() -> None:
    for command in every_command():
        for opt in command.options:
            if not opt.positional and opt.flags != ("--urgent=force",):
                long = [f for f in opt.flags if f.startswith("--")] or list(opt.flags)
                assert opt.dest == long[0].lstrip("-").replace("-", "_"), opt.flags


def test_run_options_are_the_worker_settings() -> None:
    named = {opt.setting for opt in commands.RUN.options if opt.setting}
    assert named == {field.name for field in dataclasses.fields(Settings)}


def test_run_options_become_settings() -> None:
    line = ["run", "--gpus", "0, 2", "--foreign-mem-threshold", "2G", "--recover", "--notify"]
    line += ["--max-log-size", "1K", "--default-time", "90m", "--kill-grace", "2.5", "--on-finish", "echo x"]
    settings = Settings(**cmd_worker._settings(parse(line)))
    assert settings == Settings(
        gpus=["0", "2"],
        foreign_threshold_mib=2048,
        notify=True,
        on_finish="echo x",
        recover=True,
        max_log_bytes=1024,
        default_time=5400.0,
        kill_grace=2.5,
    )
    assert Settings(**cmd_worker._settings(parse(["run"]))) == Settings()


@pytest.mark.parametrize(
    "line, message",
    [
        (["--gpus", " , "], "--gpus needs a list such as 0 or 0,1"),
        (["--kill-grace", "-1"], "--kill-grace: expected seconds from 0 to 3600, got '-1'"),
        (["--default-time", "soon"], "--default-time"),
        (["--max-log-size", "lots"], "--max-log-size"),
        (["--foreign-mem-threshold", "x"], "--foreign-mem-threshold"),
    ],
)
def test_a_bad_run_option_is_a_usage_error(line: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        cmd_worker._settings(parse(["run", *line]))
    assert str(caught.value).startswith(message)


def test_a_background_worker_gets_the_options_as_typed(gq: Env) -> None:
    gq.gpuq("run", "--daemon", "--gpus", "0,1", "--kill-grace", "2", "--notify", "--on-finish", "true", timeout=30)
    pid = wait_for(lambda: (gq.gpuq("status").stdout.startswith("worker: running") or None) and _worker_pid(gq))
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        given = argv[argv.index("--watch") :]
        assert set(zip(given, given[1:])) >= {("--gpus", "0,1"), ("--kill-grace", "2"), ("--on-finish", "true")}
        assert "--notify" in given and "--daemon" not in given and "--recover" not in given
        assert "gpus: 0,1" in gq.gpuq("status").stdout
    finally:
        gq.gpuq("stop")


def _worker_pid(gq: Env) -> int:
    (worker,) = Spool(gq.home).workers.recorded()
    return worker["pid"]


def test_an_add_request_holds_every_add_option() -> None:
    printing = {"quiet", "dry_run", "json"}  # what `add` prints (and whether it queues), not what it asks for
    assert set(Request._fields) - {"umask", "shell_env"} == {opt.dest for opt in options.ADD.options} - printing


def test_a_refused_add_leaves_no_spool_behind(gq: Env) -> None:
    """The request is checked before the spool is opened (engine.enqueue.prepare, then publish)."""
    gq.script("train.py", "")
    for bad in (["--time", "soon"], ["--gpu-mem", "lots"], ["--gpus", "0", "--gpu-mem", "1G"], ["--begin", "x"]):
        proc = gq.gpuq("add", *bad, "train.py", check=False)
        assert (proc.returncode, proc.stdout) == (2, ""), (bad, proc.stderr)
    assert not gq.home.exists()
