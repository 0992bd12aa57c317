"""Jobs handed to a Ray cluster (`gpuq ray submit | sync | status`) against a real one-node Ray head
started here on loopback (tests/ray_cluster.py; skipped with the reason where Ray is not installed
or does not start). What needs no cluster (no answer at the address, the address's forms) runs
everywhere.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from contextlib import contextmanager, suppress
from typing import Any, Callable, Iterator, Optional, Union

import pytest
from conftest import WAIT_FOR_GO, alive, wait_for
from ray_cluster import free_port, ray_head  # noqa: F401  (the fixture)
from test_gpu_worker import Gpus, fake_gpus
from test_oom import OOM_ONCE

from gpuq.core import failure
from gpuq.core import ray_transitions as rt
from gpuq.core.errors import UsageError
from gpuq.core.job import Job
from gpuq.core.states import FAILED, RAY
from gpuq.core.times import now_iso
from gpuq.engine.lifecycle.ray_handover import entrypoint, fits, own_part, submission_fields
from gpuq.engine.lifecycle.ray_room import Room, host_oom, num_gpus, resources
from gpuq.spool import Spool
from gpuq.system import rayjobs


def on_ray(gq: Any, head: Any) -> Any:
    gq.env["RAY_ADDRESS"] = head.address
    return gq


def synced_until(gq: Any, job_id: int, state: str, timeout: float = 60, said: Optional[list] = None) -> dict:
    """`gpuq ray sync` until the job is in `state` (each sync asks Ray once); `said`: what each printed."""

    def there() -> bool:
        out = gq.gpuq("ray", "sync").stdout
        if said is not None:
            said.append(out)
        return gq.state_of(job_id) == state

    wait_for(there, timeout, interval=0.3, what=f"job {job_id} to be {state}")
    return gq.job(job_id)


def test_a_job_runs_on_ray_and_its_exit_code_and_log_come_back(gq: Any, ray_head: Any) -> None:  # noqa: F811
    on_ray(gq, ray_head)
    good = gq.add("--gpus", "1", "--", "sh", "-c", 'echo "ran on ray gpus=$CUDA_VISIBLE_DEVICES id=$GPUQ_JOB_ID"')
    bad = gq.add("--gpus", "0", "--", "sh", "-c", "echo about to fail; exit 3")
    out = gq.gpuq("ray", "submit", str(good), str(bad))
    assert f"Job #{good}" in out.stdout and f"Job #{bad}" in out.stdout
    assert gq.state_of(good) == "ray" and gq.job(good)["ray"]["submission_id"]
    done = synced_until(gq, good, "done")
    failed = synced_until(gq, bad, "failed")
    assert done["exit_code"] == 0 and failed["exit_code"] == 3
    assert done["history"][-1]["ray_state"] == "SUCCEEDED" and failed["history"][-1]["ray_state"] == "FAILED"
    log = gq.gpuq("log", str(good)).stdout
    assert f"ran on ray gpus=0 id={good}" in log or f"ran on ray gpus=1 id={good}" in log
    assert "about to fail" in gq.gpuq("log", str(bad)).stdout
    shown = gq.gpuq("status", "-a").stdout
    assert "exit=3" in shown


def test_status_and_show_say_where_a_job_on_ray_is(gq: Any, ray_head: Any) -> None:  # noqa: F811
    on_ray(gq, ray_head)
    body = "import os\nprint('Step', '3/10')\nprint('progress at', os.environ['GPUQ_PROGRESS_FILE'], flush=True)\n"
    body += WAIT_FOR_GO
    job = gq.add("--gpus", "0", "--", "python3", "-c", body)
    gq.gpuq("ray", "submit", str(job))
    sub_id = gq.job(job)["ray"]["submission_id"]
    wait_for(lambda: f"ray {sub_id} RUNNING" in gq.gpuq("status").stdout, 60, 0.3, "status to show it running")
    wanted = f"Step 3/10\nprogress at {gq.home / 'progress' / f'{job:06d}.json'}\n"  # on the shared filesystem
    wait_for(lambda: wanted in gq.gpuq("log", str(job)).stdout, 30, 0.3, "its log to come back")
    eta = gq.gpuq("eta", str(job)).stdout
    assert f"#{job} " in eta and "(ray)" in eta and "3/10" in eta, eta
    assert f"Ray job {sub_id} at {ray_head.address}: RUNNING" in gq.gpuq("show", str(job)).stdout
    cluster = gq.gpuq("ray", "status").stdout
    assert "127.0.0.1 (head)  2 GPU" in cluster and f"runs #{job} " in cluster
    (gq.work / "go").write_text("")
    synced_until(gq, job, "done")


def test_two_jobs_with_after_run_in_order(gq: Any, ray_head: Any) -> None:  # noqa: F811
    on_ray(gq, ray_head)
    stamp = "import sys, time; time.sleep(float(sys.argv[2])); open(sys.argv[1], 'w').write(repr(time.time()))"
    first = gq.add("--gpus", "0", "--", "python3", "-c", stamp, "first", "1.5")
    second = gq.add("--gpus", "0", "--after", str(first), "--", "python3", "-c", stamp, "second", "0")
    gq.gpuq("ray", "submit", str(first), str(second))
    waiting = gq.job(second)["ray"]
    assert waiting["state"] == "WAITING" and waiting["submission_id"] is None
    gq.gpuq("wait", "--timeout", "90", timeout=120)  # `gpuq wait` asks Ray as it waits
    assert gq.state_of(second) == "done"
    assert float((gq.work / "second").read_text()) > float((gq.work / "first").read_text())
    assert gq.state_of(first) == "done"


def test_a_dependent_of_a_failed_job_never_goes(gq: Any, ray_head: Any) -> None:  # noqa: F811
    on_ray(gq, ray_head)
    first = gq.add("--gpus", "0", "--", "sh", "-c", "exit 1")
    second = gq.add("--gpus", "0", "--after", str(first), "--", "true")
    gq.gpuq("ray", "submit", str(first), str(second))
    synced_until(gq, first, "failed")
    gq.gpuq("ray", "sync")
    mark = gq.job(second)["ray"]
    assert mark["state"] == "WAITING" and f"#{first} failed" in mark["reason"]
    gq.gpuq("cancel", str(second))
    assert gq.state_of(second) == "cancelled"


def test_a_running_job_is_stopped_by_cancel(gq: Any, ray_head: Any) -> None:  # noqa: F811
    on_ray(gq, ray_head)
    body = "import os\nopen('pid', 'w').write(str(os.getpid()))\n" + WAIT_FOR_GO
    job = gq.add("--gpus", "1", "--", "python3", "-c", body)
    gq.gpuq("ray", "submit", str(job))
    wait_for(lambda: (gq.work / "pid").exists() and (gq.work / "pid").read_text(), 60, 0.2, "the job to start")
    pid = int((gq.work / "pid").read_text())
    wait_for(lambda: gq.gpuq("ray", "sync") and gq.job(job)["started_at"], 30, 0.2, "a sync to see it run")
    out = gq.gpuq("cancel", str(job))
    assert gq.state_of(job) == "cancelled", out.stdout
    assert "Ray job" in gq.job(job)["note"]
    # Its attempt is in its history, as a local job's cancelled while it ran.
    assert [(h["outcome"], h["ray_state"]) for h in gq.job(job)["history"]] == [("cancelled", "STOPPED")]
    assert "no attempt has ended yet" not in gq.gpuq("history", str(job)).stdout
    wait_for(lambda: not alive(pid), 30, 0.1, "the job's process to end")
    sub_id = gq.job(job)["ray"]["submission_id"]
    wait_for(lambda: rayjobs.get(ray_head.address, sub_id).state == "STOPPED", 30, 0.2, "Ray to say STOPPED")


def test_kill_stops_it_too(gq: Any, ray_head: Any) -> None:  # noqa: F811
    on_ray(gq, ray_head)
    job = gq.add("--gpus", "0", "--", "python3", "-c", WAIT_FOR_GO)
    gq.gpuq("ray", "submit", str(job))
    sub_id = gq.job(job)["ray"]["submission_id"]
    wait_for(lambda: rayjobs.get(ray_head.address, sub_id).state == "RUNNING", 60, 0.2, "Ray to run it")
    out = gq.gpuq("kill", str(job)).stdout
    assert gq.state_of(job) == "cancelled" and "killed" in gq.job(job)["note"]
    assert f"cancelled (Ray was asked to stop Ray job {sub_id})" in out
    assert "SIGTERM" not in out and "exit None" not in out  # no signal is sent from here
    wait_for(lambda: rayjobs.get(ray_head.address, sub_id).state == "STOPPED", 30, 0.2, "Ray to say STOPPED")


def test_a_job_asking_more_gpus_than_any_node_has_stays_queued(gq: Any, ray_head: Any) -> None:  # noqa: F811
    on_ray(gq, ray_head)
    big = gq.add("--gpus", "3", "--", "true")
    small = gq.add("--gpus", "1", "--", "true")
    out = gq.gpuq("ray", "submit", "--all", check=False)
    assert out.returncode == 1
    assert f"job #{big} stays here: it asks for 3 GPU(s)" in out.stderr and "(the most GPUs on one: 2)" in out.stderr
    assert gq.state_of(big) == "pending" and gq.job(big).get("ray") is None
    synced_until(gq, small, "done")


def test_retries_bring_back_a_job_that_failed_once_from_its_checkpoint(gq: Any, ray_head: Any) -> None:  # noqa: F811
    on_ray(gq, ray_head)
    body = (
        "import os, sys\n"
        "if not os.path.exists('ck/step_5.pt'):\n"
        "    os.makedirs('ck', exist_ok=True); open('ck/step_5.pt', 'w').write('weights')\n"
        "    print('first attempt fails', flush=True); sys.exit(4)\n"
        "print('second attempt:', sys.argv[1:], flush=True)\n"
    )
    script = gq.script("train.py", body)
    job = gq.add("--gpus", "0", "--retries", "1", "--ckpt-glob", "ck/step_*.pt", "--", "python3", str(script))
    gq.gpuq("ray", "submit", str(job))
    done = synced_until(gq, job, "done", timeout=90)
    assert done["attempts"] == 2 and [h["exit_code"] for h in done["history"]] == [4, 0]
    log = gq.gpuq("log", str(job)).stdout
    assert "first attempt fails" in log
    assert f"second attempt: ['--resume_from_checkpoint', '{gq.work / 'ck' / 'step_5.pt'}']" in log


def test_a_job_whose_directory_is_gone_stays_queued_and_the_rest_go(gq: Any, ray_head: Any) -> None:  # noqa: F811
    on_ray(gq, ray_head)
    gone = gq.work / "gone"
    gone.mkdir()
    lost = gq.add("--gpus", "0", "--dir", str(gone), "--", "true")
    gone.rmdir()
    good = gq.add("--gpus", "0", "--", "true")
    out = gq.gpuq("ray", "submit", "--all", check=False)
    assert out.returncode == 1 and f"job #{lost} stays here: its directory {gone} does not exist" in out.stderr
    assert "a shared filesystem: not checked there" in out.stdout
    assert gq.state_of(lost) == "pending"
    synced_until(gq, good, "done")


def test_a_time_limit_or_a_start_to_come_stays_queued(gq: Any, ray_head: Any) -> None:  # noqa: F811
    """Ray's job API has neither: such a job is not handed over, rather than run at once and unbounded."""
    on_ray(gq, ray_head)
    limited = gq.add("--gpus", "0", "--time", "3s", "--", "true")
    later = gq.add("--gpus", "0", "--begin", "+1h", "--", "true")
    plain = gq.add("--gpus", "0", "--", "true")
    out = gq.gpuq("ray", "submit", "--all", check=False)
    assert out.returncode == 1
    assert f"job #{limited} stays here: its --time 3s has no equivalent on Ray" in out.stderr
    assert f"job #{later} stays here: it starts no earlier than" in out.stderr
    assert (gq.state_of(limited), gq.state_of(later), gq.state_of(plain)) == ("pending", "pending", "ray")


