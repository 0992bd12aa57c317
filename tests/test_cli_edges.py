"""The command line at its edges (issue 39, items 2, 3 and 10): a `--dry-run` after the script, a
dry run that admits host memory and CPUs as the worker does, and input that used to pass silently
or surprise. Each on the real CLI, in a subprocess, with real workers."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, WAIT_FOR_GO, Env, wait_for
from test_gpu_worker import Gpus, fake_gpus

from gpuq.engine.lifecycle import intake
from gpuq.spool import Spool
from gpuq.system.extras import PACKAGES, install_command, source_tree

try:
    import tomllib
except ImportError:  # Python < 3.11: tomli, a dependency of gpuq there
    import tomli as tomllib  # type: ignore[no-redef]

# ---- `--dry-run` after the script ------------------------------------------------------------


def test_a_dry_run_after_the_script_is_refused_and_nothing_runs(gq: Env) -> None:
    gq.script("eval.py", "open('ran', 'w').write('yes')\n")
    gq.start_worker("--watch")
    wait_for(lambda: "worker: running" in gq.gpuq("status").stdout, what="the worker to register")
    proc = gq.gpuq("add", "--gpu-mem", "20G", "eval.py", "--dry-run", check=False)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "gpuq add: --dry-run comes after the script, so eval.py would get it and the job would be queued and run "
        "for real; put it before the script: gpuq add --gpu-mem 20G --dry-run eval.py (or `--` before the script "
        "to pass it to eval.py)\n"
    )
    with_json = gq.gpuq("add", "eval.py", "--dry-run", "--json", check=False)  # --json goes with it
    assert with_json.returncode == 2 and "put them before the script: gpuq add --dry-run --json eval.py" in (
        with_json.stderr
    )
    assert gq.status_json() == [] and not (gq.work / "ran").exists()
    passed = gq.gpuq("add", "-q", "--", "eval.py", "--dry-run")  # `--`: the script gets it
    assert gq.job(int(passed.stdout))["cmd"][-2:] == ["eval.py", "--dry-run"]


# ---- a dry run admits host memory and CPUs as the worker does ------------------------------------


def test_a_dry_run_meets_the_workers_host_memory_and_cpus(gq: Env) -> None:
    Gpus(gq, fake_gpus(2))
    gq.script("wait.py", WAIT_FOR_GO)
    gq.start_worker("--watch", "--mem", "4G", "--cpus", "4")
    wait_for(lambda: "worker: running" in gq.gpuq("status").stdout, what="the worker to register")

    def dry(*options: str) -> dict:
        return json.loads(gq.gpuq("add", "--dry-run", "--json", *options, "wait.py").stdout)["jobs"][0]

    huge = dry("--mem", "10T", "--cpus", "2")
    assert (huge["mem_mib"], huge["cpus"]) == (10 << 20, 2)
    never = "needs 10240G host memory; this worker hands out at most 4G"
    assert huge["would_start"]["now"] is False and huge["would_start"]["why_not"] == never
    text = gq.gpuq("add", "--dry-run", "--mem", "10T", "--cpus", "2", "wait.py").stdout
    assert "    needs      1 GPU; 10240G host memory; 2 CPUs\n" in text
    assert f"    would not start now: {never}\n" in text
    queued = gq.add("--mem", "10T", "wait.py")  # the real job meets the same
    wait_for(lambda: never in gq.gpuq("status").stdout, what="the worker's reason for the real job")
    gq.gpuq("cancel", str(queued))

    running = gq.add("--mem", "3G", "--cpus", "3", "wait.py")
    gq.wait_state(running, "running")
    memory = dry("--mem", "2G")
    assert memory["would_start"]["now"] is False
    assert memory["would_start"]["why_not"] == f"waiting for host memory: 3G of 4G reserved by #{running} (it needs 2G)"
    cpus = dry("--cpus", "2")
    assert cpus["would_start"]["why_not"] == f"waiting for CPUs: 3 of 4 reserved by #{running} (it needs 2)"
    fits = dry("--mem", "1G", "--cpus", "1")
    assert fits["would_start"]["now"] is True and (fits["mem_mib"], fits["cpus"]) == (1024, 1)
    (gq.work / "go").write_text("")
    gq.wait_state(running, "done")


# ---- `--notify URL` where Apprise cannot be imported; the install hints of extras -------------------


def without_apprise(gq: Env, tmp_path: Path) -> dict[str, str]:
    """gq's environment for a Python where Apprise cannot be imported (as if not installed): a
    sitecustomize that marks it missing, as the interpreter does for a module it could not find."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['apprise'] = None\n")
    return dict(gq.env, PYTHONPATH=str(hide))


