"""gpuq.core.failure: one line naming why a job failed, from realistic log tails and from the real
stderr of child processes that fail (Python, PyTorch's CPU build, bash, a segfault)."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest

from gpuq.core.failure import MAX_REASON, TAIL_BYTES, latest_attempt_lines, reason

OOM_HINT = "likely the kernel's OOM killer: check `dmesg`/`journalctl -k`"

HEADER = """\
=== gpuq: job #12 exp02/train lr=1e-4 seed=0 (attempt 1)
=== gpuq: cmd: /home/ana/exp02/.venv/bin/python train.py --lr 1e-4 --seed 0
=== gpuq: cwd: /home/ana/exp02  CUDA_VISIBLE_DEVICES=0
=== gpuq: started: 2026-12-02T14:03:11
"""
FOOTER = "=== gpuq: exit 1 at 2026-12-02T14:03:22 after 11.2s -> failed\n"

TQDM = (
    "\r  0%|          | 0/1000 [00:00<?, ?it/s]"
    "\r  1%|          | 10/1000 [00:04<06:40,  2.47it/s]"
    "\r  2%|▏         | 17/1000 [00:07<06:38,  2.47it/s]"
)

TORCH2_OOM = (
    HEADER
    + "Loading checkpoint shards: 100%|██████████| 2/2 [00:03<00:00,  1.52s/it]\n"
    + TQDM
    + """Traceback (most recent call last):
  File "/home/ana/exp02/train.py", line 88, in <module>
    main()
  File "/home/ana/exp02/train.py", line 71, in main
    loss = model(**batch).loss
           ^^^^^^^^^^^^^^
  File "/home/ana/exp02/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1751, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/home/ana/exp02/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1762, in _call_impl
    return forward_call(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/home/ana/exp02/.venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py", \
line 845, in forward
    logits = self.lm_head(hidden_states[:, slice_indices, :])
             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/home/ana/exp02/.venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 125, in forward
    return F.linear(input, self.weight, self.bias)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of \
which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.07 GiB memory in use. Of the allocated \
memory 75.31 GiB is allocated by PyTorch, and 2.11 GiB is reserved by PyTorch but unallocated. If reserved but \
unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  \
See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""
    + FOOTER
)

TORCH1_OOM = """\
Epoch 1:  12%|█▏        | 120/1000 [00:41<05:02,  2.91it/s, loss=2.31]Traceback (most recent call last):
  File "train.py", line 54, in <module>
    output = model(images)
  File "/opt/conda/lib/python3.8/site-packages/torch/nn/modules/module.py", line 727, in _call_impl
    result = self.forward(*input, **kwargs)
RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.79 GiB total capacity; 6.01 GiB already \
allocated; 12.31 MiB free; 6.20 GiB reserved in total by PyTorch)
"""

CUDA_TAIL = """\
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""


def traceback_ending(exception: str, frames: str = "") -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "/home/ana/exp02/train.py", line 71, in main\n'
        "    loss = step(batch)\n" + frames + exception + "\n"
    )


NCCL_WATCHDOG = (
    HEADER.replace("train.py", "-m torch.distributed.run --nproc-per-node 2 train.py")
    + TQDM
    + "\n"
    + """\
[rank1]:[E1202 14:13:21.433063423 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=4172, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600075 \
milliseconds before timing out.
[rank1]:[E1202 14:13:21.484903450 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank 1]  failure detected \
by watchdog at work sequence id: 4172 PG status: last enqueued work: 4172, last completed work: 4171
[rank1]:[E1202 14:13:22.152512020 ProcessGroupNCCL.cpp:684] [Rank 1] Some NCCL operations have failed or timed out. \
Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
[rank1]:[E1202 14:13:22.152538891 ProcessGroupNCCL.cpp:698] [Rank 1] To avoid data inconsistency, we are taking the \
entire process down.
[rank1]:[E1202 14:13:22.154120934 ProcessGroupNCCL.cpp:1902] [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group \
watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=4172, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600075 \
milliseconds before timing out.
Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:635 (most recent call \
first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f2c1c56c1b8 in \
/home/ana/exp02/.venv/lib/python3.11/site-packages/torch/lib/libc10.so)
frame #1: <unknown function> + 0x5e5c3e (0x7f2bc9a5cc3e in \
/home/ana/exp02/.venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so)

terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: [Rank 1] \
Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4172, OpType=ALLREDUCE, NumelIn=262144, \
NumelOut=262144, Timeout(ms)=600000) ran for 600075 milliseconds before timing out.
W1202 14:13:23.112000 4242 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 4300 closing signal \
SIGTERM
E1202 14:13:23.503000 4242 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 1 \
(pid: 4301) of binary: /home/ana/exp02/.venv/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/home/ana/exp02/.venv/lib/python3.11/site-packages/torch/distributed/run.py", line 896, in <module>
    main()
  File "/home/ana/exp02/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 270, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n\
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_14:13:23
  host      : ws01
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 4301)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 4301
============================================================
"""
    + FOOTER
)

TORCHRUN_CHILD_ERROR = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/home/ana/exp02/train.py", line 30, in <module>
[rank0]:     cfg = load_config(args.config)
[rank0]:   File "/home/ana/exp02/train.py", line 12, in load_config
[rank0]:     raise FileNotFoundError(f"no config at {path}")
[rank0]: FileNotFoundError: no config at configs/base.yaml
E1202 14:20:01.503000 4242 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 \
(pid: 4300) of binary: /home/ana/exp02/.venv/bin/python
Traceback (most recent call last):
  File "/home/ana/exp02/.venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
             ^^^^^^
  File "/home/ana/exp02/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 270, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n\
============================================================
train.py FAILED
============================================================
"""


