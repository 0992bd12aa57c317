"""`gpuq status` and `gpuq add` are typed all day and called in loops by assistants: their start-up
must not pull in heavy modules (issue 15). Untimed: each command runs in a fresh interpreter without
site-packages (`-S`), and the modules it imported are compared with a deny-list, so a new import at
the top of a module on these paths fails here rather than as a few milliseconds in a benchmark.

bench/PROFILE.md says what each of these cost when they were on the path.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_probe, committed_repo

REPO = Path(__file__).resolve().parent.parent

DENIED = (
    # heavy or process-starting standard modules
    "subprocess",
    "threading",
    "dataclasses",
    "inspect",
    "shutil",
    "logging",
    "sqlite3",
    "hashlib",
    "socket",
    "uuid",
    "tempfile",
    "platform",
    "asyncio",
    # the ETA's old company: statistics (with decimal, fractions, random), pathlib (with urllib)
    "statistics",
    "decimal",
    "fractions",
    "random",
    "pathlib",
    "urllib",
    # (`typing`, `argparse`, `re`, `json`, `datetime` and `shlex` are on the path: the one parser
    # and plain Python, within the start-up budget: bench/RESULTS.md)
    "importlib",
    # third-party: a start-up must not need them at all
    "watchdog",
    "psutil",
    "pynvml",
    "matplotlib",
    "shtab",
    "starlette",
    "uvicorn",
    # gpuq's own heavy layers: the actions of other commands, the worker, the original's reader
    "gpuq.engine.lifecycle.actions",
    "gpuq.engine.original.reader",
    "gpuq.engine.views.history",
    "gpuq.core.transitions",
    "gpuq.run",
    "gpuq.cli.web",  # `gpuq web`: only when it runs
)
# Also denied when nothing runs or waits (and no GPU is there to show): the ETA machinery, the GPUs.
DENIED_WHEN_IDLE = (
    "array",
    "gpuq.engine.tracking.queue_eta",
    "gpuq.engine.tracking.eta",
    "gpuq.engine.tracking.progress",
    "gpuq.engine.tracking.checkpoints",
    "gpuq.system.gpus",
)

# Also denied to the commands that only read the spool (status, eta): they never rename a file
# without clobbering (ctypes) nor signal a process, and take no sweep (the id ranges the command
# line reads are in core/timespec.py).
DENIED_TO_READERS = ("ctypes", "signal", "gpuq.core.sweep")


def imported_by(gq: Any, *args: str) -> set[str]:
    """The modules the real CLI entry point adds to sys.modules, run in-process."""
    return set(cli_probe(gq, "before = set(sys.modules)", "sorted(set(sys.modules) - before)", *args))


def denied(modules: set[str], deny: tuple[str, ...] = DENIED) -> list[str]:
    return sorted(m for m in modules if any(m == d or m.startswith(d + ".") for d in deny))


@pytest.mark.parametrize(
    "command",
    [
        ("add", "-q", "true"),
        ("add", "-q", "--name", "n", "--priority", "2", "--after", "1", "bash", "-c", "exit 0"),
        ("status",),
        ("status", "-a"),
        ("status", "--json"),
        ("eta",),
    ],
)
def test_status_and_add_stay_light(gq: Any, command: tuple[str, ...]) -> None:
    # a queue with pending and finished jobs (more than the recent few, so that the finished-row
    # cache is read too), queued and cancelled through the CLI itself
    gq.gpuq("add", "-q", "--sweep", "x=" + ",".join(str(i) for i in range(12)), "true", "{x}")
    gq.gpuq("cancel", *(str(i) for i in range(1, 13)))
    gq.gpuq("add", "-q", "true")
    modules = imported_by(gq, *command)
    assert "gpuq.cli.parser" in modules  # the probe did run the CLI
    deny = DENIED if command[0] == "add" else DENIED + DENIED_TO_READERS
    assert not denied(modules, deny), f"`gpuq {' '.join(command)}` imports {denied(modules, deny)}"


@pytest.mark.parametrize("command", [("status",), ("status", "-a"), ("status", "--json"), ("add", "-q", "true")])
def test_no_eta_or_gpu_modules_for_an_idle_queue(gq: Any, command: tuple[str, ...]) -> None:
    """Only finished jobs, no worker, no GPU (the tests' machine has no NVIDIA driver): nothing to
    estimate or show, so none of that machinery is imported."""
    gq.gpuq("add", "-q", "--sweep", "x=" + ",".join(str(i) for i in range(12)), "true", "{x}")
    gq.gpuq("cancel", *(str(i) for i in range(1, 13)))
    modules = imported_by(gq, *command)
    deny = DENIED + DENIED_WHEN_IDLE
    assert "gpuq.engine.schedule.gpuview" in modules or command[0] == "add"  # the probe got as far as the GPUs
    assert not denied(modules, deny), f"`gpuq {' '.join(command)}` imports {denied(modules, deny)}"


def test_a_running_job_is_estimated_without_heavy_imports(gq: Any) -> None:
    """The progress path of a running job (the ETA machinery, its log read) imports nothing denied."""
    from conftest import WAIT_FOR_GO, wait_for

    gq.script("steps.py", "print('Step 3/10', flush=True)\n" + WAIT_FOR_GO)
    job_id = gq.add("steps.py")
    gq.start_worker()
    wait_for(lambda: "Step 3/10" in gq.log(job_id), 15, what="the job's first step")
    for command in (("status",), ("status", "--json"), ("eta",)):
        modules = imported_by(gq, *command)
        assert "gpuq.engine.tracking.eta" in modules  # the probe did estimate the running job
        deny = DENIED + DENIED_TO_READERS
        assert not denied(modules, deny), f"`gpuq {' '.join(command)}` imports {denied(modules, deny)}"
    (gq.work / "go").write_text("")


def test_history_reads_the_index_without_dataclasses(gq: Any) -> None:
    """`gpuq history` reads every finished row: its records and groups are plain classes, so it
    pays neither `dataclasses` nor `inspect` on top."""
    gq.gpuq("add", "-q", "--sweep", "x=" + ",".join(str(i) for i in range(12)), "true", "{x}")
    gq.gpuq("cancel", *(str(i) for i in range(1, 13)))
    modules = imported_by(gq, "history")
    assert "gpuq.engine.views.history" in modules  # the probe did run history
    assert not denied(modules, ("dataclasses", "inspect", "statistics")), denied(modules, ("dataclasses", "inspect"))


def test_a_waiting_job_needs_no_new_index_while_done_is_unchanged(gq: Any) -> None:
    """The start of a waiting job is estimated from its command's earlier run times, read from the
    index of finished jobs; while done/ is settled and unchanged, `status` neither lists nor
    rewrites it."""
    import os
    import time

    gq.add("true")
    gq.gpuq("run")  # one finished job, then it returns
    gq.add("true")  # and the same command waiting (no worker)
    then = time.time() - 60
    for state in ("done", "failed", "cancelled"):  # settled: one made under 2 s ago would be stamped later
        os.utime(gq.home / state, (then, then))
    imported_by(gq, "status")
    index = gq.home / "cache" / "finished-jobs"
    written = os.stat(index).st_mtime_ns
    modules = imported_by(gq, "status")
    assert "gpuq.engine.tracking.queue_eta" in modules  # the probe did estimate the waiting job
    assert not denied(modules), denied(modules)
    assert os.stat(index).st_mtime_ns == written


def test_eta_imports_no_table_rendering(gq: Any) -> None:
    """`gpuq eta` prints a line per job: its handler is a module of its own, without cli/render.py
    (and `unicodedata`, `bisect`) that `status` draws its table with."""
    gq.add("true")
    modules = imported_by(gq, "eta")
    assert "gpuq.engine.tracking.queue_eta" in modules  # the probe did estimate the waiting job
    assert not denied(modules, ("gpuq.cli.render", "gpuq.cli.cmd_status", "unicodedata", "bisect"))
    assert "gpuq.cli.render" in imported_by(gq, "status")


def test_the_probe_sees_the_eta_machinery_when_a_job_waits(gq: Any) -> None:
    """The idle check can fail: with a pending job, `status` estimates when it starts."""
    gq.add("true")
    assert "gpuq.engine.tracking.queue_eta" in imported_by(gq, "status")


def test_the_probe_sees_a_heavy_import(gq: Any) -> None:
    """The check can fail: `gpuq cancel` imports engine.actions, and the probe notices."""
    gq.add("true")
    assert "gpuq.engine.lifecycle.actions" in denied(imported_by(gq, "cancel", "1"))


def test_add_publishes_a_job_with_one_link_and_no_clobber(gq: Any) -> None:
    """The publish of a new job file: one link, the writer's mode, nothing left in tmp/, and a name that
    exists is refused and left as it was."""
    import os

    from gpuq.spool import Spool

    gq.gpuq("add", "-q", "true")
    (name,) = os.listdir(gq.home / "pending")
    st = os.stat(gq.home / "pending" / name)
    assert (st.st_nlink, st.st_mode & 0o777) == (1, 0o600)
    assert os.listdir(gq.home / "tmp") == []
    before = (gq.home / "pending" / name).read_bytes()
    with pytest.raises(FileExistsError):
        Spool(gq.home).files.place_new(str(gq.home / "pending" / name), b"{}", "job")
    assert (gq.home / "pending" / name).read_bytes() == before
    assert os.listdir(gq.home / "tmp") == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="unnamed files (O_TMPFILE) are Linux's")
def test_add_in_a_dirty_repository_loads_neither_openssl_nor_ctypes(gq: Any) -> None:
    """`add` asks git about the code (its diff's fingerprint is a CRC, not a sha256 from OpenSSL)
    and publishes the job file by linking an unnamed file (no renameat2 through ctypes)."""
    committed_repo(gq.work, {"train.py": "print(1)\n"})
    (gq.work / "train.py").write_text("print(2)\n")
    modules = imported_by(gq, "add", "-q", "true")
    assert "gpuq.system.gitinfo" in modules  # the probe did ask git
    deny = ("ctypes", "hashlib", "_hashlib")
    assert not denied(modules, deny), denied(modules, deny)
    job = gq.job(1)
    assert job["state"] == "pending" and job["code"]["dirty"] is True and job["code"]["diff_hash"]


# Notes where the CLI, run in-process, called `compile()` from outside the import system:
# typing.NamedTuple compiles each field annotation given as a string (a module with `from __future__
# import annotations`), and the first compile() of a process sets up the syntax-tree types
# (bench/PROFILE.md section 16).
COMPILE_WATCH = """
import builtins
callers = []
original = builtins.compile
def compile(*args, **kwargs):
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.endswith("typing.py"):
        frame = frame.f_back
    where = frame.f_code.co_filename if frame is not None else "?"
    if not where.startswith("<frozen importlib"):  # a module imported from source (no bytecode)
        callers.append(f"{where}:{frame.f_lineno}")
    return original(*args, **kwargs)
builtins.compile = compile
"""


def compiled_by(gq: Any, *args: str) -> list[str]:
    return list(cli_probe(gq, COMPILE_WATCH, "callers", *args))


def test_the_everyday_commands_compile_no_source(gq: Any) -> None:
    """`status`, `status --json`, `eta` and `add` (in a dirty git repository) with a job running and
    one waiting: the named tuples on their path have real annotations, so nothing is compiled."""
    from conftest import WAIT_FOR_GO, wait_for

    committed_repo(gq.work, {"steps.py": "print('Step 3/10', flush=True)\n" + WAIT_FOR_GO})
    (gq.work / "steps.py").write_text((gq.work / "steps.py").read_text() + "# changed\n")
    job_id = gq.add("steps.py")
    gq.start_worker()
    wait_for(lambda: "Step 3/10" in gq.log(job_id), 15, what="the job's first step")
    gq.add("true")
    for command in (("status",), ("status", "--json"), ("eta",), ("add", "-q", "steps.py")):
        assert compiled_by(gq, *command) == [], command
    assert gq.job(3)["code"]["dirty"] is True  # the add did ask git
    (gq.work / "go").write_text("")


def test_the_compile_probe_sees_string_annotations(gq: Any) -> None:
    """The check can fail: `add --dry-run` imports the transitions, whose named tuples are declared
    with `from __future__ import annotations`, and the probe sees their annotations compiled."""
    assert any("transitions.py" in caller for caller in compiled_by(gq, "add", "--dry-run", "true"))