def test_notify_url_without_apprise_is_refused_at_add_and_run_with_the_install_command(gq: Env, tmp_path: Path) -> None:
    env = without_apprise(gq, tmp_path)
    missing = f"notifications to URLs need Apprise, which is not installed: {install_command('notify')}"
    added = gq.gpuq("add", "--notify", "ntfy://my-topic", "true", env=env, check=False)
    assert (added.returncode, added.stdout) == (1, "")
    assert added.stderr == f"gpuq add: --notify ntfy://my-topic: {missing}\n"
    assert gq.files("pending") == []
    run = gq.gpuq("run", "--notify", "ntfy://my-topic", env=env, check=False)
    assert (run.returncode, run.stdout, run.stderr) == (1, "", f"gpuq run: --notify ntfy://my-topic: {missing}\n")
    # the user's default URLs: said at start, and the worker runs (a service must not stay down for them)
    job = gq.add("true")
    defaults = gq.gpuq("run", env=dict(env, GPUQ_NOTIFY="ntfy://my-topic"))
    assert defaults.stderr == f"gpuq run: warning: {missing}; until then, no job's events are sent\n"
    assert gq.state_of(job) == "done"
    assert gq.gpuq("add", "-q", "--notify", "ntfy://my-topic", "true").returncode == 0  # Apprise here: queued