def why(text: str, exit_code: Optional[int] = 1, signal_name: Optional[str] = None, **kwargs) -> Optional[str]:
    return reason(text.encode("utf-8"), exit_code, signal_name, **kwargs)


# -- out of memory --


def test_pytorch2_cuda_oom_after_tqdm_progress_between_gpuq_lines():
    assert why(TORCH2_OOM) == "CUDA out of memory (tried to allocate 2.00 GiB)"


def test_older_pytorch_cuda_oom():
    assert why(TORCH1_OOM) == "CUDA out of memory (tried to allocate 20.00 MiB)"


@pytest.mark.parametrize(
    "exception,expected",
    [
        ("RuntimeError: CUDA error: out of memory", "CUDA out of memory"),
        (
            "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
            "CUDA out of memory (CUBLAS_STATUS_ALLOC_FAILED)",
        ),
        (
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
            "17179869184 bytes.",
            "GPU out of memory (XLA tried to allocate 16.00 GiB)",
        ),
    ],
)
def test_other_gpu_oom_forms(exception, expected):
    assert why(traceback_ending(exception) + CUDA_TAIL) == expected


def test_oom_under_torchrun_wins_over_the_launchers_traceback():
    rank_oom = "".join(f"[rank0]: {line}\n" for line in TORCH1_OOM.splitlines())
    launcher = TORCHRUN_CHILD_ERROR[TORCHRUN_CHILD_ERROR.index("E1202") :]
    assert why(rank_oom + launcher) == "CUDA out of memory (tried to allocate 20.00 MiB)"


# A trainer (fairseq's, for one) that logs an out-of-memory it recovers from and goes on.
RECOVERED_OOM = (
    "WARNING: OOM: Ran out of memory with exception: CUDA out of memory. Tried to allocate 1.50 GiB\n"
    "WARNING: attempting to recover from OOM in forward/backward pass\n"
)


def test_an_oom_the_job_recovered_from_does_not_hide_the_exception_that_ended_it():
    tail = RECOVERED_OOM + TQDM + "\n" + traceback_ending("ValueError: label 17 out of range for 10 classes")
    assert why(tail) == "ValueError: label 17 out of range for 10 classes"
    assert why(RECOVERED_OOM + TQDM) == "CUDA out of memory (tried to allocate 1.50 GiB)"  # no later error
    assert why(RECOVERED_OOM + TORCH1_OOM) == "CUDA out of memory (tried to allocate 20.00 MiB)"  # died of one
    # a later error that the OOM explains does not count: a peer rank's failed collective
    rank_oom = "".join(f"[rank0]: {line}\n" for line in TORCH1_OOM.splitlines())
    peer = traceback_ending(
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
        "remote process exited or there was a network error, NCCL version 2.21.5"
    )
    peer = "".join(f"[rank1]: {line}\n" for line in peer.splitlines())
    launcher = TORCHRUN_CHILD_ERROR[TORCHRUN_CHILD_ERROR.index("E1202") :]
    assert why(rank_oom + peer + launcher) == "CUDA out of memory (tried to allocate 20.00 MiB)"


# -- CUDA and NCCL errors --


def test_illegal_memory_access():
    tail = traceback_ending("RuntimeError: CUDA error: an illegal memory access was encountered") + CUDA_TAIL
    assert why(tail) == "CUDA error: an illegal memory access was encountered"


