"""`gpuq lease -- CMD` (engine/schedule/adhoc.py), as a user runs it: real processes, simulated GPUs
(GPUQ_FAKE_GPUS) and a lease directory in tmp (GPUQ_LEASE_DIR)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import alive, wait_for

from gpuq.system.leases import LeaseDir

# holds until the file `go` appears in its working directory; says it started (and its pid) in `started`
HOLD = "import os, time\nopen('started', 'w').write(str(os.getpid()))\n"
HOLD += "while not os.path.exists('go'):\n    time.sleep(0.02)\n"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    fake = tmp_path / "gpus.json"
    gpu = {"name": "Fake H100", "memory_total_mib": 81559, "memory_used_mib": 0, "processes": []}
    fake.write_text(json.dumps({"gpus": [dict(gpu, index=i, uuid=f"GPU-fake-{i}") for i in (0, 1)]}))
    return dict(
        os.environ, GPUQ_FAKE_GPUS=str(fake), GPUQ_LEASE_DIR=str(tmp_path / "leases"), GPUQ_HOME=str(tmp_path / "q")
    )


def lease(env: dict[str, str], *args: str, cwd: Path, **kw) -> subprocess.Popen:  # noqa: ANN003
    argv = [sys.executable, "-m", "gpuq", "lease", *args]
    return subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def live(env: dict[str, str]) -> list:
    return LeaseDir.open(env["GPUQ_LEASE_DIR"]).live()


def lease_files(env: dict[str, str]) -> list[str]:
    """The lease files left (before `live`, which removes stale ones: the tests run as their owner)."""
    return [name for name in os.listdir(env["GPUQ_LEASE_DIR"]) if name.endswith(".lease")]


def test_the_command_runs_on_leased_gpus_and_its_exit_code_is_returned(env: dict[str, str], tmp_path: Path) -> None:
    show = "import os, sys\nprint(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['CUDA_DEVICE_ORDER'])\n"
    # the command holds its leases' locks (so they outlive a killed gpuq lease), and no other file there
    show += "links = []\nfor fd in os.listdir('/proc/self/fd'):\n"
    show += "    try:\n        links.append(os.readlink(f'/proc/self/fd/{fd}'))\n"
    show += "    except OSError:\n        pass  # the listing's own descriptor, closed since\n"
    show += "here = [link for link in links if os.environ['GPUQ_LEASE_DIR'] in link]\n"
    show += "print(sorted(link.split('/')[-1].rsplit('.', 4)[0] for link in here))\n"
    show += "sys.exit(3)"
    proc = lease(env, "--gpus", "2", "--", sys.executable, "-c", show, cwd=tmp_path)
    out, err = proc.communicate(timeout=30)
    leases = "['gpuq-lease.GPU-fake-0', 'gpuq-lease.GPU-fake-1']"
    assert (proc.returncode, out, err) == (3, f"0,1 PCI_BUS_ID\n{leases}\n", "")
    assert lease_files(env) == []


def test_no_wait_names_the_holder_and_a_waiting_one_starts_when_it_ends(env: dict[str, str], tmp_path: Path) -> None:
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    first = lease(env, "--gpus", "2", "--", sys.executable, "-c", HOLD, cwd=first_dir)
    wait_for(lambda: (first_dir / "started").exists(), timeout=20, what="the first command to start")
    held = live(env)
    assert [(lease.gpu_index, lease.pid, lease.job) for lease in held] == [(0, first.pid, None), (1, first.pid, None)]

    refused = lease(env, "--no-wait", "--", "true", cwd=tmp_path)
    out, err = refused.communicate(timeout=30)
    assert refused.returncode == 75 and out == ""
    holder = f"leased whole by your `{Path(sys.executable).name}` (gpuq lease, pid {first.pid}) since "
    assert err.startswith(f"gpuq lease: not started (--no-wait): it would wait for GPU 0: {holder}")
    assert err.count("\n") == 1

    second = lease(env, "--", sys.executable, "-c", HOLD, cwd=second_dir)
    waiting = second.stderr.readline()
    assert waiting.startswith(f"gpuq lease: waiting for GPU 0: {holder}") and waiting.endswith("(Ctrl-C to give up)\n")
    assert not (second_dir / "started").exists()
    (first_dir / "go").touch()
    assert first.wait(timeout=20) == 0
    wait_for(lambda: (second_dir / "started").exists(), timeout=20, what="the waiting command to start")
    assert [lease.pid for lease in live(env)] == [second.pid]
    (second_dir / "go").touch()
    assert second.wait(timeout=20) == 0
    assert second.stderr.read() == f"gpuq lease: GPU 0 leased; starting {Path(sys.executable).name}\n"
    assert lease_files(env) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_is_forwarded_and_the_lease_ends_with_the_command(
    env: dict[str, str], tmp_path: Path, sig: signal.Signals
) -> None:
    proc = lease(env, "--", sys.executable, "-c", HOLD, cwd=tmp_path, stdin=subprocess.DEVNULL)
    pid = int(wait_for(lambda: (tmp_path / "started").exists() and (tmp_path / "started").read_text(), timeout=20))
    proc.send_signal(sig)
    assert proc.wait(timeout=20) == 128 + sig  # the command died of it, and gpuq lease waited for that
    assert not alive(pid)
    assert lease_files(env) == []


def test_a_killed_gpuq_lease_leaves_the_lease_alive_until_its_command_ends(env: dict[str, str], tmp_path: Path) -> None:
    """SIGKILL gives gpuq lease no chance to stop its command: the command, still on the GPU, keeps
    the lease alive for every gpuq, and the lease ends (stale, removed) once it exits."""
    proc = lease(env, "--gpus", "2", "--", sys.executable, "-c", HOLD, cwd=tmp_path)
    pid = int(wait_for(lambda: (tmp_path / "started").exists() and (tmp_path / "started").read_text(), timeout=20))
    try:
        proc.kill()
        assert proc.wait(timeout=20) == -signal.SIGKILL and alive(pid)
        assert [(lease.gpu_index, lease.pid) for lease in live(env)] == [(0, proc.pid), (1, proc.pid)]
        refused = lease(env, "--no-wait", "--", "true", cwd=tmp_path)
        assert refused.wait(timeout=30) == 75
    finally:
        (tmp_path / "go").touch()  # the orphaned command ends, whatever failed
    wait_for(lambda: not alive(pid), timeout=20, what="the command to end")
    assert live(env) == [] and lease_files(env) == []  # stale once the command is gone: removed by its owner


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ((), 2, "gpuq lease: give the command to run: gpuq lease [--gpus N | --gpu-mem SIZE] -- CMD..."),
        (("--gpus", "1", "--gpu-mem", "2G", "--", "true"), 2, "gpuq lease: argument --gpu-mem: not allowed with"),
        (("--wait", "--no-wait", "--", "true"), 2, "gpuq lease: argument --no-wait: not allowed with argument --wait"),
        (("--gpu-mem", "20x", "--", "true"), 2, "gpuq lease: --gpu-mem: cannot read '20x' as a size"),
        (("--gpus", "0", "--", "true"), 2, "gpuq lease: --gpus 0 leases no GPU"),
        (("--gpus", "3", "--", "true"), 2, "gpuq lease: needs 3 GPUs; this machine has 2 (0,1)"),  # as `add` says it
        (("--gpu-mem", "100G", "--", "true"), 2, "gpuq lease: needs 100.0 GiB on a GPU; the largest here is GPU"),
        (("--", "no-such-program-here"), 127, "gpuq lease: cannot run no-such-program-here: no such program on PATH"),
    ],
)
def test_bad_lines_are_one_line(env: dict[str, str], tmp_path: Path, args: tuple, code: int, message: str) -> None:
    proc = lease(env, *args, cwd=tmp_path)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err.count("\n")) == (code, "", 1) and err.startswith(message), err


def test_a_command_that_cannot_run_exits_126_as_in_a_shell(env: dict[str, str], tmp_path: Path) -> None:
    """Found but not runnable: 126 and why, not "no such program" and 1; one found only at its start
    (an executable without a #! line) too, its lease given back."""
    (tmp_path / "plain").write_text("touch ran\n")
    (tmp_path / "bare").write_text("touch ran\n")
    (tmp_path / "bare").chmod(0o755)
    for word, why in (("./plain", "permission denied (not executable)"), ("./bare", "Exec format error")):
        proc = lease(env, "--", word, cwd=tmp_path)
        out, err = proc.communicate(timeout=30)
        assert (proc.returncode, out, err) == (126, "", f"gpuq lease: cannot run {word}: {why}\n")
    assert not (tmp_path / "ran").exists() and lease_files(env) == []


def test_without_gpus_it_refuses(env: dict[str, str], tmp_path: Path) -> None:
    """A lease of no GPU means nothing: said in one line, exit 2 (it could never be met here), the
    command not run."""
    env = {k: v for k, v in env.items() if k != "GPUQ_FAKE_GPUS"}
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    proc = lease(env, "--", "touch", "ran", cwd=tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and err.startswith("gpuq lease: no GPU to lease here: no NVIDIA driver")
    assert not (tmp_path / "ran").exists()