def test_every_install_hint_names_a_command_that_installs_from_gpuqs_source(gq: Env) -> None:
    """`gpuq-spool[...]` is not on the package index: each hint installs the extra of the tree gpuq
    came from, with this environment's pip; the extras' packages are pyproject.toml's."""
    source, _editable = source_tree()
    assert source == str(REPO)  # a checkout, or the directory the test environment was installed from
    for extra in ("notify", "plot", "mcp"):
        command = install_command(extra)
        assert command.startswith(f"{sys.executable} -m pip install ") and "gpuq-spool[" not in command
        assert command.endswith(f"{shlex.quote(f'{REPO}[{extra}]')}")
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {extra: tuple(p.split(";")[0] for p in declared[extra]) for extra in PACKAGES} == PACKAGES
    if sys.version_info < (3, 10):
        return  # `gpuq mcp` says the SDK needs a newer Python first
    mcp = subprocess.run(  # `-S`: no site-packages, so no SDK, and gpuq found only as the checkout
        [sys.executable, "-S", "-m", "gpuq", "mcp"], cwd=gq.work, env=dict(gq.env, PYTHONPATH=str(REPO)),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert mcp.stderr == f"gpuq mcp: the MCP SDK is not installed: {sys.executable} -m pip install '{REPO}[mcp]'\n"


# ---- a bare number for a size of memory --------------------------------------------------------


def test_a_bare_number_for_a_memory_size_is_refused_with_the_reading_meant(gq: Env) -> None:
    for line, flag, text in (
        (["add", "--gpu-mem", "20", "true"], "--gpu-mem", "20"),
        (["add", "--gpu-mem", "0.5", "true"], "--gpu-mem", "0.5"),
        (["add", "--mem", "32", "true"], "--mem", "32"),
        (["add", "--dry-run", "--mem", "32", "true"], "--mem", "32"),
        (["lease", "--gpu-mem", "20", "--", "true"], "--gpu-mem", "20"),
        (["run", "--mem", "64"], "--mem", "64"),
    ):
        proc = gq.gpuq(*line, check=False)
        said = f"gpuq {line[0]}: {flag}: '{text}' has no unit: did you mean {text}G? (write {text}M for MiB)\n"
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", said), line
    assert gq.files("pending") == []
    job = gq.add("--gpu-mem", "20G", "--mem", "512M", "true")
    assert (gq.job(job)["gpu_mem_mib"], gq.job(job)["mem_mib"]) == (20480, 512)
    edit = gq.gpuq("edit", str(job), "--set", "gpu_mem=20", check=False)
    assert (edit.returncode, edit.stderr) == (
        2,
        "gpuq edit: --set gpu_mem: '20' has no unit: did you mean gpu_mem=20G? (write 20M for MiB)\n",
    )
    assert gq.job(job)["gpu_mem_mib"] == 20480  # left as it was
    gq.gpuq("edit", str(job), "--set", "gpu_mem=10G", "--set", "mem=null")
    assert (gq.job(job)["gpu_mem_mib"], gq.job(job)["mem_mib"]) == (10240, None)
    # a dropped file keeps its bare numbers as MiB (spool_layout.md, section 3): valid before, valid now
    (gq.home / "pending" / "sized.json").write_text(json.dumps({"cmd": ["true"], "gpu_mem": 20480, "mem": "2048"}))
    taken = dict(intake.take_in_some(Spool(gq.home), time.time() + 60)[0])  # every quiet period is over
    assert taken["sized.json"].startswith("job #"), taken
    dropped = int(taken["sized.json"].split("#")[1].split()[0])
    assert (gq.job(dropped)["gpu_mem_mib"], gq.job(dropped)["mem_mib"]) == (20480, 2048)


def test_edit_to_the_size_a_job_has_already_is_no_change(gq: Env) -> None:
    """`edit --set gpu_mem=20G` of a job with 20G (or 20480M, or mem and min_free in other units)
    says nothing changed and leaves the file alone; it said `changed: gpu_mem` and wrote it again."""
    Gpus(gq, fake_gpus(1))
    job = gq.add("--hold", "--gpu-mem", "20G", "--mem", "512M", "--min-free", "50G", "true")
    rev = gq.job(job)["rev"]
    for setting in ("gpu_mem=20G", "gpu_mem=20480M", "mem=512M", "mem=0.5G", "min_free=50G", "min_free=51200M"):
        assert gq.gpuq("edit", str(job), "--set", setting).stdout == f"job #{job}: nothing changed\n", setting
    assert gq.gpuq("edit", str(job), "--set", "gpu_mem=10G", "--set", "gpu_mem=20G").stdout.endswith(
        "nothing changed\n"
    )
    assert gq.job(job)["rev"] == rev
    assert (
        "changed: gpu_mem, min_free"
        in gq.gpuq("edit", str(job), "--set", "gpu_mem=10G", "--set", "min_free=40G").stdout
    )
    assert (gq.job(job)["gpu_mem_mib"], gq.job(job)["min_free_bytes"]) == (10240, 40 << 30)


def test_edit_to_the_command_a_job_runs_or_a_size_in_the_editor_in_other_units_is_no_change(
    gq: Env, tmp_path: Path
) -> None:
    """`edit --set 'cmd=["train.py", ...]'` that resolves to the command the job has, and an editor
    that writes "200G" over the file's 204800, said `changed: cmd` / `changed: gpu_mem` and wrote the
    job again. Both now say nothing changed and leave the file alone."""
    Gpus(gq, fake_gpus(1))
    gq.script("train.py", "")
    job = gq.add("--hold", "--gpu-mem", "20G", "--mem", "2G", "train.py", "--lr", "1")
    rev = gq.job(job)["rev"]
    same = gq.gpuq("edit", str(job), "--set", 'cmd=["train.py", "--lr", "1"]')
    assert same.stdout == f"job #{job}: nothing changed\n"
    editor = tmp_path / "editor.py"  # writes each size in other units
    editor.write_text(
        "import json, sys\nd = json.load(open(sys.argv[1]))\nd.update(gpu_mem='20G', mem='2048M')\n"
        "json.dump(d, open(sys.argv[1], 'w'))\n"
    )
    edited = gq.gpuq("edit", str(job), env=dict(gq.env, EDITOR=f"{sys.executable} {editor}"))
    assert edited.stdout == f"job #{job}: nothing changed\n"
    assert gq.job(job)["rev"] == rev
    other = gq.gpuq("edit", str(job), "--set", 'cmd=["train.py", "--lr", "2"]', "--set", "gpu_mem=20480M")
    assert other.stdout.splitlines()[0] == f"[~] Job #{job}: work/train changed: cmd"
    assert gq.job(job)["cmd"][-2:] == ["--lr", "2"] and gq.job(job)["rev"] == rev + 1


# ---- `gpuq cancel` of a running job --------------------------------------------------------------


def test_cancel_of_a_running_job_says_cancel_and_the_gpu_line_drops_it_at_once(gq: Env) -> None:
    Gpus(gq, fake_gpus(1))
    gq.script("wait.py", WAIT_FOR_GO)
    worker = gq.start_worker("--watch")
    running, waiting = gq.add("wait.py"), gq.add("wait.py")  # the second waits for the GPU: the worker keeps looking
    gq.wait_state(running, "running")
    fresh = lambda: json.loads(gq.gpuq("gpus", "--json").stdout)[0]  # noqa: E731
    wait_for(lambda: fresh()["jobs"] == [running] and fresh()["seen_by_worker"] == worker.pid, what="the view")
    os.kill(worker.pid, signal.SIGSTOP)  # its view stays as it last wrote it: listing the job
    try:
        cancelled = gq.gpuq("cancel", str(running))
        assert f"[-] Job #{running}: work/wait cancelled: it was running, killed" in cancelled.stdout
        gpu_line = next(line for line in gq.gpuq("status").stdout.splitlines() if line.startswith("  GPU 0"))
        assert f"#{running}" not in gpu_line, gpu_line
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    job = gq.job(running)
    assert (job["state"], job["note"]) == ("cancelled", "cancelled by user (gpuq cancel)")
    assert "cancelled by user (gpuq cancel)" in gq.gpuq("show", str(running)).stdout
    gq.wait_state(waiting, "running")
    gq.gpuq("kill", str(waiting))  # `gpuq kill` is still said so
    assert gq.job(waiting)["note"] == "killed by user (gpuq kill)"


# ---- command lines: name the command, say what was meant -------------------------------------------


def test_a_bad_add_line_names_add_and_a_bare_add_says_what_to_write(gq: Env) -> None:
    gq.script("train.py", "")
    short = gq.gpuq("add", "-n", "x", "train.py", check=False)
    assert (short.returncode, short.stderr) == (2, "gpuq add: unrecognized arguments: -n (see `gpuq add --help`)\n")
    other = gq.gpuq("log", "1", "--bogus", check=False)
    assert (other.returncode, other.stderr) == (
        2,
        "gpuq log: unrecognized arguments: --bogus (see `gpuq log --help`)\n",
    )
    for line in (["add"], ["add", "-q"], ["add", "--dry-run", "--gpus", "2"], ["add", "--"]):
        bare = gq.gpuq(*line, check=False)
        assert (bare.returncode, bare.stdout) == (2, ""), line
        assert bare.stderr == (
            "gpuq add: say what to queue: a script or a command, after gpuq's options (gpuq add train.py --lr "
            "3e-4, gpuq add --gpus 2 torchrun train.py; see `gpuq add --help`)\n"
        ), line
    assert gq.status_json() == []


def test_a_mistyped_command_offers_the_one_meant_and_never_the_hidden_ones(gq: Env) -> None:
    typo = gq.gpuq("stauts", check=False)
    assert (typo.returncode, typo.stdout) == (2, "")
    assert typo.stderr == "gpuq: unknown command 'stauts'; did you mean status? (`gpuq --help` lists the commands)\n"
    for word, meant in (("cancle", "cancel"), ("retyr", "retry"), ("ids", None), ("xyzzy", None)):
        proc = gq.gpuq(word, check=False)
        assert proc.returncode == 2 and "_ids" not in proc.stderr, proc.stderr
        assert (f"did you mean {meant}?" in proc.stderr) if meant else ("did you mean" not in proc.stderr)
    assert gq.gpuq("_ids").returncode == 0  # hidden, not gone: shell completion runs it


# ---- a held row ------------------------------------------------------------------------------------


def test_a_held_row_says_held_once(gq: Env) -> None:
    at_add = gq.add("--hold", "true")
    by_hold = gq.add("true")
    gq.gpuq("hold", str(by_hold))
    rows = gq.gpuq("status").stdout.splitlines()
    for job in (at_add, by_hold):
        row = next(line for line in rows if line.split()[:1] == [str(job)])
        assert row.count("held") == 1 and row.endswith(f"held: `gpuq release {job}` puts it back in line"), row
        shown = gq.gpuq("show", str(job)).stdout
        assert f"  state      held: `gpuq release {job}` puts it back in line\n" in shown and "held by" not in shown
    assert gq.job(by_hold)["note"] == "held by user (`gpuq release` puts it back in line)"  # kept in its file


# ---- `gpuq add` while the worker drains -----------------------------------------------------------


def test_add_while_the_worker_drains_says_the_job_waits_for_a_worker_to_run_again(gq: Env) -> None:
    gq.script("wait.py", WAIT_FOR_GO)
    worker = gq.start_worker("--watch")
    running = gq.add("wait.py")
    gq.wait_state(running, "running")
    gq.gpuq("stop", "--drain")
    wait_for(lambda: "draining: starting nothing new" in gq.gpuq("status").stdout, what="the worker to drain")
    added = gq.gpuq("add", "true")
    queued = int(added.stdout.split("#", 1)[1].split(":", 1)[0])
    assert added.stderr == (
        f"gpuq add: the worker is draining (`gpuq stop --drain`); #{queued} will not start until a worker runs "
        "again (`gpuq run --daemon` once the draining one has exited)\n"
    )
    dry = json.loads(gq.gpuq("add", "--dry-run", "--json", "true").stdout)["jobs"][0]["would_start"]
    assert dry["now"] is False and dry["why_not"].startswith("the worker is draining (`gpuq stop --drain`)")
    (gq.work / "go").write_text("")
    assert worker.wait(30) == 0  # its job ended: the worker exits, and the new job was never started
    assert gq.state_of(queued) == "pending"
    assert "no worker is running" in gq.gpuq("add", "true").stderr


# ---- an over-long path ---------------------------------------------------------------------------


def test_an_over_long_path_is_refused_naming_it_and_nothing_is_queued(gq: Env) -> None:
    """A name over 255 bytes, or a path over 4096 in all: `add ./NAME` exited 1 with the OS's `File
    name too long`, `--dir` and a .py said "not found", `adopt --log` exited 1 as `add` did."""
    name = "a" * 300
    deep = "/".join(["c" * 200] * 25)  # each name fits; the whole does not
    for args, what, path in (
        (["--dir", f"/tmp/{name}", "true"], "--dir", f"/tmp/{name}"),
        (["--dir", deep, "true"], "--dir", f"{gq.work}/{deep}"),
        ([f"{name}.py"], "script", f"{gq.work}/{name}.py"),
        ([f"./{name}", "--lr", "3"], "script", f"{gq.work}/./{name}"),
        ([f"./{deep}/run.sh"], "script", f"{gq.work}/./{deep}/run.sh"),
        (["--dry-run", f"./{name}"], "script", f"{gq.work}/./{name}"),
    ):
        proc = gq.gpuq("add", *args, check=False)
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"gpuq add: {what}: path too long: {path}\n")
    proc = gq.gpuq("adopt", str(os.getpid()), "--log", name, check=False)
    assert (proc.returncode, proc.stderr) == (2, f"gpuq adopt: --log: path too long: {gq.work}/{name}\n")
    assert gq.files("pending") == gq.files("running") == [] and gq.status_json() == []


