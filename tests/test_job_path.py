"""ARCHITECTURE.md's "The path of one job" names real functions, and a real job goes through them.

Every gpuq process of the run (the `gpuq add`, the worker, the zygote and the supervisors it
forks) records which of gpuq's functions it called: a small module on PYTHONPATH installs a
`sys.setprofile` hook, and PYTHONWARNINGS names a warning class of that module, which makes every
interpreter import it at start-up, also the supervisors that run with `-S` (no site, so no
sitecustomize). Each function named in the section must exist and must have been called.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from conftest import wait_for

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("cli", "run", "engine", "spool", "system", "core")

TRACER = '''
import os, sys

_OUT = os.environ.get("GPUQ_TEST_TRACE")
_seen = set()


def _profile(frame, event, arg):
    if event != "call":
        return
    module = frame.f_globals.get("__name__", "")
    if not module.startswith("gpuq"):
        return
    code = frame.f_code
    key = module + ":" + getattr(code, "co_qualname", code.co_name)
    if key not in _seen:
        _seen.add(key)
        fd = os.open(_OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (key + "\\n").encode())
        finally:
            os.close(fd)


if _OUT:
    sys.setprofile(_profile)


class Hook(Warning):
    """Named in PYTHONWARNINGS so that every interpreter imports this module at start-up."""
'''


def path_section() -> str:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    start = text.index("## The path of one job")
    return text[start : text.index("\n## ", start + 1)]


def named_functions(section: str) -> list[str]:
    """Dotted names in backticks that start with a layer: `engine.lifecycle.enqueue.enqueue`."""
    layer = "|".join(LAYERS)
    names = re.findall(rf"`((?:{layer})(?:\.\w+)+)(?:\([^`]*\))?`", section)
    return list(dict.fromkeys(names))


def resolve(name: str) -> str:
    """`module.attr...` -> "gpuq.module:qualname" of the function it names."""
    import importlib

    parts = ("gpuq." + name).split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        obj = getattr(obj, "__func__", obj)
        return f"{obj.__module__}:{obj.__qualname__}"
    raise AssertionError(f"{name}: no such module")


def test_the_section_names_functions_that_exist() -> None:
    names = named_functions(path_section())
    assert len(names) >= 15, names  # the section is not empty or unparsed
    for name in names:
        assert callable_target(name), name


def callable_target(name: str) -> str:
    try:
        return resolve(name)
    except AttributeError as exc:
        raise AssertionError(f"ARCHITECTURE.md names `{name}`, which does not exist: {exc}") from None


def test_a_job_goes_through_the_functions_the_section_names(gq: Any, tmp_path: Path) -> None:
    tracer_dir = tmp_path / "tracer"
    tracer_dir.mkdir()
    (tracer_dir / "calltrace.py").write_text(TRACER)
    trace = tmp_path / "calls.txt"
    gq.env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(tracer_dir), gq.env.get("PYTHONPATH")])),
        PYTHONWARNINGS="default::calltrace.Hook",
        GPUQ_TEST_TRACE=str(trace),
    )
    # jobs that run a moment: a job that has ended before its supervisor looks has its pid recorded
    # with its end instead (spool_layout.md section 6)
    added = gq.add("sleep", "0.5")
    (gq.home / "pending" / "by-hand.json").write_text(json.dumps({"cmd": ["sleep", "0.5"]}))
    worker = gq.start_worker()
    wait_for(lambda: gq.state_of(added) == "done" and len(gq.files("done")) == 2, 30, what="both jobs done")
    wait_for(lambda: worker.poll() is not None, 30, what="the foreground worker's exit")
    called = set(trace.read_text().split())
    assert any(key.startswith("gpuq.run.") for key in called)  # the tracer ran in the worker too
    missed = [name for name in named_functions(path_section()) if resolve(name) not in called]
    assert not missed, f"named in ARCHITECTURE.md's path of one job but never called: {missed}"