def test_nccl_watchdog_timeout_as_torchrun_prints_it():
    assert why(NCCL_WATCHDOG) == "NCCL error: ALLREDUCE timed out after 10m00s (collective watchdog)"


def test_nccl_error_code():
    tail = traceback_ending(
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, "
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\n"
        "Last error:\n"
        "Cuda failure 'peer access is not supported between these two devices'",
        frames='  File "/x/torch/distributed/distributed_c10d.py", line 4635, in barrier\n'
        "    work = group.barrier(opts=opts)\n",
    )
    assert why(tail) == "NCCL error: ncclUnhandledCudaError (Call to CUDA function failed.)"


def test_older_nccl_error_in_line():
    tail = traceback_ending(
        "RuntimeError: NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system error, "
        "NCCL version 2.7.8"
    )
    assert why(tail) == "NCCL error: unhandled system error"


def test_nccl_warn_about_a_timeout():
    tail = (
        "ws01:4301:4390 [1] NCCL INFO Channel 00/02 :    0   1\n"
        "ws01:4301:4390 [1] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<47135> failed : "
        "Connection timed out\n"
    )
    assert why(tail) == "NCCL error: socketStartConnect: Connect to 10.0.0.2<47135> failed : Connection timed out"


def test_an_nccl_warning_that_is_not_a_timeout_does_not_hide_the_exception():
    tail = "ws01:4301:4301 [0] NCCL WARN NET/Plugin: Could not find: libnccl-net.so\n" + traceback_ending(
        "ValueError: bad learning rate"
    )
    assert why(tail) == "ValueError: bad learning rate"


# -- Python exceptions --


def test_chained_exception_reports_the_final_one():
    tail = (
        traceback_ending(
            "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
            frames='  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads\n'
            "    return _default_decoder.decode(s)\n",
        )
        + "\nDuring handling of the above exception, another exception occurred:\n\n"
        + traceback_ending("ValueError: bad config runs/cfg.json")
        + "wandb: \n"
        + "wandb: 🚀 View run exp02 at: https://wandb.ai/ana/exp02/runs/3k2j1\n"
    )
    assert why(tail) == "ValueError: bad config runs/cfg.json"


def test_the_child_error_wins_over_torchruns_wrapper():
    assert why(TORCHRUN_CHILD_ERROR) == "FileNotFoundError: no config at configs/base.yaml"


def test_a_wrapper_alone_is_still_reported():
    tail = TORCHRUN_CHILD_ERROR.split("E1202")[1]
    assert why(tail) == "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"


def test_coloured_traceback():
    tail = (
        "\x1b[1;35mTraceback (most recent call last):\x1b[0m\n"
        '  File \x1b[35m"/home/ana/exp02/train.py"\x1b[0m, line \x1b[35m3\x1b[0m, in \x1b[35m<module>\x1b[0m\n'
        "    \x1b[31mraise ValueError('bad learning rate')\x1b[0m\n"
        "\x1b[1;35mValueError\x1b[0m: \x1b[35mbad learning rate\x1b[0m\n"
    )
    assert why(tail) == "ValueError: bad learning rate"


def test_a_long_exception_line_is_trimmed_to_one_short_line():
    tail = traceback_ending("KeyError: '" + "very_long_key_" * 40 + "'")
    found = why(tail)
    assert found is not None and len(found) == MAX_REASON and found.endswith("...")
    assert found.startswith("KeyError: 'very_long_key_very_long_key_")


def test_a_log_line_after_the_frames_is_not_taken_for_the_exception():
    tail = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nEpoch 3 done, loss 2.1\n'
    assert why(tail) is None


# -- signals, time limits, gpuq kill --


def test_time_limit_wins_over_everything():
    assert why(TORCH2_OOM, 137, "SIGKILL", time_limit=4 * 3600) == "time limit of 4h00m reached"
    assert why("", 143, "SIGTERM", time_limit=90) == "time limit of 1m30s reached"


def test_gpuq_kill_is_not_blamed_on_the_oom_killer():
    assert why("step 10\n", 137, "SIGKILL", killed_by_user=True) == "stopped by `gpuq kill`"


@pytest.mark.parametrize("exit_code,signal_name", [(137, "SIGKILL"), (137, None), (-9, None), (137, "KILL")])
def test_an_unexplained_sigkill_is_likely_the_oom_killer(exit_code, signal_name):
    assert why(HEADER + TQDM, exit_code, signal_name) == f"killed by SIGKILL ({OOM_HINT})"


