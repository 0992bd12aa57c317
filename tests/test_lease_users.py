"""Every gpuq job takes its GPU lease (issue 28): its supervisor holds it while the job runs, and
two real Unix users share one (simulated) GPU, each with a spool and a worker of their own.

The users are made here (`useradd --system`, a name unique to this run) and removed at the end; those
tests are skipped, saying why, where that cannot be done (not root, no useradd, no interpreter with
which they can run this checkout's gpuq). Both workers read one GPUQ_FAKE_GPUS file, which never
changes: the leases alone keep them apart. The jobs write their own start and end stamps, from which
the tests check that they never overlapped.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator, Optional

import pytest
from conftest import WAIT_FOR_GO, Env, alive, spool_with_true_jobs, wait_for
from test_gpu_worker import Gpus, fake_gpus

import gpuq
from gpuq.cli.cmd_worker import RUN_NEEDS
from gpuq.core.job import Job
from gpuq.core.states import DONE, PENDING, RUNNING
from gpuq.engine.schedule.planner import OtherLeases, Planner
from gpuq.engine.schedule.scheduler import QueueState
from gpuq.run.supervisor import lease as supervisor_lease
from gpuq.run.supervisor.order import StartOrder
from gpuq.run.supervisor.start import begin
from gpuq.run.worker import FULL_STEP_SECONDS
from gpuq.spool import Spool
from gpuq.system.gpus import from_json, look
from gpuq.system.leases import LeaseDir

GPU_TOTAL_MIB = 10000
# The users' processes import gpuq from this checkout and its dependencies from this venv, whichever
# interpreter runs them (see _interpreter).
IMPORT_PATH = os.pathsep.join(
    dict.fromkeys([str(Path(gpuq.__file__).parent.parent), *(sysconfig.get_path(k) for k in ("purelib", "platlib"))])
)
# A job's start and end, written by the job itself (GNU date: seconds with nanoseconds).
STAMPED = 'date +%s.%N > "s.$GPUQ_JOB_ID"; sleep "$1"; date +%s.%N > "e.$GPUQ_JOB_ID"'
ENQUEUE = """import sys
from gpuq.engine.lifecycle import enqueue
from gpuq.engine.lifecycle.enqueue import Variant
from gpuq.spool import Spool
home, cwd, count, mem, cmd = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
spool = Spool(__import__("pathlib").Path(home)).ensure()
options = {"gpu_request": 1, "gpu_mem_mib": int(mem) if mem != "whole" else None}
env = {"PATH": "/usr/bin:/bin"}
jobs = enqueue.enqueue_many(spool, [Variant(list(cmd), None) for _ in range(count)], cwd=cwd, venv=None, env={},
                            shell_env=env, after=[], after_any=[], retries=0, options=options)