def test_a_job_whose_ray_cluster_is_gone_is_cancelled_here_only_with_force(gq: Any) -> None:
    job_id = gq.add("--gpus", "0", "--", "true")
    spool = Spool(gq.home)
    ref = spool.jobs.find(job_id)
    assert ref is not None
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    ref, job = spool.jobs.move(ref, spool.jobs.load(ref), RAY, rt.handing(spool.jobs.load(ref), gone, "gpuq-x", 0))
    spool.jobs.rewrite(ref, job, **rt.seen(job, "RUNNING", None, now_iso()))
    for command in ("cancel", "kill"):
        refused = gq.gpuq(command, str(job_id), check=False)
        assert refused.returncode == 1 and f"no Ray cluster answers at {gone}" in refused.stderr
        assert f"`gpuq cancel --force {job_id}`" in refused.stderr and "SIGTERM" not in refused.stdout
    assert gq.state_of(job_id) == "ray"
    out = gq.gpuq("cancel", "--force", str(job_id)).stdout
    assert "cancelled here only: Ray (job gpuq-x) could not be told" in out and "may still run there" in out
    job = gq.job(job_id)
    assert job["state"] == "cancelled" and [h["outcome"] for h in job["history"]] == ["cancelled"]
    assert "no attempt has ended yet" not in gq.gpuq("history", str(job_id)).stdout


