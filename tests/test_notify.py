"""Notifications where people read them (issue 31): `--notify URL` through Apprise, to a real HTTP
receiver on loopback (`json://127.0.0.1:PORT/...`), from real workers and supervisors. A receiver
that hangs or refuses delays nothing; a failure is logged once per destination, without secrets;
a stuck job (its GPU idle, its progress still) is told to the URLs and to `--on-finish`."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import REPO, WAIT_FOR_GO, Env, wait_for
from test_gpu_worker import Gpus, add, fake_gpus, release

from gpuq.cli import cmd_worker
from gpuq.cli.parser import parse
from gpuq.core import schema
from gpuq.core.errors import UsageError
from gpuq.core.words import url_text as shown
from gpuq.run.notify import config, send
from gpuq.run.notify.queue import QueueWatch
from gpuq.run.worker import Settings, StepResult
from gpuq.spool import Spool

pytest.importorskip("apprise")  # the `notify` extra (in the `test` extra too)


class Receiver:
    """An HTTP server on loopback that records every JSON message posted to it."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        received = self.messages

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"json://127.0.0.1:{self.port}/{path}"

    def at(self, path: str) -> list[dict[str, Any]]:
        return [body for where, body in list(self.messages) if where == f"/{path}"]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def job_script(gq: Env, name: str, body: str) -> None:
    gq.script(name, body)


def test_notify_takes_the_next_word_as_a_url_only_when_it_has_a_scheme() -> None:
    for line in (["add", "--notify", "python", "x.py"], ["add", "--notify", "--", "python", "x.py"]):
        args = parse(line)
        assert (args.notify, args.notify_url, args.script, args.args) == (True, [], "python", ["x.py"])
    line = ["add", "--notify", "ntfy://a", "--notify=json://h:1/p", "--notify", "python", "x.py", "--notify", "y"]
    args = parse(line)
    assert (args.notify, args.notify_url) == (True, ["ntfy://a", "json://h:1/p"])
    assert (args.script, args.args) == ("python", ["x.py", "--notify", "y"])  # after SCRIPT: the job's
    run = parse(["run", "--notify", "ntfy://t", "--notify", "--notify=ntfy://t"])
    assert cmd_worker._settings(run) == dict(
        cmd_worker._settings(parse(["run"])), notify=True, notify_urls=["ntfy://t"]
    )
    with pytest.raises(UsageError, match="^--notify: not a URL such as ntfy://my-topic: 'nope'$"):
        cmd_worker._settings(parse(["run", "--notify=nope"]))


def test_a_url_apprise_does_not_know_is_refused_when_given(gq: Env) -> None:
    for url, said in (
        ("nfty://my-topic", "nfty://..."),
        ("bogus://user:secret@host.example.com/x", "bogus://host.example.com"),
    ):
        added = gq.gpuq("add", "--notify", url, "true", check=False)
        assert (added.returncode, added.stdout) == (2, "") and not gq.files("pending")
        assert added.stderr == f"gpuq add: --notify: not a URL Apprise knows (a misspelt scheme?): {said}\n"
    held = gq.add("--hold", "--notify", "ntfy://my-topic", "true")
    edited = gq.gpuq("edit", str(held), "--set", 'notify_urls=["ntfy://my-topic", "nfty://t"]', check=False)
    assert edited.returncode == 2 and edited.stderr.endswith("Apprise knows (a misspelt scheme?): nfty://...\n")
    assert gq.job(held)["notify_urls"] == ["ntfy://my-topic"]
    with pytest.raises(UsageError, match="nfty://"):
        cmd_worker._settings(parse(["run", "--notify=nfty://t"]))


def test_show_names_where_a_job_is_told_without_the_secrets(gq: Any) -> None:
    job_id = gq.add("--notify", "--notify", "json://user:secret@127.0.0.1:9/hook", "--on-finish", "echo hi", "true")
    shown_card = gq.gpuq("show", str(job_id)).stdout
    assert re.search(r"notify +desktop, json://127\.0\.0\.1:9\n", shown_card), shown_card
    assert re.search(r"on finish +echo hi\n", shown_card), shown_card
    assert "secret" not in shown_card
    plain = gq.gpuq("show", str(gq.add("true"))).stdout
    assert "notify" not in plain and "on finish" not in plain