print(" ".join(str(job["id"]) for _ref, job in jobs))
"""


class User:
    """A Unix user made for this run: a directory of its own, its spool in it, its worker."""

    def __init__(self, name: str, base: Path):
        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, entry.pw_uid, entry.pw_gid
        self.dir = base / name
        self.dir.mkdir(mode=0o700)
        os.chown(self.dir, self.uid, self.gid)
        self.home = self.dir / "spool"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.dir),
            "USER": name,
            "LOGNAME": name,
            "GPUQ_HOME": str(self.home),
            "GPUQ_FAKE_GPUS": str(base / "gpus.json"),
            "GPUQ_LEASE_DIR": str(base / "leases"),
            "GPUQ_INTAKE_QUIET": "0.3",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": IMPORT_PATH,
        }
        self.python = sys.executable  # until _interpreter finds one this user can run
        self.worker: Optional[subprocess.Popen] = None

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """A command as this user, in its directory."""
        return subprocess.run(
            argv, cwd=self.dir, env=self.env, user=self.uid, group=self.gid, extra_groups=[],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def add(self, count: int, seconds: float, mem: Optional[int] = None, go: bool = False) -> list[int]:
        """`count` jobs of one GPU (whole, or `mem` MiB of it), queued through the library as
        `gpuq add` queues them; each stamps its start and end around `seconds` of sleep (or, with
        `go`, until the file `go` appears in this user's directory)."""
        script = STAMPED.replace('sleep "$1"', "while [ ! -e go ]; do sleep 0.02; done") if go else STAMPED
        cmd = ["sh", "-c", script, "job", str(seconds)]
        proc = self.run(
            self.python, "-c", ENQUEUE, str(self.home), str(self.dir), str(count), str(mem or "whole"), *cmd
        )
        assert proc.returncode == 0, proc.stderr
        return [int(i) for i in proc.stdout.split()]

    def start_worker(self) -> None:
        out = open(self.dir.parent / f"worker-{self.name}.out", "wb")
        self.worker = subprocess.Popen(
            [self.python, "-m", "gpuq", "run"], cwd=self.dir, env=self.env, user=self.uid, group=self.gid,
            extra_groups=[], stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        out.close()

    def worker_output(self) -> str:
        return (self.dir.parent / f"worker-{self.name}.out").read_text()

    def intervals(self, ids: list[int]) -> list[tuple[float, float, str]]:
        """Each job's (start, end, who) from its own stamps."""
        found = []
        for job_id in ids:
            start, end = (float((self.dir / f"{edge}.{job_id}").read_text()) for edge in "se")
            found.append((start, end, f"{self.name}'s job #{job_id}"))
        return found

    def job(self, job_id: int) -> dict:
        """The job's file as JSON (root reads it; the newest copy during a move)."""
        copies = []
        for state in ("pending", "running", "done", "failed"):
            for path in (self.home / state).glob(f"{job_id:06d}-*.json"):
                try:
                    copies.append(dict(json.loads(path.read_text()), state=state))
                except (OSError, ValueError):
                    continue
        return max(copies, key=lambda job: job["rev"]) if copies else {}

    def waiting(self, job_id: int) -> str:
        """Why the job waits, as `gpuq status --json`, run by this user, says it."""
        proc = self.run(self.python, "-m", "gpuq", "status", "--json")
        rows = json.loads(proc.stdout) if proc.returncode == 0 else []
        return next((row.get("waiting") or "" for row in rows if row["id"] == job_id), "")

    def stop(self) -> None:
        """The worker, then every process of this user still there (jobs, supervisors)."""
        if self.worker is not None and self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(10)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait()
        for pid in _processes_of(self.uid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _processes_of(uid: int) -> list[int]:
    """The pids of a user made by this test: every one of them was started here."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid:
                pids.append(int(entry))
        except FileNotFoundError:
            continue
    return pids


def _make_user(tag: str) -> str:
    name = f"gq{tag}{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
        capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"useradd refused: {proc.stderr.strip() or proc.returncode}")
    return name


def _interpreter(user: User) -> str:
    """An interpreter with which the user can run this checkout's gpuq: this one, or else one of the same major.minor
    on the PATH or in /usr/bin (a venv's interpreter may sit under a home others cannot enter: in CI
    it is pyenv's under /root, 0700). The venv's packages are on PYTHONPATH, and their compiled parts
    fit any interpreter of that major.minor. Skips, saying why each one failed, when none can."""
    name = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    found = [sys.executable]
    for directory in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/local/bin", "/usr/bin"]:
        candidate = shutil.which(name, path=directory) if directory else None
        if candidate and os.path.realpath(candidate) not in map(os.path.realpath, found):
            found.append(candidate)
    probe = f"import gpuq.system.leases, {', '.join(RUN_NEEDS)}; print(gpuq.__file__)"
    failed = []
    for python in found:
        try:
            proc = user.run(python, "-c", probe)
        except OSError as exc:  # the interpreter itself cannot be run by the user
            failed.append(f"{python}: {exc.strerror}")
            continue
        said = proc.stderr.strip().splitlines()
        if proc.returncode == 0 and proc.stdout.strip() == gpuq.__file__:
            return python
        if proc.returncode == 0:  # the installed copy, say, where the checkout cannot be entered
            said = [f"imports gpuq from {proc.stdout.strip()}, not {gpuq.__file__}"]
        failed.append(f"{python}: {said[-1] if said else f'exit {proc.returncode}'}")
    pytest.skip(f"no interpreter another user can run gpuq with ({'; '.join(failed)})")


@pytest.fixture
def users() -> Iterator[tuple[User, User]]:
    """Two fresh users, alice and bob, sharing one fake GPU file and one lease directory (1777)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to add two users")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel not found")
    base = Path(tempfile.mkdtemp(prefix="gpuq-lease-users-"))
    names: list[str] = []
    made: list[User] = []
    try:
        base.chmod(0o755)  # theirs to traverse: pytest's own tmp dirs are 0700 root
        (base / "gpus.json").write_text(json.dumps({"gpus": [_gpu()]}))
        (base / "gpus.json").chmod(0o644)
        (base / "leases").mkdir()
        (base / "leases").chmod(0o1777)
        for tag in "ab":
            names.append(_make_user(tag))
        made = [User(name, base) for name in names]
        made[0].python = made[1].python = _interpreter(made[0])
        yield made[0], made[1]
    finally:
        for user in made:
            user.stop()
        for name in names:
            subprocess.run(["userdel", name], capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)


def _gpu() -> dict:
    return {
        "index": 0, "name": "Fake H100", "uuid": "GPU-fake-shared-0", "memory_total_mib": GPU_TOTAL_MIB,
        "memory_used_mib": 0, "processes": [],
    }  # fmt: skip


def _finish(*users: User, timeout: float = 60) -> None:
    """Both workers exit by themselves once their queues are empty."""
    for user in users:
        assert user.worker is not None
        try:
            user.worker.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{user.name}'s worker did not finish:\n{user.worker_output()}") from None


def _most_at_once(intervals: list[tuple[float, float, str]]) -> tuple[int, list[str]]:
    """The most jobs running at one moment (a job's start is such a moment), and which."""
    most: tuple[int, list[str]] = (0, [])
    for start, _end, _who in intervals:
        now = [who for s, e, who in intervals if s <= start < e]
        most = max(most, (len(now), now), key=lambda m: m[0])
    return most


def test_whole_gpu_jobs_of_two_users_started_together_never_overlap(users: tuple[User, User]) -> None:
    alice, bob = users
    ids = {alice: alice.add(20, 0.05), bob: bob.add(20, 0.05)}
    alice.start_worker()
    bob.start_worker()
    _finish(alice, bob)
    intervals = sorted(alice.intervals(ids[alice]) + bob.intervals(ids[bob]))
    count, together = _most_at_once(intervals)
    assert count == 1, f"on the GPU at once: {together}"


def test_memory_leases_of_two_users_never_add_up_past_the_gpu(users: tuple[User, User]) -> None:
    alice, bob = users
    mem = 4000  # two fit in the GPU's 10000 MiB, three do not
    ids = {alice: alice.add(6, 0.3, mem=mem), bob: bob.add(6, 0.3, mem=mem)}
    alice.start_worker()
    bob.start_worker()
    _finish(alice, bob)
    count, together = _most_at_once(alice.intervals(ids[alice]) + bob.intervals(ids[bob]))
    assert count * mem <= GPU_TOTAL_MIB, f"{count} jobs of {mem} MiB on a {GPU_TOTAL_MIB} MiB GPU at once: {together}"
    assert count == 2, "two jobs fit at once: the leases still share the GPU"


def _held_back(user: User, why: str) -> int:
    """A job of `user`, queued and its worker started, that waits saying `why` and has not started."""
    [job] = user.add(1, 0.05)
    user.start_worker()
    reason = wait_for(lambda: user.waiting(job), 20, what=f"{user.name}'s job to say why it waits")
    assert why in reason, reason
    assert not (user.dir / f"s.{job}").exists()
    return job


def test_a_job_waits_for_the_other_users_lease_until_its_supervisor_is_killed(users: tuple[User, User]) -> None:
    alice, bob = users
    [held] = alice.add(1, 0, go=True)
    alice.start_worker()
    supervisor = wait_for(lambda: (alice.job(held).get("supervisor") or {}).get("pid"), 20, what="alice's job running")
    leases = LeaseDir.open(alice.env["GPUQ_LEASE_DIR"])
    [lease] = leases.live()
    # By uid: the test process keeps a uid's name a minute, and an earlier test's user may have had it.
    assert (lease.uid, lease.job, lease.pid) == (alice.uid, held, supervisor)
    waiting = _held_back(bob, f"leased whole by {alice.name}'s job #{held}")
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: not alive(supervisor), 5, what="the supervisor to die")
    # stale once its holder is gone (a child it was forking when killed holds the lock until its exec)
    wait_for(lambda: leases.live() == [], 5, what="a killed holder's lease to be stale")
    wait_for(lambda: (bob.dir / f"e.{waiting}").exists(), 15, what="bob's job to run once the lease is gone")
    os.killpg(alice.job(held)["pid"], signal.SIGKILL)  # alice's job outlived its supervisor


def test_a_gpuq_lease_of_one_user_delays_the_other_users_job_until_its_command_ends(users: tuple[User, User]) -> None:
    alice, bob = users
    command = "while [ ! -e go ]; do sleep 0.02; done; date +%s.%N > lease.end"
    lease = subprocess.Popen(
        [alice.python, "-m", "gpuq", "lease", "--", "sh", "-c", command], cwd=alice.dir, env=alice.env,
        user=alice.uid, group=alice.gid, extra_groups=[], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        leases = LeaseDir.open(alice.env["GPUQ_LEASE_DIR"])
        [taken] = wait_for(leases.live, 20, what="alice's gpuq lease to hold the GPU")
        assert (taken.uid, taken.job, taken.whole) == (alice.uid, None, True)
        job = _held_back(bob, f"leased whole by {alice.name}'s `sh` (gpuq lease, pid {taken.pid})")
        (alice.dir / "go").touch()
        assert lease.wait(15) == 0, lease.stderr.read() if lease.stderr else ""
        assert leases.live() == [], "the lease ends with its command"
        wait_for(lambda: (bob.dir / f"e.{job}").exists(), 15, what="bob's job to run once the lease has ended")
        assert float((bob.dir / f"s.{job}").read_text()) >= float((alice.dir / "lease.end").read_text())
    finally:
        if lease.poll() is None:
            os.killpg(lease.pid, signal.SIGKILL)
            lease.wait()


def test_a_process_one_user_adopted_keeps_the_other_users_job_off_its_gpu_until_it_ends(
    users: tuple[User, User],
) -> None:
    """Alice adopts a training she started by hand on GPU 0, before it holds any GPU memory: bob's
    gpuq saw nothing on the GPU (an adopted job took no lease) and started his job there. Her job's
    lease keeps his off until her process ends."""
    alice, bob = users
    script = "while [ ! -e go ]; do sleep 0.02; done; date +%s.%N > hand.end"
    by_hand = subprocess.Popen(
        ["sh", "-c", script], cwd=alice.dir, env=dict(alice.env, CUDA_VISIBLE_DEVICES="0"), user=alice.uid,
        group=alice.gid, extra_groups=[], start_new_session=True,
    )  # fmt: skip
    try:
        adopt = alice.run(alice.python, "-m", "gpuq", "adopt", str(by_hand.pid), "--name", "by hand")
        assert adopt.returncode == 0, adopt.stderr
        adopted = int(adopt.stdout.split("#")[1].split(":")[0])
        job = _held_back(bob, f"leased whole by {alice.name}'s job #{adopted}")
        (alice.dir / "go").touch()
        by_hand.wait(10)
        wait_for(lambda: (bob.dir / f"e.{job}").exists(), 15, what="bob's job to run once alice's process ended")
        assert float((bob.dir / f"s.{job}").read_text()) >= float((alice.dir / "hand.end").read_text())
    finally:
        if by_hand.poll() is None:
            by_hand.kill()
            by_hand.wait()


def test_a_placing_lock_its_owner_made_unreadable_is_said_by_the_worker_gpus_and_status(
    users: tuple[User, User],
) -> None:
    """Bob made GPU 0's placing lock, then `chmod 000` it: alice's gpuq can take no lease there. Her
    job runs on the memory gate alone, and her worker's log, `gpuq gpus` and `gpuq status` say why in
    one line each (only the job's log and `gpuq lease` did)."""
    alice, bob = users
    assert bob.run(bob.python, "-m", "gpuq", "lease", "--no-wait", "--", "true").returncode == 0
    lock = Path(bob.env["GPUQ_LEASE_DIR"]) / "gpuq-lock.GPU-fake-shared-0"
    assert bob.run("chmod", "000", str(lock)).returncode == 0
    [job] = alice.add(1, 0.05)
    alice.start_worker()
    _finish(alice)
    assert (alice.dir / f"e.{job}").exists()
    line = f"placing lock {lock} cannot be opened: Permission denied; leases are off, the GPU memory gate alone decides"
    assert alice.worker_output().count(line) == 1, alice.worker_output()
    for command in ("gpus", "status"):
        shown = alice.run(alice.python, "-m", "gpuq", command).stdout
        assert shown.count(line) == 1, shown


# ---- one user: a job's supervisor and its lease ------------------------------------------------


def _worker_has_looked(gq: Env) -> None:
    """A step that saw every job added so far has been taken: it took in a file dropped now."""
    dropped = gq.home / "pending" / "marker.json"
    dropped.write_text(json.dumps({"cmd": ["true"], "cwd": str(gq.work)}))
    wait_for(lambda: not dropped.exists(), 20, what="the worker to take in a dropped file")


def _running(gq: Env, job_id: int) -> dict:
    return wait_for(lambda: gq.job(job_id).get("pid") and gq.job(job_id), 20, what=f"job {job_id} running")


def _open_files(pid: int) -> list[str]:
    """What the process's descriptors name (one closed while we look is passed over)."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            continue
    return found


def _trying_the_lock(lease_dir: Path) -> bool:
    """Whether a process other than this one has a placing lock file of `lease_dir` open."""
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        try:
            if any(name.startswith(f"{lease_dir}/gpuq-lock.") for name in _open_files(pid)):
                return True
        except OSError:  # gone, or not ours to look at
            continue
    return False


def test_a_jobs_supervisor_holds_its_lease_while_it_runs_and_hands_it_on_with_the_slot(
    gq: Env, own_lease_dir: Path
) -> None:
    Gpus(gq, fake_gpus(1))
    gq.start_worker("--watch")
    gq.script("wait.py", WAIT_FOR_GO)
    gq.script("wait2.py", WAIT_FOR_GO.replace("'go'", "'go2'"))
    a = gq.add("wait.py")
    job = _running(gq, a)
    leases = LeaseDir.open(own_lease_dir)
    [held] = leases.live()
    assert (held.job, held.pid, held.spool, held.gpu_uuid, held.whole) == (
        a, job["supervisor"]["pid"], Spool(gq.home).lease_id.read(), "GPU-fake-0", True
    )  # fmt: skip
    assert not [fd for fd in _open_files(job["pid"]) if fd.startswith(str(own_lease_dir))], "the job has no lease file"
    b = gq.add("wait2.py")
    _worker_has_looked(gq)  # B is named to A's supervisor, for A's GPU
    (gq.work / "go").write_text("")
    gq.wait_state(a, DONE)
    following = _running(gq, b)
    assert following["supervisor"]["pid"] == job["supervisor"]["pid"], "handed on in the slot"
    assert [(lease.job, lease.pid) for lease in leases.live()] == [(b, job["supervisor"]["pid"])], "A's lease is gone"
    (gq.work / "go2").write_text("")
    gq.wait_state(b, DONE)
    wait_for(lambda: leases.live() == [], 10, what="no lease once the jobs (the marker too) have ended")
    assert not [name for name in os.listdir(own_lease_dir) if name.endswith(".lease")]


def test_a_job_given_back_for_a_lease_taken_meanwhile_waits_for_it_without_being_started_again(
    gq: Env, own_lease_dir: Path
) -> None:
    """Another party's lease is written while the worker's supervisor waits for the GPU's placing
    lock (the worker had looked before): the supervisor gives the job back, the worker looks again
    soon and says the job waits for that lease, and starts it once, when the lease ends. Its log
    says the start once, when it happened (it said `starting job` at each hand-over: twice)."""
    Gpus(gq, fake_gpus(1))
    leases = LeaseDir.open(own_lease_dir)
    gq.start_worker("--watch")
    with leases.placing(["GPU-fake-0"]):
        job = gq.add("true")
        # The supervisor may still be starting (a new interpreter): wait until it tries the lock.
        wait_for(lambda: _trying_the_lock(own_lease_dir), 20, what="the supervisor to wait for the placing lock")
        theirs = leases.take("GPU-fake-0", 0, None, job=12, name="train", spool="/home/someone/.gpuq")

    def reason() -> str:  # until the worker sees the supervisor gone, it says the job waits for itself
        return next(r for r in gq.status_json() if r["id"] == job)["waiting"] or ""

    # The worker looks again on the give-back (its file event, or its look every few seconds while a
    # GPU job starts), not at its once-a-minute full look: a bound that no load comes near.
    soon = FULL_STEP_SECONDS / 2
    wait_for(lambda: "leased whole by your job #12 in another" in reason(), soon, what="the lease named as the reason")
    assert gq.state_of(job) == PENDING and f"starting job #{job} " not in gq.worker_output(), "it did not start"
    theirs.release()
    gq.wait_state(job, DONE)
    # The worker says so once it sees the job started, which a `true` may outrun.
    wait_for(lambda: f"starting job #{job} " in gq.worker_output(), 5, what="the start said")
    assert gq.worker_output().count(f"starting job #{job} ") == 1, gq.worker_output()


def _one_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int = 1) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(fake_gpus(count)))
    monkeypatch.setenv("GPUQ_FAKE_GPUS", str(path))


def _order(ref: object, job: dict, gpus: Optional[tuple[int, ...]] = (0,)) -> StartOrder:
    slot = None if gpus is None else ",".join(map(str, gpus))
    return StartOrder(job["id"], ref.name, job["rev"], slot=slot, gpus=gpus, foreign_threshold_mib=1024)  # type: ignore[attr-defined]


def test_a_job_whose_gpu_was_leased_since_the_worker_looked_is_given_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_lease_dir: Path
) -> None:
    _one_gpu(tmp_path, monkeypatch)
    spool, [(ref, job), (ref2, job2)] = spool_with_true_jobs(tmp_path, 2)
    leases = LeaseDir.open(own_lease_dir)
    theirs = leases.take("GPU-fake-0", 0, None, job=12, name="train", spool="/home/someone/.gpuq")
    claim = spool.claims.claim(ref.id)
    assert begin(spool, claim, _order(ref, job)) is None
    assert spool.jobs.states_holding(ref.name, (PENDING, RUNNING)) == [PENDING]
    assert spool.claims.held(ref.id) is None, "the claim is given up"
    assert [lease.job for lease in leases.live()] == [12], "and no lease of ours is left"
    theirs.release()
    run = begin(spool, spool.claims.claim(ref.id), _order(ref, job))
    assert run is not None and [held.lease.job for held in run.leases] == [ref.id]
    # its slot handed on: the next job's lease is taken beside the ended job's, which then goes
    following = begin(spool, spool.claims.claim(ref2.id), _order(ref2, job2), run.leases)
    assert following is not None and [lease.job for lease in leases.live()] == [ref2.id]
    supervisor_lease.release(following.leases)
    for started in (run, following):
        os.close(started.log_fd)
        started.claim.release()


def test_without_gpus_and_for_a_cpu_job_no_lease_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_lease_dir: Path
) -> None:
    _one_gpu(tmp_path, monkeypatch)
    spool, jobs = spool_with_true_jobs(tmp_path, 2)
    for (ref, job), gpus in zip(jobs, (None, ())):
        run = begin(spool, spool.claims.claim(ref.id), _order(ref, job, gpus))
        assert run is not None and run.leases == []
        os.close(run.log_fd)
        run.claim.release()
    assert not own_lease_dir.exists(), "the lease directory is not even made"


def test_a_supervisor_that_cannot_use_the_lease_directory_says_so_in_the_log_and_starts_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _one_gpu(tmp_path, monkeypatch)
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # not sticky
    monkeypatch.setenv("GPUQ_LEASE_DIR", str(loose))
    spool, [(ref, job)] = spool_with_true_jobs(tmp_path)
    run = begin(spool, spool.claims.claim(ref.id), _order(ref, job))
    assert run is not None and run.leases == [], "the GPU memory gate alone decided"
    os.close(run.log_fd)
    run.claim.release()
    log = spool.logs.path_of(run.job)
    lines = [line for line in Path(log).read_text().splitlines() if "not sticky" in line]
    assert len(lines) == 1 and lines[0].startswith("=== gpuq: lease directory"), lines


def test_the_planner_counts_the_leases_of_others_but_not_of_its_own_spool(tmp_path: Path, own_lease_dir: Path) -> None:
    home = str(tmp_path / "spool")
    leases = LeaseDir.open(own_lease_dir)
    ours = leases.take("GPU-fake-0", 0, None, job=1, name="ours", spool=home)
    theirs = leases.take("GPU-fake-1", 1, None, job=12, name="theirs", spool="/home/someone/.gpuq")
    said: list[str] = []
    others = OtherLeases(home, said.append)
    assert [lease.job for lease in others()] == [12]
    gpus = look()._replace(gpus=from_json(fake_gpus(2)), source="fake", problem=None)
    pending = [Job({"id": i, "name": f"j{i}", "rev": 0, "priority": 0, "after": [], "after_any": []}) for i in (2, 3)]
    snap = QueueState({2: PENDING, 3: PENDING}, pending, [], time.time())
    plan = Planner(look=lambda: gpus, leases=others).plan(snap, {})
    assert [(job.id, where.gpus) for job, where in plan.starts] == [(2, (0,))], "GPU 0 is its own (running/ says so)"
    assert "job #12" in plan.waits[3].reason, plan.waits[3].reason
    assert said == []
    ours.release()
    theirs.release()


def test_a_lease_directory_that_cannot_be_trusted_is_said_once_and_planning_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # not sticky: other users could remove our leases
    said: list[str] = []
    monkeypatch.setenv("GPUQ_LEASE_DIR", str(loose))
    others = OtherLeases(str(tmp_path / "spool"), said.append)
    assert others() == [] and others() == []
    assert len(said) == 1 and "sticky" in said[0], said


@pytest.mark.parametrize("planted", ["a symlink to a good directory", "not sticky"])
def test_a_planted_lease_directory_is_said_in_one_line_and_the_jobs_still_run(
    gq: Env, tmp_path: Path, planted: str
) -> None:
    Gpus(gq, fake_gpus(1))
    real = tmp_path / "real"
    real.mkdir()
    real.chmod(0o1777)
    where = tmp_path / "planted"
    if planted == "not sticky":
        where.mkdir()
        where.chmod(0o777)
    else:
        where.symlink_to(real)
    gq.env["GPUQ_LEASE_DIR"] = str(where)
    ids = [gq.add("--gpus", "1", "true") for _ in range(3)]
    gq.start_worker()
    for job_id in ids:
        gq.wait_state(job_id, DONE)
    said = [line for line in gq.worker_output().splitlines() if f"lease directory {where}" in line]
    assert len(said) == 1, gq.worker_output()
    shown = gq.gpuq("gpus").stdout
    assert shown.count(f"lease directory {where}") == 1, shown
    assert "Traceback" not in gq.worker_output() + shown
    assert not any(real.iterdir()), "nothing was written through the link"