def test_only_the_latest_attempt_is_read():
    retried = TORCH2_OOM + HEADER.replace("(attempt 1)", "(attempt 2)") + "step 1\nstep 2\n"
    assert why(retried, 137, "SIGKILL") == f"killed by SIGKILL ({OOM_HINT})"
    assert why(retried, 1, None) is None
    assert "step 2" in latest_attempt_lines(retried.encode()) and not any(
        "CUDA" in line for line in latest_attempt_lines(retried.encode())
    )


def test_gpuq_lines_glued_to_an_unfinished_progress_bar():
    """gpuq's header and footer may follow a progress bar that never ended its line."""
    attempt2 = HEADER.replace("(attempt 1)", "(attempt 2)")
    log = TORCH1_OOM + "retrying" + TQDM + attempt2 + "step 1" + TQDM + FOOTER.replace("exit 1", "exit 137 (SIGKILL)")
    assert why(log, 137, "SIGKILL") == f"killed by SIGKILL ({OOM_HINT})"
    lines = latest_attempt_lines(log.encode())
    assert lines[-2].startswith("  2%|") and lines[-2].endswith("2.47it/s]")  # the footer cut off the bar
    assert not any("gpuq" in line or "CUDA" in line for line in lines)


def test_gpuqs_own_lines_are_ignored():
    tail = '=== gpuq: cmd: python train.py --note "CUDA out of memory. Tried to allocate 1 GiB" --fail\n'
    assert why(tail, 1, None) is None
    assert why(tail + "CUDA out of memory. Tried to allocate 1.00 GiB\n") == (
        "CUDA out of memory (tried to allocate 1.00 GiB)"
    )


def test_segfault_and_abort():
    assert why("step 3\n", 139, None) == "segmentation fault"
    assert why("step 3\n", 139, "SIGSEGV") == "segmentation fault"
    tail = "terminate called after throwing an instance of 'std::runtime_error'\n  what():  cannot open shard 17\n"
    assert why(tail, 134, "SIGABRT") == "aborted: cannot open shard 17"
    assert why("step 3\n", 134, "SIGABRT") == "aborted (SIGABRT)"


def test_nothing_recognised():
    assert why(HEADER + "epoch 1 loss 2.3\nepoch 2 loss 2.1\n" + FOOTER, 1, None) is None
    assert reason(b"", 2, None) is None