def test_no_cluster_at_the_address_leaves_the_jobs_queued(gq: Any) -> None:
    job = gq.add("--", "true")
    address = f"http://127.0.0.1:{free_port()}"
    out = gq.gpuq("ray", "submit", str(job), "--address", address, check=False)
    assert out.returncode == 1 and f"job #{job} stays here: no Ray cluster answers at {address}" in out.stderr
    assert gq.state_of(job) == "pending"


@contextmanager
def answering(reply: Union[bytes, Callable[[bytes], bytes]], stall: bool = False) -> Iterator[str]:
    """A tiny HTTP server on 127.0.0.1 (real sockets) answering every request with `reply` (or what
    `reply(request)` gives), then closing the connection; with `stall`, keeping it open without
    another byte until the test ends."""
    server = socket.create_server(("127.0.0.1", 0))
    over = threading.Event()

    def serve() -> None:
        while True:
            try:
                conn, _peer = server.accept()
            except OSError:
                return  # shut down: the test is over
            with conn:
                conn.settimeout(10)
                got = b""
                while b"\r\n\r\n" not in got and (chunk := conn.recv(65536)):
                    got += chunk
                head, _sep, body = got.partition(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                while length and len(body) < int(length.group(1)) and (chunk := conn.recv(65536)):
                    body += chunk  # read whole: a close with unread bytes would reset the reply away
                conn.sendall(reply(got) if callable(reply) else reply)
                if stall:
                    over.wait(60)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        over.set()
        with suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes the accept
        server.close()
        thread.join(10)


def test_a_garbage_status_line_is_no_usable_answer_in_one_line(gq: Any) -> None:
    """http.client's BadStatusLine is no OSError: it came out of every Ray command as a traceback.
    The request was sent: what it asked may have been done (RayNoAnswer), as after a timeout."""
    with answering(b"garbage\r\n") as address:
        for ask in (lambda: rayjobs.get(address, "gpuq-x"), lambda: rayjobs.stop(address, "gpuq-x")):
            with pytest.raises(rayjobs.RayNoAnswer) as refused:
                ask()
            assert len(str(refused.value).splitlines()) == 1 and "BadStatusLine('garbage" in str(refused.value)
        with pytest.raises(rayjobs.RayNoAnswer, match=f"no usable answer from Ray to POST {address}/api/jobs/"):
            rayjobs.submit(address, "true", "gpuq-x", gpus=0, cpus=0, memory=0, env={}, metadata={})
        job = gq.add("--", "true")
        out = gq.gpuq("ray", "submit", str(job), "--address", address, check=False)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith(f"gpuq: job #{job} stays here: no usable answer from Ray to GET {address}")
        assert len(out.stderr.splitlines()) == 1 and gq.state_of(job) == "pending"


def test_an_error_reply_whose_body_stalls_says_its_status_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 500 whose body never comes: reading it ran into the timeout, a bare TimeoutError out of
    the handler of the HTTPError. The status line says enough."""
    monkeypatch.setattr(rayjobs, "TIMEOUT", 0.5)  # the stalled body is read this long
    stalled = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100\r\n\r\npart of it"
    with answering(stalled, stall=True) as address:
        with pytest.raises(rayjobs.RayError) as refused:
            rayjobs.nodes(address)
    said = str(refused.value)
    assert said == f"Ray answered 500 to GET {address}/api/v0/nodes?limit=1000&detail=1: Internal Server Error"
    cut = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100\r\n\r\npart of it"
    with answering(cut) as address:  # closed after part of it: http.client's IncompleteRead
        with pytest.raises(rayjobs.RayError, match="^Ray answered 500 to GET .*: Internal Server Error$"):
            rayjobs.get(address, "gpuq-x")


def test_a_close_without_a_reply_to_a_submit_leaves_the_job_for_sync_not_queued(gq: Any) -> None:
    """The POST was sent and the connection closed unanswered (http.client's RemoteDisconnected, an
    OSError): Ray may have taken the job, so it must not go back to pending to run twice."""
    node = {"node_id": "n1", "state": "ALIVE", "resources_total": {"CPU": 8}}
    nodes = json.dumps({"data": {"result": {"result": [node]}}})
    ok = f"HTTP/1.1 200 OK\r\nContent-Length: {len(nodes)}\r\n\r\n{nodes}".encode()
    with answering(lambda request: b"" if request.startswith(b"POST") else ok) as address:
        with pytest.raises(rayjobs.RayNoAnswer, match=f"no usable answer from Ray to POST {address}/api/jobs/"):
            rayjobs.submit(address, "true", "gpuq-x", gpus=0, cpus=0, memory=0, env={}, metadata={})
        job = gq.add("--gpus", "0", "--", "true")
        out = gq.gpuq("ray", "submit", str(job), "--address", address, check=False)
        assert out.returncode == 1 and "it may be on Ray now: `gpuq ray sync`" in out.stderr, out.stderr
        assert gq.state_of(job) == "ray"
    with pytest.raises(rayjobs.RayUnreachable, match="no Ray cluster answers"):  # refused: nothing was sent
        rayjobs.nodes(f"http://127.0.0.1:{free_port()}")


def test_an_address_with_a_port_that_is_no_port_is_a_usage_error(gq: Any) -> None:
    for port in ("abc", "70000", "-1"):
        with pytest.raises(UsageError, match=f"not a port: {port}"):
            rayjobs.address(f"http://head:{port}", {})
    gq.add("--", "true")
    out = gq.gpuq("ray", "submit", "--all", "--address", "http://head:abc", check=False)
    assert out.returncode == 2 and out.stderr.splitlines() == ["gpuq ray: not a port: abc (in http://head:abc)"]
    assert rayjobs.address("[::1]:8265", {}) == "http://[::1]:8265"


def test_ray_submit_needs_ids_or_all_and_an_address(gq: Any) -> None:
    gq.add("--", "true")
    out = gq.gpuq("ray", "submit", check=False)
    assert out.returncode == 2 and "--all" in out.stderr
    env = {k: v for k, v in gq.env.items() if k != "RAY_ADDRESS"}
    out = gq.gpuq("ray", "submit", "--all", check=False, env=env)
    assert out.returncode == 2 and "RAY_ADDRESS" in out.stderr
    out = gq.gpuq("ray", "submit", "--all", "--address", "ray://head:10001", check=False)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "dashboard" in out.stderr


@pytest.mark.parametrize(
    "given, expected",
    [("127.0.0.1:8265", "http://127.0.0.1:8265"), ("http://head:8265/", "http://head:8265")],
)
def test_address_forms(given: str, expected: str) -> None:
    assert rayjobs.address(given, {}) == expected
    assert rayjobs.address(None, {"RAY_ADDRESS": given}) == expected


def test_a_ray_client_address_is_refused() -> None:
    with pytest.raises(UsageError, match="dashboard"):
        rayjobs.address("ray://head:10001", {})


def test_a_hand_over_cut_short_is_finished_by_the_next_sync_never_run_twice(gq: Any, ray_head: Any) -> None:  # noqa: F811
    on_ray(gq, ray_head)
    body = "open('ran', 'a').write('{0}\\n')"
    found = gq.add("--gpus", "0", "--", "python3", "-c", body.format("found"))
    lost = gq.add("--gpus", "0", "--", "python3", "-c", body.format("lost"))
    spool = Spool(gq.home)
    # gpuq killed after the move to ray/ and before Ray's answer: the marks are there, as the engine
    # writes them; for `found`, Ray had taken the job.
    ids = {}
    for job_id in (found, lost):
        ref = spool.jobs.find(job_id)
        assert ref is not None
        job = spool.jobs.load(ref)
        ids[job_id] = rt.submission_id(f"cut{job_id}", job)
        ref, job = spool.jobs.move(ref, job, RAY, rt.handing(job, ray_head.address, ids[job_id], 0))
        if job_id == found:
            rayjobs.submit(ray_head.address, entrypoint(job), ids[job_id], **submission_fields(spool, job))
    assert gq.job(found)["ray"]["state"] == gq.job(lost)["ray"]["state"] == "SUBMITTING"
    synced_until(gq, found, "done")
    synced_until(gq, lost, "done")
    assert sorted((gq.work / "ran").read_text().split()) == ["found", "lost"]  # each ran once
    assert gq.job(found)["ray"]["submission_id"] == ids[found] and gq.job(lost)["ray"]["submission_id"] == ids[lost]


def test_status_without_ray_jobs_does_not_import_urllib(gq: Any) -> None:
    gq.add("--gpus", "0", "--", "true")
    probe = "import sys; from gpuq.cli import main; main(['status']); print('urllib.request' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], env=gq.env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout


G = 1024  # MiB


def supervisor(head: Any, sub_id: str) -> dict:
    """The Ray job's supervisor actor as Ray's state API lists it: its pid, and in
    `required_resources` what Ray reserved for the job (the Jobs API does not say it)."""
    url = f"{head.address}/api/v0/actors?detail=1&limit=1000&filter_keys=name&filter_predicates=%3D"
    url += f"&filter_values=_ray_internal_job_actor_{sub_id}"

    def rows() -> list:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return json.load(answer)["data"]["result"]["result"]

    found = wait_for(rows, 30, 0.2, f"Ray's supervisor of {sub_id}")  # made as Ray takes the job
    assert len(found) == 1, found
    return found[0]


def asked(head: Any, sub_id: str) -> dict:
    return supervisor(head, sub_id)["required_resources"]


def test_an_out_of_memory_attempt_on_ray_is_retried_with_twice_the_share(gq: Any, ray_head: Any) -> None:  # noqa: F811
    """--gpu-mem 20G of an 80G GPU goes to Ray as 0.25 GPU; its CUDA out-of-memory attempt comes back
    as 0.5 GPU (40G) with GPUQ_OOM_RETRY=1, and ends done; show, history and the log say why."""
    on_ray(gq, ray_head)
    Gpus(gq, fake_gpus(1, total=80 * G))  # the head's GPUs as gpuq sees them: Ray's declared ones have no size
    gq.script("oom.py", OOM_ONCE)
    job_id = gq.add("--gpus", "1", "--gpu-mem", "20G", "--retries", "1", "oom.py", "1")
    gq.gpuq("ray", "submit", str(job_id))
    assert asked(ray_head, gq.job(job_id)["ray"]["submission_id"])["GPU"] == 0.25
    wait_for(lambda: "retrying after out-of-memory with 40G" in gq.gpuq("status").stdout, 60, 0.3, "the retry")
    second = gq.work / "attempt-1.json"
    assert json.loads(wait_for(lambda: second.exists() and second.read_text(), 60, 0.2, "attempt 2"))["retry"] == "1"
    (gq.work / "go").write_text("")
    done = synced_until(gq, job_id, "done", timeout=90)
    assert done["attempts"] == 2 and done["oom_retries"] == 1 and done["gpu_mem_mib"] == 40 * G
    first, second = done["history"]
    assert first["gpu_mem_mib"] == 20 * G and first["reason"].startswith("CUDA out of memory (tried to allocate 2.00")
    assert "retrying after out-of-memory with 40G" in first["change"]
    assert asked(ray_head, second["ray_submission_id"])["GPU"] == 0.5
    shown = gq.gpuq("show", str(job_id)).stdout
    assert (
        "had 20G of a GPU" in shown and "retrying after out-of-memory with 40G" in shown and "had 40G of a GPU" in shown
    )
    assert "out of memory: the next attempt gets 40G (GPUQ_OOM_RETRY=1)" in gq.gpuq("log", str(job_id)).stdout
    assert "retrying after out-of-memory with 40G" in gq.gpuq("history", str(job_id)).stdout


def test_without_a_retry_left_it_fails_saying_what_a_retry_would_get(gq: Any, ray_head: Any) -> None:  # noqa: F811
    on_ray(gq, ray_head)
    Gpus(gq, fake_gpus(1, total=80 * G))
    gq.script("oom.py", OOM_ONCE)
    job_id = gq.add("--gpus", "1", "--gpu-mem", "20G", "oom.py", "1")
    gq.gpuq("ray", "submit", str(job_id))
    failed = synced_until(gq, job_id, "failed")
    assert (
        failed["reason"].startswith("CUDA out of memory") and "it would have been retried with 40G" in failed["reason"]
    )
    assert failed["gpu_mem_mib"] == 20 * G and failed.get("oom_retries", 0) == 0 and failed["attempts"] == 1


def test_a_whole_gpu_job_out_of_memory_on_ray_is_retried_on_the_largest_gpus(gq: Any, ray_head: Any) -> None:  # noqa: F811
    """A whole-GPU job's out-of-memory retry: on the GPUs with the most memory, here all alike (one
    size, so any GPU: Ray is asked for one GPU again); --retry-oom alone pays for it."""
    on_ray(gq, ray_head)
    Gpus(gq, fake_gpus(2, total=80 * G))
    gq.script("oom.py", OOM_ONCE)
    (gq.work / "go").write_text("")
    job_id = gq.add("--gpus", "1", "--retry-oom", "1", "oom.py", "1")
    gq.gpuq("ray", "submit", str(job_id))
    done = synced_until(gq, job_id, "done", timeout=90)
    assert done["gpu_largest"] is True and done["oom_retries"] == 1 and done["attempts"] == 2
    assert "the GPU with the most memory (80G)" in done["history"][0]["change"]
    assert asked(ray_head, done["history"][1]["ray_submission_id"])["GPU"] == 1.0
    assert json.loads((gq.work / "attempt-1.json").read_text())["retry"] == "1"


HOST_OOM_ONCE = """import os, sys
if not os.environ.get("GPUQ_OOM_RETRY"):
    os.makedirs("ck", exist_ok=True); open("ck/step_3.pt", "w").write("weights")
    print("RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
          "you tried to allocate 8589934592 bytes.", flush=True)
    sys.exit(1)