# ---- a whole command quoted as one word --------------------------------------------------------------


def test_a_whole_command_in_one_quoted_word_is_refused_with_the_line_to_type(gq: Env) -> None:
    gq.script("train.py", "")
    for words, fix in (
        (["python train.py --steps 2"], "gpuq add python train.py --steps 2"),
        (["python train.py", "--lr", "3"], "gpuq add python train.py --lr 3"),
        (["python train.py | tee out.log"], "gpuq add bash -c 'python train.py | tee out.log'"),
    ):
        proc = gq.gpuq("add", *words, check=False)
        assert (proc.returncode, proc.stdout) == (2, ""), words
        assert proc.stderr.startswith(f"gpuq add: no file or command is named {words[0]!r}, one word with spaces: ")
        assert proc.stderr.endswith(f": {fix}\n") and proc.stderr.count("\n") == 1, proc.stderr
    assert gq.status_json() == []
    spaced = gq.script("my run.sh", "echo ran\n")  # a file whose name has a space is still a script
    spaced.chmod(0o755)
    job = gq.add("./my run.sh")
    assert gq.job(job)["cmd"] == ["./my run.sh"]


def test_an_empty_conda_or_python_is_refused_and_nothing_is_queued(gq: Env) -> None:
    """`--conda ""` and `--python ""` were ignored (the job ran with the PATH's python), so `--conda
    "$ENV"` with ENV unset ran in the wrong environment; `--conda " "` exited 1."""
    gq.script("t.py", "print(1)\n")
    for flag, value in (("--conda", ""), ("--conda", " "), ("--python", ""), ("-p", "")):
        proc = gq.gpuq("add", f"{flag}={value}", "t.py", check=False)
        assert (proc.returncode, proc.stdout, proc.stderr.count("\n")) == (2, "", 1), proc
        assert f"expected a value, got {value!r}" in proc.stderr
    assert gq.status_json() == []