def test_only_the_last_64_kib_is_read():
    head = "CUDA out of memory. Tried to allocate 1.00 GiB\n"
    filler = "step 100 loss 2.0\n" * (TAIL_BYTES // 18 + 10)
    assert why(head + filler) is None
    assert why(filler + head) == "CUDA out of memory (tried to allocate 1.00 GiB)"


def test_a_tail_cut_inside_a_character_still_reads():
    data = "█".encode()[1:] + b"\xff\xfe garbage\n" + traceback_ending("ValueError: bad learning rate").encode()
    assert reason(data, 1, None) == "ValueError: bad learning rate"


# -- real processes: what they really print --


def run(args: list[str], tmp_path: Path) -> tuple[bytes, int, Optional[str]]:
    """Run a real child; returns (stderr + stdout bytes as a log holds them, exit code, signal name)."""
    proc = subprocess.run(args, cwd=tmp_path, capture_output=True, timeout=120)
    code = proc.returncode
    signal_name = signal.Signals(-code).name if code < 0 else None
    return proc.stdout + proc.stderr, (128 - code if code < 0 else code), signal_name


def python_script(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    return [sys.executable, str(script)]


def test_real_chained_exception(tmp_path):
    log, code, sig = run(
        python_script(
            tmp_path,
            """
            import json
            def load(text):
                try:
                    return json.loads(text)
                except ValueError as error:
                    raise RuntimeError("config is not JSON") from error
            load("{")
            """,
        ),
        tmp_path,
    )
    assert b"The above exception was the direct cause" in log
    assert reason(log, code, sig) == "RuntimeError: config is not JSON"


def test_real_exception_after_a_recovered_oom_warning(tmp_path):
    body = f"print({RECOVERED_OOM!r}, end='', flush=True)\nraise ValueError('label 17 out of range for 10 classes')\n"
    log, code, sig = run(python_script(tmp_path, body), tmp_path)
    assert b"CUDA out of memory" in log and b"Traceback" in log
    assert reason(log, code, sig) == "ValueError: label 17 out of range for 10 classes"


def test_real_multiline_message_gives_its_first_line(tmp_path):
    log, code, sig = run(python_script(tmp_path, 'raise ValueError("bad shape\\nexpected (2, 3)")'), tmp_path)
    assert reason(log, code, sig) == "ValueError: bad shape"


def test_real_keyboard_interrupt(tmp_path):
    body = "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(10)\n"
    log, code, sig = run(python_script(tmp_path, body), tmp_path)
    assert sig == "SIGINT" or code == 130
    assert reason(log, code, sig) == "KeyboardInterrupt"


def test_real_system_exit_is_not_a_traceback(tmp_path):
    log, code, sig = run(python_script(tmp_path, 'import sys\nsys.exit("missing --data")'), tmp_path)
    assert (log.strip(), code) == (b"missing --data", 1)
    assert reason(log, code, sig) is None


def test_real_syntax_error_without_a_traceback(tmp_path):
    log, code, sig = run(python_script(tmp_path, "x = (1,\ny = 2\n"), tmp_path)
    assert b"Traceback" not in log
    found = reason(log, code, sig)
    assert found is not None and found.startswith("SyntaxError: ")


def test_real_missing_script(tmp_path):
    log, code, sig = run([sys.executable, str(tmp_path / "nope.py")], tmp_path)
    found = reason(log, code, sig)
    assert found is not None and "can't open file" in found and "nope.py" in found


def test_real_module_not_found(tmp_path):
    log, code, sig = run(python_script(tmp_path, "import gpuq_no_such_module_xyz\n"), tmp_path)
    assert reason(log, code, sig) == "ModuleNotFoundError: No module named 'gpuq_no_such_module_xyz'"


def test_real_disk_full(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    log, code, sig = run(python_script(tmp_path, 'with open("/dev/full", "w") as f:\n    f.write("x")\n'), tmp_path)
    assert b"No space left on device" in log
    assert reason(log, code, sig) == "disk full (No space left on device)"


def test_real_sigkill_of_the_job(tmp_path):
    body = "import os, signal\nprint('step 1', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    log, code, sig = run(python_script(tmp_path, body), tmp_path)
    assert (code, sig) == (137, "SIGKILL")
    assert reason(log, code, sig) == f"killed by SIGKILL ({OOM_HINT})"


def test_real_shell_reports_a_killed_child(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\necho start\nsh -c 'kill -9 $$'\necho after\nexit 3\n")
    log, code, sig = run(["bash", str(script)], tmp_path)
    assert b"Killed" in log and code == 3
    assert reason(log, code, sig) == f"a child process was killed by SIGKILL ({OOM_HINT})"


def test_real_segfault(tmp_path):
    log, code, sig = run(python_script(tmp_path, "import ctypes\nctypes.string_at(0)\n"), tmp_path)
    assert sig == "SIGSEGV"
    assert reason(log, code, sig) == "segmentation fault"


def test_real_rich_traceback(tmp_path):
    if importlib.util.find_spec("rich") is None:
        pytest.skip("rich is not installed")
    body = """
        from rich.traceback import install
        install()
        def step(lr):
            raise ValueError(f"bad learning rate {lr}")
        step(-1)
        """
    log, code, sig = run(python_script(tmp_path, body), tmp_path)
    assert "╭".encode() in log
    assert reason(log, code, sig) == "ValueError: bad learning rate -1"


needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


@needs_torch
def test_real_torch_cuda_call_on_a_cpu_build(tmp_path):
    """A genuine multi-frame traceback out of torch: on a CPU build CUDA calls raise."""
    body = """
        import torch
        if torch.cuda.is_available():
            raise SystemExit("skip: this torch has CUDA")
        x = torch.zeros(4, device="cuda")
        """
    log, code, sig = run(python_script(tmp_path, body), tmp_path)
    if log.startswith(b"skip:"):
        pytest.skip("torch here has CUDA: the CPU-build error cannot be produced")
    assert log.count(b'  File "') >= 2
    assert reason(log, code, sig) == "AssertionError: Torch not compiled with CUDA enabled"


@needs_torch
def test_real_torch_cpu_allocation_failure_after_tqdm(tmp_path):
    if importlib.util.find_spec("tqdm") is None:
        pytest.skip("tqdm is not installed")
    body = """
        import torch
        from tqdm import tqdm
        for step in tqdm(range(100), mininterval=0):
            if step == 40:
                torch.empty(2**50, dtype=torch.uint8)  # 1 PiB: beyond any address space
        """
    log, code, sig = run(python_script(tmp_path, body), tmp_path)
    assert b"\r" in log and b"Traceback" in log
    assert reason(HEADER.encode() + log + FOOTER.encode(), code, sig) == (
        "out of CPU memory (tried to allocate 1024.00 TiB)"
    )