print("retry", os.environ["GPUQ_OOM_RETRY"], sys.argv[1:], flush=True)
"""


def test_a_job_out_of_host_memory_on_ray_is_retried_with_twice_its_mem(gq: Any, ray_head: Any) -> None:  # noqa: F811
    """--mem 64M, Ray's `entrypoint_memory`: PyTorch's CPU allocator failing sends it back with 128M,
    from the checkpoint it wrote; --retry-oom alone pays for it."""
    on_ray(gq, ray_head)
    gq.script("host.py", HOST_OOM_ONCE)
    job_id = gq.add(
        "--gpus", "0", "--mem", "64M", "--retry-oom", "1", "--ckpt-glob", "ck/step_*.pt", "python3", "host.py"
    )
    gq.gpuq("ray", "submit", str(job_id))
    assert asked(ray_head, gq.job(job_id)["ray"]["submission_id"])["memory"] == 64 * 2**20
    said: list[str] = []
    done = synced_until(gq, job_id, "done", timeout=90, said=said)
    retried = [line for out in said for line in out.splitlines() if "failed on Ray" in line]
    why = "failed on Ray (exit 1); retrying after out-of-memory with 128M host memory"
    assert retried == [f"[~] Job #{job_id}: work/host {why}"]
    assert done["mem_mib"] == 128 and done["history"][0]["reason"].startswith("out of CPU memory")
    assert asked(ray_head, done["history"][1]["ray_submission_id"])["memory"] == 128 * 2**20
    ckpt = gq.work / "ck" / "step_3.pt"
    assert f"retry 1 ['--resume_from_checkpoint', '{ckpt}']" in gq.gpuq("log", str(job_id)).stdout


DIES_WITH_ITS_NODE = """import os, sys, time
if os.path.exists("first"):
    print("second attempt", flush=True); sys.exit(0)