def test_a_url_is_shown_by_its_scheme_and_host_only() -> None:
    assert shown("json://user:secret@127.0.0.1:8080/hook?token=x") == "json://127.0.0.1:8080"
    assert shown("ntfy://my-secret-topic") == "ntfy://..."
    assert shown("tgram://123456:BOT-TOKEN/chat") == "tgram://..."
    assert shown("slack://hooks.slack.com/T/B/C") == "slack://hooks.slack.com"


def test_defaults_come_from_gpuq_notify_else_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv(config.ENV, raising=False)
    assert config.default_urls() == []
    (tmp_path / "gpuq").mkdir()
    (tmp_path / "gpuq" / "config.toml").write_text('notify = ["ntfy://a", "json://h/p"]\n')
    assert config.default_urls() == ["ntfy://a", "json://h/p"]
    monkeypatch.setenv(config.ENV, "ntfy://b, json://c/d ntfy://b")
    assert config.default_urls() == ["ntfy://b", "json://c/d"]
    monkeypatch.setenv(config.ENV, "not-a-url")
    with pytest.raises(ValueError, match="GPUQ_NOTIFY: not a URL"):
        config.default_urls()


def test_a_dropped_file_may_name_urls_and_old_job_files_stay_valid() -> None:
    clean = schema.normalize_dropped({"cmd": "true", "notify_urls": ["ntfy://a"]})
    assert clean["notify_urls"] == ["ntfy://a"]
    with pytest.raises(schema.InvalidJob, match="notify_urls"):
        schema.normalize_dropped({"cmd": "true", "notify_urls": ["a"]})
    job = schema.new_job(job_id=1, name="n", cmd=["true"], cwd="/", log="/x.log", env={}, after=[])
    old = {k: v for k, v in job.items() if k != "notify_urls"}  # a file written before the field
    assert schema.validate(old).notify_urls == [] and schema.validate(dict(job, notify=True)).notify


def test_a_done_and_a_failed_job_each_deliver_one_message(gq: Env, receiver: Receiver) -> None:
    gq.start_worker("--watch")
    gq.script("ok.py", "print('fine')\n")
    done = gq.add("--name", "fine-job", "--notify", receiver.url("hook"), "ok.py")
    failed = gq.add("--name", "bad-job", f"--notify={receiver.url('hook')}", "sh", "-c", "exit 3")
    wait_for(lambda: len(receiver.at("hook")) >= 2, 20, what="two messages")
    by_id = {m["gpuq"]["id"]: m for m in receiver.at("hook")}
    assert sorted(by_id) == [done, failed] and len(receiver.at("hook")) == 2
    ok, bad = by_id[done], by_id[failed]
    host = socket.gethostname()
    assert ok["gpuq"]["event"] == "finished" and ok["gpuq"]["name"] == "fine-job" and ok["gpuq"]["state"] == "done"
    assert ok["gpuq"]["reason"] is None and ok["gpuq"]["host"] == host and ok["gpuq"]["run_time"].endswith("s")
    assert ok["title"] == f"gpuq: job #{done} done on {host}" and ok["type"] == "success"
    assert bad["gpuq"]["state"] == "failed" and "exit 3" in bad["gpuq"]["reason"] and bad["type"] == "failure"
    assert "reason: " in bad["message"] and "run time: " in bad["message"] and f"host: {host}" in bad["message"]