def test_an_empty_dir_is_refused_not_taken_as_the_current_one(gq: Env) -> None:
    """`--dir ""` queued the job in the current directory, so `--dir "$DIR"` with DIR unset ran it
    in the wrong place; it is refused in the engine (MCP's add too), and nothing is queued."""
    gq.script("t.py", "print(1)\n")
    for flag, value in (("--dir", ""), ("-d", ""), ("--dir", " ")):
        proc = gq.gpuq("add", f"{flag}={value}", "t.py", check=False)
        said = f"gpuq add: --dir: expected a value, got {value!r}\n"
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", said), proc
    assert gq.status_json() == []


def test_the_mcp_tools_add_refuses_an_empty_conda_or_python_as_the_cli_does(gq: Env) -> None:
    """The refusal lived in the CLI's option table, so MCP's add queued `conda=""` and ran the job
    with the PATH's python; it is the engine's now, for every caller."""
    pytest.importorskip("mcp")
    from gpuq.cli.assistant import tools
    from gpuq.core.errors import UsageError
    from gpuq.engine.lifecycle import enqueue

    gq.script("t.py", "print(1)\n")
    for field in ("conda", "python"):
        with pytest.raises(UsageError, match=f"--{field}: expected a value, got ''"):
            enqueue.prepare(tools.request({"cmd": ["t.py"], "dir": str(gq.work), field: ""}))
