"""The systemd user unit: its text, checked by systemd's own `systemd-analyze verify --user` where
that exists, and installing/removing it in a temporary config directory."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Env, wait_for
from test_continue import kill_job_and_supervisor, printed_step, runs, trainer

from gpuq.core.errors import Refused
from gpuq.run import service


def verify(unit: Path, runtime: Path) -> subprocess.CompletedProcess:
    """`systemd-analyze --user verify` without a running systemd: the user manager it builds in
    memory needs only an XDG_RUNTIME_DIR of its own (private, owned by us)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), SYSTEMD_LOG_COLOR="0")
    proc = subprocess.run([tool, "--user", "verify", str(unit)], env=env, capture_output=True, text=True, timeout=120)
    if "Failed to initialize manager" in proc.stderr:
        pytest.skip(f"systemd-analyze cannot build a user manager here: {proc.stderr.strip()}")
    return proc


def write_unit(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / service.UNIT_NAME
    path.write_text(text)
    return path


def test_unit_passes_systemd_verify(tmp_path: Path):
    text = service.unit_text([sys.executable, "-m", "gpuq"], str(tmp_path / "spool"), recover=True)
    proc = verify(write_unit(tmp_path / "units", text), tmp_path / "run")
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")


def test_verify_catches_a_broken_unit(tmp_path: Path):
    """The check above can fail: systemd reports a bad setting and an executable that is not there."""
    text = service.unit_text([sys.executable, "-m", "gpuq"], str(tmp_path / "spool"))
    broken = text.replace("KillMode=process", "KillMode=sometimes").replace(sys.executable, "/nonexistent/python")
    proc = verify(write_unit(tmp_path / "units", broken), tmp_path / "run")
    assert "kill mode" in proc.stderr.lower() and "/nonexistent/python" in proc.stderr


def test_odd_paths_are_quoted_so_systemd_finds_them(tmp_path: Path):
    """An interpreter under a directory with a space, `%` and `$` in its name: if the quoting were
    wrong, systemd would look for another file (or expand a specifier) and say so."""
    odd = tmp_path / "my envs %h $HOME" / "bin"
    odd.mkdir(parents=True)
    python = odd / "python"
    python.symlink_to(sys.executable)
    spool = str(tmp_path / 'spool "a" \\ %u')
    text = service.unit_text([str(python), "-m", "gpuq"], spool)
    assert f'ExecStart="{str(python).replace("%", "%%")}" -m gpuq run --watch --recover\n' in text
    # quotes and backslashes escaped C-style, % doubled (a specifier otherwise), $ kept (not expanded there)
    assert 'Environment="GPUQ_HOME=' + str(tmp_path) + '/spool \\"a\\" \\\\ %%u"\n' in text
    proc = verify(write_unit(tmp_path / "units", text), tmp_path / "run")
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")


def test_unit_settings():
    text = service.unit_text(["/opt/venv/bin/gpuq"], "/home/ada/.gpuq", extra_env={"PATH": "/usr/bin:/bin"})
    lines = text.splitlines()
    assert lines[0] == service.MARKER
    for line in [
        "[Unit]",
        "[Service]",
        "[Install]",
        "Type=exec",
        'Environment="GPUQ_HOME=/home/ada/.gpuq"',
        'Environment="PATH=/usr/bin:/bin"',
        "ExecStart=/opt/venv/bin/gpuq run --watch --recover",  # recovery after a reboot is the default
        "Restart=on-failure",
        "KillMode=process",
        "OOMPolicy=continue",
        "StartLimitBurst=5",
        "WantedBy=default.target",
    ]:
        assert line in lines
    assert "ExecStart=/opt/venv/bin/gpuq run --watch\n" in service.unit_text(
        ["/opt/venv/bin/gpuq"], "/s", recover=False
    )
    for argv, home, env in [
        (["gpuq"], "/s", None),
        (["/g"], "rel", None),
        (["/g"], "/a\nb", None),
        (["/g"], "/s", {"A B": "1"}),
    ]:
        with pytest.raises(ValueError):
            service.unit_text(argv, home, extra_env=env)


def test_install_then_uninstall(tmp_path: Path):
    units = tmp_path / "units"
    first = service.install(units, ["/usr/bin/gpuq"], "/s")
    path = units / "gpuq.service"
    assert (first.action, first.path, first.backup) == ("created", path, None)
    assert path.read_text() == service.unit_text(["/usr/bin/gpuq"], "/s")
    assert path.stat().st_mode & 0o777 == 0o644
    assert first.commands == [
        "systemctl --user daemon-reload",
        "systemctl --user enable --now gpuq.service",
        "loginctl enable-linger $USER",
    ]
    assert service.install(units, ["/usr/bin/gpuq"], "/s").action == "unchanged"

    # a unit gpuq wrote earlier (other spool) is replaced, and the old one kept
    again = service.install(units, ["/usr/bin/gpuq"], "/other", recover=False)
    assert (again.action, again.backup) == ("replaced", units / "gpuq.service.bak")
    assert "GPUQ_HOME=/s" in again.backup.read_text() and "--recover" not in path.read_text()

    # `systemctl enable` would have made this link; uninstall removes it with the unit
    wants = units / "default.target.wants"
    wants.mkdir()
    (wants / "gpuq.service").symlink_to(path)
    gone = service.uninstall(units)
    assert (gone.action, path.exists(), (wants / "gpuq.service").is_symlink()) == ("removed", False, False)
    assert gone.commands == ["systemctl --user stop gpuq.service", "systemctl --user daemon-reload"]
    assert service.uninstall(units).action == "absent"


def test_a_unit_gpuq_did_not_write_is_never_replaced_silently(tmp_path: Path):
    units = tmp_path / "units"
    mine = "[Service]\nExecStart=/usr/local/bin/my-own-queue\n"
    path = write_unit(units, mine)
    with pytest.raises(Refused, match="was not written by gpuq"):
        service.install(units, ["/usr/bin/gpuq"], "/s")
    with pytest.raises(Refused, match="not removed"):
        service.uninstall(units)
    assert path.read_text() == mine
    forced = service.install(units, ["/usr/bin/gpuq"], "/s", force=True)
    assert forced.action == "replaced" and forced.backup.read_text() == mine


def test_default_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert service.default_dir() == tmp_path / "cfg" / "systemd" / "user"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert service.default_dir() == tmp_path / "home" / ".config" / "systemd" / "user"
    monkeypatch.setenv("GPUQ_HOME", "~/queue")
    monkeypatch.setenv("HOME", str(tmp_path / "h2"))
    result = service.install(gpuq_argv=["/usr/bin/gpuq"])
    assert result.path == tmp_path / "h2" / ".config" / "systemd" / "user" / "gpuq.service"
    assert f'Environment="GPUQ_HOME={tmp_path / "h2" / "queue"}"' in result.path.read_text()


def test_supported_says_why_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    reason = service.supported()
    if sys.platform.startswith("linux") and shutil.which("systemctl") and os.path.isdir("/run/systemd/system"):
        assert reason is None
    else:
        assert isinstance(reason, str) and reason
    if sys.platform.startswith("linux"):
        monkeypatch.setenv("PATH", str(tmp_path))  # no systemctl on it
        assert service.supported() == "systemctl not found: this system does not use systemd"


# ---- the service's worker recovers after a reboot (issue 26) ---------------------------------------


def unit_of(gq: Env, dest: Path, *options: str) -> str:
    gq.gpuq("service", "install", "--dest", str(dest), *options)
    return (dest / service.UNIT_NAME).read_text()


def test_service_install_recovers_unless_told_not_to(gq: Env, tmp_path: Path):
    assert " run --watch --recover\n" in unit_of(gq, tmp_path / "default")
    assert " run --watch\n" in unit_of(gq, tmp_path / "off", "--no-recover")
    assert " run --watch --recover\n" in unit_of(gq, tmp_path / "older", "--recover")  # the default, still accepted
    both = gq.gpuq("service", "install", "--dest", str(tmp_path / "x"), "--recover", "--no-recover", check=False)
    assert both.returncode == 2 and len(both.stderr.splitlines()) == 1 and "not allowed with" in both.stderr


def unit_command(unit: str) -> tuple[list[str], dict[str, str]]:
    """The unit's ExecStart as argv and its Environment= settings, unquoted as systemd does for
    these plain words."""
    lines = unit.splitlines()
    argv = shlex.split(next(line for line in lines if line.startswith("ExecStart="))[len("ExecStart=") :])
    env = dict(
        shlex.split(line[len("Environment=") :])[0].split("=", 1) for line in lines if line.startswith("Environment=")
    )
    return argv, env


def test_the_units_worker_continues_an_interrupted_job_from_its_checkpoint(gq: Env, tmp_path: Path):
    """A reboot as test_continue.py makes one (worker stopped, job and supervisor killed -9), then
    the worker the service would start: the unit's own ExecStart and environment, nothing added."""
    job_id = trainer(gq, "--max_steps", "40", "--step_time", "0.03")
    worker = gq.start_worker("--watch")
    wait_for(lambda: gq.job(job_id).get("supervisor") and printed_step(gq, job_id) >= 23, 30, what="step 23")
    worker.send_signal(signal.SIGTERM)
    worker.wait(10)
    kill_job_and_supervisor(gq, job_id)

    argv, env = unit_command(unit_of(gq, tmp_path / "units"))
    assert argv[1:] == ["-m", "gpuq", "run", "--watch", "--recover"] and env == {"GPUQ_HOME": str(gq.home)}
    with open(gq.work / "service.out", "wb") as out:
        gq.workers.append(subprocess.Popen(argv, cwd=gq.work, env=dict(gq.env, **env), stdout=out, stderr=out))
    gq.wait_state(job_id, "done", timeout=30)
    assert runs(gq)[-1] == "20 40"  # continued from checkpoint-20, not from step 0
    said = (gq.work / "service.out").read_text()
    assert f"recovered job #{job_id}" in said and "continues from checkpoint-20" in said