class Hanging:
    """A receiver that accepts, reads the request, and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        """The request as it comes (headers and body may come apart), kept whole so far."""
        at = len(self.requests)
        self.requests.append(b"")
        conn.settimeout(10)
        try:
            while chunk := conn.recv(65536):
                self.requests[at] += chunk
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_a_hanging_or_refusing_receiver_delays_nothing_and_is_logged_once(gq: Env) -> None:
    hanging = Hanging()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused = closed.getsockname()[1]
    closed.close()
    try:
        # ?rto=60: Apprise's own read timeout (4 s) would give up on the hanging receiver before gpuq's
        urls = [f"json://me:secret@127.0.0.1:{hanging.port}/x?rto=60", f"json://me:secret@127.0.0.1:{refused}/y"]
        # The sender kills what has not answered by then: the order of events below shows who waited
        # for it (whatever the machine's load), as a process that waits ends only after its line.
        gq.env["GPUQ_NOTIFY_TIMEOUT"] = "10"
        no_answer = "no answer within 10s"
        gq.start_worker("--watch", *(w for url in urls for w in ("--notify", url)))
        first, second = gq.add("sh", "-c", "exit 0"), gq.add("sh", "-c", "exit 0")
        for job in (first, second):
            gq.wait_state(job, "done", timeout=30)
        assert no_answer not in gq.log(first)  # its supervisor ran the next job while its message waited
        wait_for(lambda: any(b"queue_empty" in r for r in hanging.requests), 30, what="the queue-empty message")
        worker_log = lambda: (gq.home / "logs" / "worker.log").read_text()  # noqa: E731
        gq.wait_state(gq.add("sh", "-c", "exit 0"), "done", timeout=30)
        assert no_answer not in worker_log()  # nor did the worker wait for its own message
        lines = lambda: [line for line in gq.log(first).splitlines() if "notification not sent" in line]  # noqa: E731
        wait_for(lambda: len(lines()) >= 2, 30, what="the failures in the job's log")
        assert sorted(lines()) == sorted(
            [
                f"=== gpuq: notification not sent to json://127.0.0.1:{hanging.port}: {no_answer}",
                f"=== gpuq: notification not sent to json://127.0.0.1:{refused}: not delivered",
            ]
        )
        wait_for(lambda: worker_log().count("notification not sent") >= 2, 30, what="the worker's own failures")
        assert worker_log().count("notification not sent") == 2  # (once per destination: see the idle test)
        assert "secret" not in gq.log(first) + gq.log(second) + worker_log()
    finally:
        hanging.close()


def test_without_apprise_one_line_says_what_to_install(tmp_path: Path) -> None:
    """A Python without Apprise (-S: no site-packages) sends nothing and says so once per log."""
    code = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); from gpuq.run.notify import message, send\n"
        "for _ in range(3):\n"
        "    send.send(['ntfy://t', 'json://h/p'], message.queue_empty(), lambda: os.dup(1), 'worker', '[x] ')"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code, str(REPO)], capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stderr) == (0, "")
    install = f"{sys.executable} -m pip install '{REPO}[notify]'"  # the checkout's extra: no metadata under -S
    assert out.stdout == f"[x] notifications to URLs need Apprise, which is not installed: {install}\n"


def test_the_queue_empty_message_is_sent_once(gq: Env, receiver: Receiver) -> None:
    spool = Spool(gq.home)
    spool.ensure()

    class Worker:  # what QueueWatch reads of a worker: its spool and settings
        settings = Settings(notify_urls=[receiver.url("empty")])

    Worker.spool = spool  # type: ignore[attr-defined]
    watch = QueueWatch(Worker())
    watch.after_step(StepResult())  # nothing ran yet: nothing to say
    watch.after_step(StepResult(busy=True))
    watch.after_step(StepResult(startable_later=True))  # a job still to start
    for _ in range(3):
        watch.after_step(StepResult())
    wait_for(lambda: not (send.reap() or send._running), 15, what="the sender to end")
    (only,) = receiver.at("empty")
    assert only["gpuq"]["event"] == "queue_empty" and only["title"].startswith("gpuq: queue empty on ")


def test_an_idle_gpu_and_a_still_job_reach_the_urls_and_on_finish(gq: Env, receiver: Receiver) -> None:
    doc = fake_gpus(1)
    doc["gpus"][0]["utilization_gpu"] = 0  # idle from the start; no memory held: it starts at once
    Gpus(gq, doc)
    gq.env.update(GPUQ_GPU_SAMPLE_SECONDS="0.2", GPUQ_GPU_IDLE_MINUTES="0.02", GPUQ_STUCK_MINUTES="0.03")
    events = gq.work / "events.txt"
    gq.start_worker("--watch", "--on-finish", f'echo "$GPUQ_EVENT" >> {events}')
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused = f"json://127.0.0.1:{closed.getsockname()[1]}/z"
    closed.close()
    job_id = add(gq, "--gpus", "1", "--notify", receiver.url("job"), "--notify", refused)
    said = lambda: [m["gpuq"]["event"] for m in receiver.at("job")]  # noqa: E731
    wait_for(lambda: {"gpu_idle", "stuck"} <= set(said()), 20, what="the idle and stuck messages")
    wait_for(lambda: events.exists() and {"gpu_idle", "stuck"} <= set(events.read_text().split()), 15)
    idle = next(m for m in receiver.at("job") if m["gpuq"]["event"] == "gpu_idle")
    assert idle["gpuq"]["state"] == "running" and "GPU 0 idle" in idle["gpuq"]["reason"]
    release(gq)
    gq.wait_state(job_id, "done")
    wait_for(lambda: "finished" in said(), 15)
    assert sorted(said()) == ["finished", "gpu_idle", "stuck"]  # once per episode
    wait_for(lambda: events.read_text().split().count("finished") == 1, 15)
    send_failures = [line for line in gq.log(job_id).splitlines() if "not sent to" in line]
    assert send_failures == [f"=== gpuq: notification not sent to {refused.rsplit('/', 1)[0]}: not delivered"]


def test_a_still_job_under_a_minute_is_said_still_in_seconds(gq: Env, receiver: Receiver) -> None:
    gq.env["GPUQ_STUCK_MINUTES"] = "0.02"  # 1.2 s: it was said as "no progress for 0 min"
    gq.script("wait.py", WAIT_FOR_GO)
    gq.start_worker("--watch")
    job_id = gq.add("--gpus", "0", "--notify", receiver.url("job"), "wait.py")
    stuck = lambda: [m for m in receiver.at("job") if m["gpuq"]["event"] == "stuck"]  # noqa: E731
    reason = wait_for(stuck, 20, what="the stuck message")[0]["gpuq"]["reason"]
    said = re.fullmatch(r"no progress for (\d+)s \(its log and progress file did not change\)", reason)
    assert said is not None and 1 <= int(said[1]) < 60, reason
    assert f"=== gpuq: stuck: {reason}\n" in gq.log(job_id)
    (gq.work / "go").write_text("")
    gq.wait_state(job_id, "done")


def test_a_preemption_by_its_time_limit_and_a_kill_are_told_as_status_says_them(gq: Env, receiver: Receiver) -> None:
    gq.script("saves.py", WAIT_FOR_GO)
    gq.start_worker("--watch")
    url = receiver.url("hook")
    timed = gq.add("--time", "1s", "--preemptible", "--ckpt-glob", "ck/ckpt-*", "--notify", url, "saves.py")
    gq.wait_state(timed, "preempted", timeout=30)
    killed = gq.add("--notify", url, "saves.py")
    gq.wait_state(killed, "running")
    gq.gpuq("kill", str(killed))
    wait_for(lambda: len(receiver.at("hook")) >= 2, 20, what="two messages")
    told = {m["gpuq"]["id"]: m["gpuq"]["reason"] for m in receiver.at("hook")}
    assert (
        told[timed].startswith("preempted by its time limit of 1s; ") and told[killed] == "killed by user (gpuq kill)"
    )
    status = gq.gpuq("status", "-a").stdout
    for job_id in (timed, killed):
        assert told[job_id] in status
        assert told[job_id] in gq.gpuq("history", str(job_id)).stdout