open("first", "w").write(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


def test_retries_bring_back_a_job_whose_ray_supervisor_died(gq: Any, ray_head: Any) -> None:  # noqa: F811
    """The nearest event to a node's death one loopback node can produce (a second node cannot join
    a cluster kept on 127.0.0.1): the Ray job's supervisor actor is killed, Ray ends the command
    with it and fails the job without an exit code, as when its node goes away; --retries 1 submits
    it again and it ends done."""
    on_ray(gq, ray_head)
    gq.script("node.py", DIES_WITH_ITS_NODE)
    job_id = gq.add("--gpus", "1", "--retries", "1", "python3", "node.py")
    gq.gpuq("ray", "submit", str(job_id))
    first = gq.work / "first"
    pid = int(wait_for(lambda: first.exists() and first.read_text(), 60, 0.2, "the first attempt"))
    actor = supervisor(ray_head, gq.job(job_id)["ray"]["submission_id"])
    with open(f"/proc/{pid}/stat") as fh:
        assert int(fh.read().rsplit(")", 1)[1].split()[1]) == actor["pid"]  # the job runs under it
    assert actor["pid"] in ray_head._ours()  # a process of the cluster this test started
    os.kill(actor["pid"], signal.SIGKILL)
    wait_for(lambda: not alive(pid), 30, 0.1, "Ray to end the command with its supervisor")  # its process group
    done = synced_until(gq, job_id, "done", timeout=90)
    lost = done["history"][0]
    assert lost["exit_code"] is None and lost["ray_state"] == "FAILED" and lost["outcome"] == "pending"
    assert lost["reason"].startswith("Ray: Job supervisor actor died")
    assert done["attempts"] == 2 and "second attempt" in gq.gpuq("log", str(job_id)).stdout


def test_log_follow_fetches_a_ray_job_s_log_until_it_ends(gq: Any, ray_head: Any) -> None:  # noqa: F811
    on_ray(gq, ray_head)
    body = "print('first', 'line', flush=True)\n" + WAIT_FOR_GO + "print('last', 'line', flush=True)\n"
    job = gq.add("--gpus", "0", "--", "python3", "-c", body)
    gq.gpuq("ray", "submit", str(job))
    out = gq.work / "follow.out"
    with open(out, "w") as fh:
        follow = subprocess.Popen(
            [sys.executable, "-m", "gpuq", "log", "-f", str(job)], cwd=gq.work, env=gq.env, stdout=fh, stderr=fh
        )
    try:
        wait_for(lambda: "first line" in out.read_text(), 60, 0.2, "the first line, fetched from Ray")
        assert follow.poll() is None and "last line" not in out.read_text()
        (gq.work / "go").write_text("")
        assert follow.wait(60) == 0
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert "last line" in out.read_text() and gq.state_of(job) == "done"


# ---- what needs no cluster ----------------------------------------------------------------------
def _node(gpus: float, cpus: float = 8, alive: bool = True) -> rayjobs.Node:
    return rayjobs.Node("n", "10.0.0.1", alive, False, {"GPU": gpus, "CPU": cpus, "memory": 64 * 2**30})


def test_fits_names_what_no_live_node_has() -> None:
    job = Job({"id": 1, "gpu_request": 3, "cpus": None, "mem_mib": None})
    assert fits(job, [_node(2), _node(4, alive=False)], "http://h:8265") == (
        "it asks for 3 GPU(s); no node of the Ray cluster at http://h:8265 has that (the most GPUs on one: 2)"
    )
    assert fits(job, [_node(2), _node(4)], "http://h:8265") is None
    assert "no live node" in str(fits(job, [_node(8, alive=False)], "http://h:8265"))
    roomy = Job({"id": 2, "gpu_request": 1, "cpus": 16, "mem_mib": None})
    assert "16 CPU(s)" in str(fits(roomy, [_node(2)], "http://h:8265"))


def test_the_spool_log_holds_the_job_output_without_ray_s_lines() -> None:
    ray_log = "2026 INFO job_manager.py -- Runtime env is setting up.\nRunning entrypoint for job x: cd -- /w\nout 1\n"
    assert own_part(ray_log) == b"out 1\n"
    assert own_part("Ray could not start it\n") == b"Ray could not start it\n"


def test_a_retried_ray_job_runs_here_unless_handed_over_again(gq: Any) -> None:
    job_id = gq.add("--gpus", "0", "--", "true")
    spool = Spool(gq.home)
    ref = spool.jobs.find(job_id)
    assert ref is not None
    ref, job = spool.jobs.move(
        ref, spool.jobs.load(ref), RAY, rt.handing(spool.jobs.load(ref), "http://h:8265", None, 0)
    )
    ended = rt.ended(job, "FAILED", exit_code=3, started_at=None, finished_at=None, reason="boom")
    spool.jobs.move(ref, job, FAILED, ended)
    assert gq.job(job_id)["history"][-1]["ray_state"] == "FAILED"
    gq.gpuq("retry", str(job_id))
    assert gq.state_of(job_id) == "pending" and gq.job(job_id)["ray"] is None


def test_a_share_is_a_fraction_of_the_smallest_gpu_and_the_largest_gpus_a_node_type() -> None:
    share = Job({"id": 1, "gpu_request": 1, "gpu_mem_mib": 20 * G, "gpu_largest": False})
    assert num_gpus(share, Room([80 * G, 40 * G], None, None)) == 0.5
    assert num_gpus(share, Room([24 * G], None, None)) == 0.8334  # rounded up, to Ray's four decimals
    assert num_gpus(share, Room([16 * G], None, None)) == 1.0
    assert num_gpus(share, Room([], None, None)) == 1.0  # sizes unknown: a whole GPU
    largest = Job({"id": 2, "gpu_request": 1, "gpu_mem_mib": None, "gpu_largest": True})
    assert resources(largest, Room([40 * G, 80 * G], "accelerator_type:A100", None)) == {"accelerator_type:A100": 0.001}
    assert resources(largest, Room([80 * G], None, None)) is None and resources(share, Room([], "x", None)) is None
    assert host_oom("out of CPU memory (tried to allocate 8.0 GiB)") and not host_oom("CUDA out of memory")
    assert host_oom(failure.reason(b"", -9, None)) and not host_oom(failure.reason(b"", 1, None))  # Ray's -9: SIGKILL
