"""`gpuq import`, `skill`, `service`, `completion` and `demo`: what connects gpuq to the rest of the day."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import gpuq
from gpuq.cli import main
from gpuq.cli.commands import COMMANDS
from gpuq.cli.common import spool
from gpuq.cli.options import Command
from gpuq.cli.parser import build_parser, subparsers
from gpuq.core.errors import Refused, UsageError
from gpuq.engine.original import importer
from gpuq.run import service
from gpuq.system import installs


def cmd_import(args: argparse.Namespace) -> int:
    sp = spool(first_use_import=False)  # its report goes to stdout here
    with sp.import_lock():
        if args.path is not None:
            reports = [importer.import_queue(sp, Path(args.path).expanduser().absolute())]
        else:  # nothing left to import: what was imported, and what was not, said again
            reports = importer.import_found(sp) or importer.recorded(sp)
    if not reports:
        print(f"no queue of the original gpuq in {sp.home} (gpuq.db or queue.json); give its path")
    for report in reports:
        print("\n".join(report.lines()))
    return 0


def cmd_skill(args: argparse.Namespace) -> int:
    package = Path(gpuq.__file__).resolve().parent  # shipped in the package (gpuq/skill/), or a checkout's skill/
    found = [p for p in (package / "skill" / "gpuq.md", package.parent / "skill" / "gpuq.md") if p.is_file()]
    if not found:
        raise Refused("the skill file is missing from this installation (gpuq/skill/gpuq.md)")
    text = found[0].read_text(encoding="utf-8")
    if args.action == "show":
        sys.stdout.write(text)
        return 0
    dest = Path(args.dest).expanduser() if args.dest else Path.home() / ".claude" / "commands"
    result = installs.install(dest / "gpuq.md", text, force=args.force)
    print(result.summary())
    if result.action != "kept":
        print("in Claude Code, `/gpuq show the queue` (or /gpuq 看看队列) now runs it")
    return 0


def cmd_service(args: argparse.Namespace) -> int:
    if args.web_port is not None and not args.web:
        raise UsageError("--web-port goes with --web")
    if args.web_port == 0:  # a free port chosen anew at each start: the URL printed now would not last
        raise UsageError("--web-port: the service needs a fixed port (1 to 65535)")
    dest = Path(args.dest).expanduser() if args.dest else None
    # writing elsewhere (--dest) is allowed anywhere, e.g. to look at the unit
    if dest is None and (problem := service.supported()):
        raise Refused(f"a systemd user service is not supported here: {problem}")
    sp = spool()
    if args.action == "install":
        result = service.install(dest, spool_home=str(sp.home), recover=not args.no_recover, force=args.force)
        results = [result]
        if args.web:
            own = service.web_port(os.getuid())
            port = service.install_web_port(os.getuid(), dest) if args.web_port is None else args.web_port
            # said only of a port taken for that reason, not of one the installed unit named
            moved = port > own and (port - own) % service.WEB_PORTS == 0
            if args.web_port is None and moved and service.port_taken(own):
                print(f"gpuq service: port {own}, your own, is in use now: the page gets {port}", file=sys.stderr)
            results.append(service.install_web(port, dest, spool_home=str(sp.home), force=args.force))
            if results[-1].action != "unchanged" and service.port_taken(port):
                print(
                    f"gpuq service: port {port} is in use now: by your own `gpuq web`, or else by another "
                    "user's server, which would get your token: then install again with --web-port N",
                    file=sys.stderr,
                )
    else:
        results = [service.uninstall(dest, force=args.force)]
        web = service.uninstall(dest, force=args.force, name=service.WEB_UNIT_NAME)
        results += [web] if web.action != "absent" else []
    for result in results:
        print(result.summary)
        for command in result.commands:  # the linger line says once why it is there
            print(f"  {command}" + (f"  ({service.LINGER_WHY})" if command == service.LINGER_COMMAND else ""))
    if args.action == "install" and args.web:  # the token is the spool's, so the URL is known now
        print(f"the page, once started: http://127.0.0.1:{port}/#token={sp.web_token.get()}")
        print(f"  (from a laptop: ssh -L {port}:127.0.0.1:{port} this-host, then the same URL)")
    return 0


ID_ARGUMENTS = ("id", "ids", "jobs")  # positional and option arguments that take job ids
FILE_ARGUMENTS = ("cmd", "path", "python", "log", "plot")  # the script, the file imported, ...
DIR_ARGUMENTS = ("dir", "dest")


def cmd_completion(args: argparse.Namespace) -> int:
    """shtab's script from gpuq's own parser; job ids complete from the spool (`gpuq _ids`), file and
    directory arguments from the disk (bash's `-o bashdefault` alone completes no file names)."""
    import shtab  # an optional dependency, needed by this command only

    parser = build_parser()
    _complete(parser, COMMANDS, shtab)
    script = shtab.complete(parser, shell=args.shell).replace(_OPTION_FOUND, _OPTION_FOUND + _AFTER_SCRIPT)
    print(script.rstrip("\n"))  # with a newline: `>> ~/.bashrc` appends safely
    return 0


_OPTION_FOUND = "        _set_new_action $this_word false\n      fi\n"  # in shtab's bash loop over the words typed
_AFTER_SCRIPT = (  # once the script is typed, the words after it are its own (add refuses gpuq's options there)
    '      if [[ $current_action_nargs == "..." && $current_action_args_start_index -le $word_index ]]; then\n'
    "        current_option_strings=()\n"
    "      fi\n"
)


def _complete(parser: argparse.ArgumentParser, commands: tuple[Command, ...], shtab: Any) -> None:
    for command in commands:
        for name in command.names:
            sub = subparsers(parser)[name]
            for action in sub._actions:  # shtab reads `complete`
                if action.dest in ID_ARGUMENTS:
                    only = f" --state {','.join(command.id_states)}" if command.id_states else ""
                    action.complete = shtab.cmd(f"gpuq _ids{only} 2>/dev/null")  # type: ignore[attr-defined]
                elif action.dest in FILE_ARGUMENTS + DIR_ARGUMENTS:
                    action.complete = shtab.FILE if action.dest in FILE_ARGUMENTS else shtab.DIRECTORY  # type: ignore[attr-defined]
            _complete(sub, command.actions, shtab)


TRAIN = """import sys, time
steps = int(sys.argv[sys.argv.index("--steps") + 1])
for step in range(1, steps + 1):
    time.sleep(0.2)
    print(f"Step {step}/{steps} loss={1 / step:.3f}", flush=True)
open("model.txt", "w").write("trained\\n")
"""
EVAL = """import pathlib
print("evaluating", pathlib.Path("model.txt").read_text().strip(), "model: accuracy 0.93")
"""


def _run(args: list[str]) -> int:
    print(f"$ gpuq {shlex.join(args)}", flush=True)
    code = main(args)
    sys.stdout.flush()
    return code


def cmd_demo(_args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="gpuq-demo-"))
    project = root / "exp01"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    (project / "eval.py").write_text(EVAL)
    saved = os.environ.get("GPUQ_HOME")
    os.environ["GPUQ_HOME"] = str(root / "spool")
    print(f"demo spool: {root / 'spool'} (removed at the end)")
    try:
        py = ["--python", sys.executable, "--dir", str(project)]
        steps = [
            ["add", *py, "train.py", "--steps", "5"],
            ["add", *py, "--after", "1", "eval.py"],
            ["add", "--dir", str(project), "--name", "exp01/report", "--after", "2", "ls", "-1"],
            ["status"],
            ["run"],
            ["status"],
            ["log", "2", "-n", "3"],
        ]
        return 0 if all(_run(step) == 0 for step in steps) else 1  # stops at the first that fails
    finally:
        if saved is None:
            os.environ.pop("GPUQ_HOME", None)
        else:
            os.environ["GPUQ_HOME"] = saved
        shutil.rmtree(root, ignore_errors=True)
