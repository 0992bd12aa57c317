"""`gpuq demo`: a small chain of example jobs in a throw-away spool, run by a real worker."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from gpuq.cli import main

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
        for step in steps:
            if _run(step) != 0:
                return 1
        return 0
    finally:
        if saved is None:
            os.environ.pop("GPUQ_HOME", None)
        else:
            os.environ["GPUQ_HOME"] = saved
        shutil.rmtree(root, ignore_errors=True)
