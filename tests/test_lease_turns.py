"""`gpuq lease -- CMD` takes turns and keeps caps as a worker's jobs do (turns.py): the machine
policy's cap counts its leases, another user's waiting ticket comes first, a waiting lease holds a
ticket of its own, and the GPU-hours it held count as its user's recent use. Real `gpuq lease`
processes on simulated GPUs; another user's ticket planted as root, as in tests/test_turns.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import wait_for
from test_lease_cmd import HOLD, env, lease  # noqa: F401 (env: the fixture)
from test_turns import THEM, _plant, _ticket, _unplant, needs_root

from gpuq.system.leases import TICKET_PREFIX, LeaseDir


def _policy(tmp_path: Path, env: dict[str, str], text: str) -> None:  # noqa: F811
    path = tmp_path / "policy.toml"
    path.write_text(text)
    path.chmod(0o644)
    env["GPUQ_POLICY"] = str(path)


def _done(proc: subprocess.Popen) -> tuple[int, str]:
    _out, err = proc.communicate(timeout=30)
    return proc.returncode, err


@needs_root  # the policy file must be root's
def test_the_cap_counts_the_users_leases(env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    _policy(tmp_path, env, "[default]\nmax_gpus = 1\n")
    holder_dir = tmp_path / "holder"
    holder_dir.mkdir()
    holder = lease(env, "--", sys.executable, "-c", HOLD, cwd=holder_dir)
    wait_for(lambda: (holder_dir / "started").exists(), 30, what="the first lease's command")
    code, err = _done(lease(env, "--no-wait", "--", "true", cwd=tmp_path))
    assert code == 75 and "your limit of 1 GPU at once on this machine" in err, err
    code, err = _done(lease(env, "--gpus", "2", "--", "true", cwd=tmp_path))
    assert code == 2 and "asks for 2 GPUs, over your limit of 1 GPU at once" in err, err  # as `add` refuses it
    (holder_dir / "go").write_text("")
    assert _done(holder)[0] == 0
    assert _done(lease(env, "--no-wait", "--", "true", cwd=tmp_path)) == (0, "")


@needs_root  # another user's ticket is planted as root
def test_another_users_older_ticket_goes_first_and_a_waiting_lease_holds_a_ticket(
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    leases = Path(env["GPUQ_LEASE_DIR"])
    leases.mkdir(mode=0o1777)
    leases.chmod(0o1777)
    theirs = f"{TICKET_PREFIX}{THEM}.4242.1.ticket"
    fd = _plant(leases, theirs, _ticket(since=1.0))
    code, err = _done(lease(env, "--no-wait", "--", "true", cwd=tmp_path))
    assert code == 75 and "it would wait for its turn on GPU 0: " in err and "'s job #7 has waited" in err, err
    waiting = lease(env, "--", sys.executable, "-c", "print('ran')", cwd=tmp_path)

    def mine() -> list:
        return [t for t in LeaseDir.open(str(leases)).tickets() if t.uid == os.geteuid()]

    wait_for(lambda: len(mine()) == 1, 30, what="the waiting lease's own ticket")
    assert mine()[0].job is None and waiting.poll() is None  # still waiting for their turn
    _unplant(leases, theirs, fd)
    out, err = waiting.communicate(timeout=30)
    assert (waiting.returncode, out) == (0, "ran\n"), err
    assert mine() == []  # its ticket went with the wait


def test_the_gpu_hours_a_lease_held_count_as_its_users_recent_use(env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    sleep = "import time; time.sleep(0.3)"
    assert _done(lease(env, "--", sys.executable, "-c", sleep, cwd=tmp_path)) == (0, "")
    used = LeaseDir.open(env["GPUQ_LEASE_DIR"]).usage([os.geteuid()])[os.geteuid()]
    assert 0.3 / 3600 <= used < 60 / 3600, used


def test_a_policy_file_that_is_ignored_is_said_once(env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """Read before the lease is taken and again to record its GPU-hours: one line all the same."""
    _policy(tmp_path, env, "[default]\nmax_gpus = 1\n")
    (tmp_path / "policy.toml").chmod(0o664)  # writable by its group: not the admin's word
    code, err = _done(lease(env, "--", "true", cwd=tmp_path))
    assert code == 0 and err.count("policy file") == 1 and "ignored, no caps or weights apply" in err, err
