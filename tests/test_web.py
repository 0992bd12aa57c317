"""`gpuq web` over HTTP, without a browser (tests/test_web_browser.py drives a real one): a real
`gpuq web` process on a free loopback port in front of a real worker. Every request for data is
signed with the token, kept 0600 in the spool, which itself never travels again after the printed
URL; actions are POSTs from the page's own origin; what the page shows of a job comes escaped; a
log's tail is read from its end, whatever its size."""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional, Union

import pytest
from conftest import WAIT_FOR_GO, Env, wait_for

pytest.importorskip("starlette", reason="the web extra (starlette) is not installed")
pytest.importorskip("uvicorn", reason="the web extra (uvicorn) is not installed")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


OPENER = urllib.request.build_opener(NoRedirect)


class Web:
    """A `gpuq web` process of the test's spool; `url` is the line it printed."""

    def __init__(self, gq: Env, *args: str) -> None:
        self.gq = gq
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuq", "web", "--port", "0", *args],
            cwd=gq.work,
            env=gq.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()  # printed once it listens
        found = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/#token=([0-9a-f]{64})", self.url)
        assert found, (self.url, self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.port, self.token = int(found.group(1)), found.group(2)
        self.base = f"http://127.0.0.1:{self.port}"
        self.server = json.loads(self.request("/api/server", auth=False)[2])["server"]  # as the page learns it

    def request(
        self, path: str, method: str = "GET", auth: Union[bool, str] = True, origin: Optional[str] = "same"
    ) -> tuple[int, dict[str, str], bytes]:
        """`auth`: this request signed with this server's token now, unsigned (False), or the header given;
        a POST signed here is made unique, as the page makes each (a query the server ignores)."""
        if auth is True and method == "POST":
            path += ("&" if "?" in path else "?") + "n=" + os.urandom(4).hex()
        headers = {"X-Gpuq-Auth": auth if isinstance(auth, str) else self.sign(method, path)} if auth else {}
        if origin is not None:
            headers["Origin"] = self.base if origin == "same" else origin
        req = urllib.request.Request(
            self.base + path, method=method, headers=headers, data=b"" if method == "POST" else None
        )
        try:
            with OPENER.open(req, timeout=30) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def sign(self, method: str, target: str, ts: Optional[int] = None) -> str:
        """X-Gpuq-Auth for this server, as its page makes it."""
        return sign(self.token, method, target, self.server, ts)

    def json(self, path: str) -> Any:
        status, _headers, body = self.request(path)
        assert status == 200, (status, body)
        return json.loads(body)

    def stop(self) -> Optional[int]:
        """Ctrl-C; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def sign(token: str, method: str, target: str, server: str, ts: Optional[int] = None) -> str:
    """X-Gpuq-Auth as the page's script makes it: TS.HEX, HMAC-SHA256 of METHOD, PATH?QUERY, TS (ms)
    and the id of the server start it is for."""
    ts = int(time.time() * 1000) if ts is None else ts  # in milliseconds
    return f"{ts}." + hmac.new(token.encode(), f"{method}\n{target}\n{ts}\n{server}".encode(), "sha256").hexdigest()


@pytest.fixture
def web(gq: Env) -> Any:
    server = Web(gq)
    try:
        yield server
    finally:
        server.stop()


def test_the_pages_hold_no_data_and_every_unsigned_api_request_gets_403(gq: Env, web: Web) -> None:
    job_id = gq.add("--name", "secret-project", "--hold", "--", "true")
    for path in ("/", f"/job/{job_id}", "/static/web.js"):  # served to anyone: the script asks the API for all
        status, headers, body = web.request(path, auth=False)
        assert status == 200 and b"secret-project" not in body and b"held" not in body, path
        assert "default-src 'none'" in headers["content-security-policy"] and headers["cache-control"] == "no-store"
    for path in ("/api/queue", f"/api/job/{job_id}", f"/api/job/{job_id}/log"):
        status, headers, body = web.request(path, auth=False)
        assert status == 403 and b"secret-project" not in body and b"token" in body, (path, status)
        assert headers["x-frame-options"] == "DENY"
    status, _headers, body = web.request(f"/?token={'0' * 64}", auth=False)  # a wrong token in an old URL
    assert status == 403 and b"secret-project" not in body
    status, _headers, _body = web.request(f"/api/job/{job_id}/cancel", method="POST", auth=False)
    assert status == 403 and gq.state_of(job_id) == "held"
    status, _headers, body = web.request("/api/queue")  # signed: the data
    assert status == 200 and b"secret-project" in body


def test_an_old_token_url_is_sent_to_the_fragment_and_no_cookie_is_set(web: Web) -> None:
    """A cookie goes to every port of the host: another user's server there would get the token."""
    assert web.url.endswith("/#token=" + web.token)  # printed: a fragment is sent to no server
    status, headers, body = web.request("/?token=" + web.token + "&page=1", auth=False)
    assert status == 303 and headers["location"] == "/?page=1#token=" + web.token and b"finished" not in body
    assert "set-cookie" not in {k.lower() for k in headers} and headers["referrer-policy"] == "no-referrer"
    _status, headers, _body = web.request("//evil.example/?token=" + web.token, auth=False)
    assert headers["location"] == "/evil.example/#token=" + web.token  # a path on this server, never another host
    for path in ("/", "/api/queue", "/static/web.js"):
        assert "set-cookie" not in {k.lower() for k in web.request(path)[1]}, path


def test_a_missing_wrong_old_or_replayed_signature_is_403(gq: Env, web: Web) -> None:
    job_id = gq.add("--hold", "--", "true")
    now = int(time.time() * 1000)
    path = f"/api/job/{job_id}"
    refused = {
        "none": "",
        "the token itself": web.token,
        "another key": sign("0" * 64, "GET", path, web.server),
        "another path": web.sign("GET", "/api/queue"),
        "another method": web.sign("POST", path),
        "changed time": web.sign("GET", path, now).replace(f"{now}.", f"{now + 1}.", 1),
        "two minutes old": web.sign("GET", path, now - 120_000),
        "two minutes ahead": web.sign("GET", path, now + 120_000),
        "for another server": sign(web.token, "GET", path, "0" * 32),
        "in seconds": web.sign("GET", path, now // 1000),
        "not a number": "x" + web.sign("GET", path),
    }
    for what, header in refused.items():
        status, _headers, body = web.request(path, auth=header)
        assert status == 403 and b"held" not in body, (what, status, body)
    assert web.request(path, auth=web.sign("GET", path, now + 30_000))[0] == 200  # a clock a little off
    again = web.sign("GET", path)
    assert web.request(path, auth=again)[0] == web.request(path, auth=again)[0] == 200  # a look may be repeated
    cancel = f"/api/job/{job_id}/cancel"
    other = gq.add("--hold", "--", "true")
    captured = web.sign("POST", cancel)
    assert web.request(f"/api/job/{other}/cancel", method="POST", auth=captured)[0] == 403  # for another job
    assert gq.state_of(other) == "held"
    assert web.request(cancel, method="POST", auth=captured)[0] == 200 and gq.state_of(job_id) == "cancelled"
    status, _headers, body = web.request(cancel, method="POST", auth=captured)  # an action acts once
    assert status == 403 and b"made already" in body


def test_two_servers_of_one_token_refuse_each_others_signatures(gq: Env, web: Web) -> None:
    """A signature is for one start of one server: captured on its way to one `gpuq web` (by
    whoever took its port after it stopped), it opens no other of the same user's."""
    job_id = gq.add("--name", "mine", "--hold", "--", "true")
    other = Web(gq)  # the same spool, so the same token, on another port
    try:
        assert other.token == web.token and other.server != web.server
        for made_for, sent_to in ((web, other), (other, web)):
            auth = made_for.sign("GET", "/api/queue")
            status, _headers, body = sent_to.request("/api/queue", auth=auth)
            assert status == 403 and b"mine" not in body, (status, body)
            assert made_for.request("/api/queue", auth=auth)[0] == 200
        hold = f"/api/job/{job_id}/cancel?n=1"
        assert other.request(hold, method="POST", auth=web.sign("POST", hold))[0] == 403
        assert gq.state_of(job_id) == "held"
        for server in (web, other):  # which server it is, unsigned, and nothing else
            status, _headers, body = server.request("/api/server", auth=False)
            said = json.loads(body)
            proof = hmac.new(web.token.encode(), f"server\n{server.server}\n{server.port}".encode(), "sha256")
            assert status == 200 and said == {"server": server.server, "port": server.port, "proof": proof.hexdigest()}
    finally:
        other.stop()


def test_the_token_is_kept_0600_in_the_spool_and_reused_until_renewed(gq: Env, web: Web) -> None:
    path = gq.home / "web-token"
    assert path.read_text().strip() == web.token and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert web.stop() == 0  # Ctrl-C ends it cleanly
    again = Web(gq)
    try:
        assert again.token == web.token  # an open page and a bookmark survive a restart
    finally:
        again.stop()
    renewed = Web(gq, "--new-token")
    try:
        assert renewed.token != web.token and path.read_text().strip() == renewed.token
        status, _headers, _body = renewed.request(
            "/api/queue", auth=sign(web.token, "GET", "/api/queue", renewed.server)
        )
        assert status == 403  # the old token is refused
    finally:
        renewed.stop()


def test_actions_are_posts_from_the_page_origin_through_the_library(gq: Env, web: Web) -> None:
    job_id = gq.add("--hold", "--", "true")
    status, _headers, _body = web.request(f"/api/job/{job_id}/release")  # a GET changes nothing
    assert status == 405 and gq.state_of(job_id) == "held"
    for origin in ("http://evil.example", None):
        status, _headers, body = web.request(f"/api/job/{job_id}/cancel", method="POST", origin=origin)
        assert status == 403 and b"did not come from this page" in body and gq.state_of(job_id) == "held"
    status, _headers, body = web.request(f"/api/job/{job_id}/kill", method="POST")  # refused as `gpuq kill` is
    assert status == 409 and gq.state_of(job_id) == "held"
    refused = gq.gpuq("kill", str(job_id), check=False)
    assert json.loads(body)["error"] in refused.stderr
    status, _headers, body = web.request(f"/api/job/{job_id}/cancel", method="POST")
    assert status == 200 and "cancelled" in json.loads(body)["said"] and gq.state_of(job_id) == "cancelled"
    status, _headers, body = web.request("/api/job/999/cancel", method="POST")
    assert status == 404 and json.loads(body)["error"] == "no such job #999"


def test_read_only_serves_no_action(gq: Env) -> None:
    job_id = gq.add("--hold", "--", "true")
    server = Web(gq, "--read-only")
    try:
        assert server.json(f"/api/job/{job_id}")["actions"] == ["cancel", "release"]  # what the state allows
        status, _headers, body = server.request(f"/api/job/{job_id}/cancel", method="POST")
        assert status == 403 and b"read-only" in body and gq.state_of(job_id) == "held"
        assert server.json(f"/api/job/{job_id}")["read_only"] is True
    finally:
        server.stop()


@pytest.mark.parametrize("read_only", [False, True])
def test_notify_url_secrets_reach_neither_the_api_nor_the_page(gq: Env, read_only: bool) -> None:
    urls = ["tgram://123456:AAHsecretBOT/987", "json://user:hunter2@host.example/hook?token=S"]
    job_id = gq.add("--hold", "--notify", urls[0], "--notify", urls[1], "--", "true")
    server = Web(gq, *(["--read-only"] if read_only else []))
    try:
        assert server.json(f"/api/job/{job_id}")["job"]["notify_urls"] == ["tgram://...", "json://host.example"]
        for path in (f"/api/job/{job_id}", f"/job/{job_id}"):
            _status, _headers, body = server.request(path)
            assert b"secretBOT" not in body and b"hunter2" not in body and b"token=S" not in body, path
    finally:
        server.stop()


def test_a_hostile_name_is_data_in_the_page_never_markup(gq: Env, web: Web) -> None:
    name = '</script><script>alert(1)</script><img src=x onerror="alert(2)">'
    job_id = gq.add("--name", name, "--hold", "--", "true")
    for path in ("/", f"/job/{job_id}"):  # the pages hold no data: the script puts it in as text
        status, _headers, body = web.request(path)
        page = body.decode()
        assert status == 200 and "<script>alert" not in page and "<img" not in page
    assert web.json(f"/api/job/{job_id}")["name"] == name  # the same name, as JSON


def test_a_log_is_read_from_its_end_and_followed_from_an_offset(gq: Env, web: Web) -> None:
    gq.script(
        "job.py",
        "print('first', flush=True)\nprint('\\x1b[31mred\\x1b[0m', flush=True)\n" + WAIT_FOR_GO + "print('second')\n",
    )
    job_id = gq.add("job.py")
    gq.start_worker()
    gq.wait_state(job_id, "running")
    # print() writes "red" and its line's end apart: read until the whole line is there
    whole = lambda got: "first\nred\n" in got["text"] and got  # noqa: E731
    log = wait_for(lambda: whole(web.json(f"/api/job/{job_id}/log")), what="the log's second line")
    assert log["following"] and "\x1b" not in log["text"]
    assert web.json(f"/api/job/{job_id}/log?offset={log['offset']}")["text"] == ""
    (gq.work / "go").write_text("")
    gq.wait_state(job_id, "done")
    rest = web.json(f"/api/job/{job_id}/log?offset={log['offset']}")
    assert rest["text"].startswith("second\n") and not rest["following"] and rest["offset"] == rest["size"]


def test_a_job_caught_mid_move_is_read_from_its_newer_copy(gq: Env, web: Web) -> None:
    """Running -> done writes done/'s file (rev + 1), then unlinks running/'s. Read in between, the
    log said `following` (and `show` said running) of a job that had ended: the first copy found
    was taken, not the higher rev that the spool's rule says is the job."""
    job_id = gq.add("--", "sh", "-c", "echo out")
    worker = gq.start_worker()
    gq.wait_state(job_id, "done")
    gq.gpuq("stop")  # no recovery scan of its to tidy the planted copy away
    worker.wait(15)
    ended = next((gq.home / "done").glob(f"{job_id:06d}-*"))
    data = json.loads(ended.read_text())
    data["rev"] -= 1  # the copy the move has not unlinked yet
    (gq.home / "running" / ended.name).write_text(json.dumps(data))
    got = web.json(f"/api/job/{job_id}/log?offset=0")
    assert got["state"] == "done" and not got["following"] and "out\n" in got["text"], got
    assert gq.gpuq("show", str(job_id), "--json").stdout.count('"state": "done"') == 1


def test_a_1_gib_log_is_never_read_whole(gq: Env, web: Web) -> None:
    job_id = gq.add("--hold", "--", "true")
    path = gq.home / "logs" / f"{job_id:06d}.log"
    with open(path, "wb") as fh:  # sparse: 1 GiB of zeros but for its last lines
        fh.truncate(1 << 30)
        fh.seek(1 << 30)
        fh.write(b"".join(b"line %d\n" % n for n in range(2000)))
    got = web.json(f"/api/job/{job_id}/log")
    assert got["text"].endswith("line 1999\n") and len(got["text"]) <= 64 * 1024
    assert got["offset"] == got["size"] == path.stat().st_size
    behind = web.json(f"/api/job/{job_id}/log?offset=5")  # far behind: the tail, saying what it skipped
    assert behind["skipped"] > (1 << 30) - 100 and behind["text"].endswith("line 1999\n")


def test_the_tail_of_a_long_log_says_how_much_it_skipped(gq: Env, web: Web) -> None:
    """Opened first (no offset), the page showed the end of an 80 KB log as if it were all of it."""
    job_id = gq.add("--hold", "--", "true")
    path = gq.home / "logs" / f"{job_id:06d}.log"
    path.write_bytes(b"".join(b"line %05d %s\n" % (n, b"x" * 60) for n in range(1200)))  # 85 KB
    got = web.json(f"/api/job/{job_id}/log")
    assert got["text"].endswith("line 01199 " + "x" * 60 + "\n") and not got["text"].startswith("line 00000")
    assert got["skipped"] == path.stat().st_size - len(got["text"].encode()) > 0 and got["offset"] == got["size"]
    small = gq.add("--hold", "--", "true")
    (gq.home / "logs" / f"{small:06d}.log").write_text("all of it\n")
    assert web.json(f"/api/job/{small}/log")["skipped"] == 0


def test_finished_jobs_are_paged_newest_first(gq: Env, web: Web) -> None:
    ids = [gq.add("--", "sh", "-c", f"exit {n % 3}") for n in range(14)]
    gq.start_worker()
    wait_for(lambda: len(gq.files("done")) + len(gq.files("failed")) == 14, 60, what="14 jobs to end")
    first = web.json("/api/queue")
    assert first["finished_total"] == 14 and [j["id"] for j in first["finished"]] == ids[::-1]
    failed = next(j for j in first["finished"] if j["id"] == ids[1])
    assert failed["state"] == "failed" and failed["exit_code"] == 1 and "exit=1" in failed["info"]
    assert first["pages"] == 1 and first["page"] == 0


def test_a_damaged_job_file_is_a_row_saying_so_not_an_error(gq: Env, web: Web) -> None:
    """As in `gpuq status`: the page's data used to fail (a KeyError) on a damaged file in held/,
    pending/ or done/."""
    held, pending = gq.add("--hold", "--", "true"), gq.add("--", "true")
    for job_id in (held, pending):
        next(gq.home.glob(f"*/{job_id:06d}-*.json")).write_text('{"broken')
    (gq.home / "done" / "000099-gone-wrong.json").write_text('{"broken')
    queue = web.json("/api/queue")
    rows = {row["id"]: row for row in queue["waiting"] + queue["finished"]}
    assert {job_id: rows[job_id]["state"] for job_id in (held, pending, 99)} == {
        held: "held",
        pending: "pending",
        99: "done",
    }
    assert all(rows[job_id]["info"].startswith("unreadable job file: not valid JSON") for job_id in (held, pending, 99))


def test_bad_options_are_one_line_and_exit_2(gq: Env) -> None:
    for args in (["--port", "x"], ["--port", "70000"], ["--nope"]):
        proc = gq.gpuq("web", *args, check=False)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)


def test_a_port_in_use_is_refused_in_one_line(gq: Env, web: Web) -> None:
    proc = gq.gpuq("web", "--port", str(web.port), check=False, timeout=30)
    assert proc.returncode == 1 and proc.stderr.startswith(f"gpuq web: cannot listen on 127.0.0.1:{web.port}")
    assert "token" not in proc.stdout  # no URL for a port it does not hold: the holder would get the token


def test_the_page_ships_inside_the_package() -> None:
    static = Path(__file__).resolve().parent.parent / "gpuq" / "cli" / "web" / "static"
    text = "".join(p.read_text() for p in static.iterdir())
    assert not re.search(r"(src|href)=\"(https?:)?//", text)  # no CDN: nothing fetched from elsewhere
    assert 'name="viewport" content="width=device-width' in (static / "index.html").read_text()
    assert os.path.getsize(static / "web.js") < 64 * 1024


def test_service_install_web_keeps_the_page_running_beside_the_worker(gq: Env, tmp_path: Path) -> None:
    from gpuq.run import service

    dest = tmp_path / "units"
    out = gq.gpuq("service", "install", "--dest", str(dest), "--web", "--web-port", "8123").stdout
    unit = (dest / service.WEB_UNIT_NAME).read_text()
    assert f"ExecStart={sys.executable} -m gpuq web --port 8123" in unit and f"GPUQ_HOME={gq.home}" in unit
    assert "Restart=on-failure" in unit and (dest / service.UNIT_NAME).exists()
    token = (gq.home / "web-token").read_text().strip()
    assert f"http://127.0.0.1:8123/#token={token}" in out and "enable --now gpuq-web.service" in out
    assert "(default 8737 + your uid % 1000" in " ".join(gq.gpuq("service", "--help").stdout.split())
    refused = gq.gpuq("service", "install", "--dest", str(dest), "--web-port", "9000", check=False)
    assert refused.returncode == 2 and "--web-port goes with --web" in refused.stderr
    gq.gpuq("service", "uninstall", "--dest", str(dest))
    assert not (dest / service.WEB_UNIT_NAME).exists() and not (dest / service.UNIT_NAME).exists()


def test_each_users_service_has_its_own_port(gq: Env, tmp_path: Path) -> None:
    """A server on another user's port serves the page its owner opens, and its script reads the token."""
    from gpuq.run import service

    assert len({service.web_port(uid) for uid in range(1000, 2000)}) == 1000  # 1000 users in a row: 1000 ports
    assert service.web_port(0) == 8737 and service.web_port(1001) == 8737 + 1
    dest = tmp_path / "units"
    out = gq.gpuq("service", "install", "--dest", str(dest), "--web").stdout
    port = service.web_port(os.getuid())
    assert f"-m gpuq web --port {port}\n" in (dest / service.WEB_UNIT_NAME).read_text()
    assert f"http://127.0.0.1:{port}/#token=" in out
    with socket.socket() as taken:  # someone listens on the port asked for: said, since they would get the token
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        other = taken.getsockname()[1]
        proc = gq.gpuq("service", "install", "--dest", str(dest), "--web", "--web-port", str(other))
        assert (
            f"port {other} is in use now" in proc.stderr
            and f"--port {other}\n" in (dest / service.WEB_UNIT_NAME).read_text()
        )


def test_a_service_whose_own_port_is_taken_gets_a_free_one_and_keeps_it(gq: Env, tmp_path: Path) -> None:
    """Users 1000 and 2000 have the same own port (uid % 1000): the second to install got a unit that
    could never listen. Now it gets the first free port 1000, 2000... above (no user's own), and its URL."""
    from gpuq.run import service

    dest, own = tmp_path / "units", service.web_port(os.getuid())
    with socket.socket() as taken:
        with contextlib.suppress(OSError):  # held by someone else already: taken all the same
            taken.bind(("127.0.0.1", own))
            taken.listen()
        proc = gq.gpuq("service", "install", "--dest", str(dest), "--web")
    found = re.search(r" --port (\d+)\n", (dest / service.WEB_UNIT_NAME).read_text())
    port = int(found.group(1)) if found else own
    assert port != own and (port - own) % 1000 == 0 and port > 9736, port  # past every user's own port
    assert f"http://127.0.0.1:{port}/#token=" in proc.stdout
    assert f"port {own}, your own, is in use now: the page gets {port}" in proc.stderr
    again = gq.gpuq("service", "install", "--dest", str(dest), "--web")  # installed again: the URL stays
    assert f"--port {port}\n" in (dest / service.WEB_UNIT_NAME).read_text() and f":{port}/#token=" in again.stdout


def test_a_reinstalled_service_keeps_the_port_given_by_web_port(gq: Env, tmp_path: Path) -> None:
    """A unit installed with --web-port 9999 moved to the user's own port when installed again
    without it (only ports of the user's own series were kept): its URL stopped working."""
    from gpuq.run import service

    dest, own = tmp_path / "units", service.web_port(os.getuid())
    gq.gpuq("service", "install", "--dest", str(dest), "--web", "--web-port", "9999")
    with socket.socket() as taken:  # its own port taken meanwhile: not why it keeps 9999, nor said so
        with contextlib.suppress(OSError):  # held by someone else already: taken all the same
            taken.bind(("127.0.0.1", own))
            taken.listen()
        again = gq.gpuq("service", "install", "--dest", str(dest), "--web")
    assert "-m gpuq web --port 9999\n" in (dest / service.WEB_UNIT_NAME).read_text()
    assert "http://127.0.0.1:9999/#token=" in again.stdout and "gpuq-web.service is already this unit" in again.stdout
    assert "your own, is in use now" not in again.stderr, again.stderr


def test_the_first_page_benchmark_runs(tmp_path: Path) -> None:
    """bench/web_first_page.py end to end, tiny, so it cannot rot (bench/WEB.md has its figures)."""
    script = Path(__file__).resolve().parent.parent / "bench" / "web_first_page.py"
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            str(tmp_path / "q"),
            "--finished",
            "30",
            "--pending",
            "1",
            "--rounds",
            "2",
            "--starts",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert out["finished"] == 30 and out["first_median_ms"] > 0 and out["page_bytes"] > 1000


def test_each_action_goes_through_the_request_its_command_makes(gq: Env, web: Web) -> None:
    def act(job_id: int, name: str) -> tuple[int, str]:
        status, _headers, body = web.request(f"/api/job/{job_id}/{name}", method="POST")
        answer = json.loads(body)
        return status, answer.get("said") or answer["error"]

    gq.script("job.py", WAIT_FOR_GO)
    gq.script("fail.py", "raise SystemExit(3)\n")
    failed = gq.add("fail.py")
    held = gq.add("--hold", "job.py")
    gq.start_worker("--watch")
    gq.wait_state(failed, "failed")
    assert act(held, "release")[0] == 200
    # as the library finds it: during the move its pending copy may still be there a moment
    wait_for(lambda: web.json(f"/api/job/{held}")["state"] == "running", 20, what="it running")
    assert web.json(f"/api/job/{held}")["actions"] == ["cancel", "kill", "preempt"]
    status, said = act(held, "preempt")
    assert status == 200 and "preempted" in said and gq.state_of(held) == "preempted"
    assert act(held, "resume")[0] == 200
    wait_for(lambda: web.json(f"/api/job/{held}")["state"] == "running", 20, what="it running again")
    wait_for(lambda: gq.job(held).get("pid"), what="its process recorded")
    status, said = act(held, "kill")
    assert status == 200 and "killed" in said and gq.wait_state(held, "cancelled")["exit_code"] is not None
    status, said = act(held, "kill")
    assert status == 409 and said in gq.gpuq("kill", str(held), check=False).stderr
    status, said = act(failed, "retry")
    assert status == 200 and "back in the queue" in said and gq.state_of(failed) in ("pending", "running", "failed")
    wait_for(lambda: len(gq.job(failed).get("history") or []) == 2, 20, what="the retried job to fail again")
    pending = gq.add("--after", str(held), "job.py")  # waits for a cancelled job: held back for ever
    assert act(pending, "hold")[0] == 200 and gq.state_of(pending) == "held"
    assert web.json(f"/api/job/{pending}")["actions"] == ["cancel", "release"]


def test_without_the_web_extra_it_says_what_to_install(gq: Env) -> None:
    hide = "import sys; sys.modules['uvicorn'] = None; from gpuq.cli import main; sys.exit(main(['web']))"
    proc = subprocess.run([sys.executable, "-c", hide], env=gq.env, cwd=gq.work, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("gpuq web: needs uvicorn, not installed: ") and "[web]" in proc.stderr


def test_many_finished_jobs_come_50_to_a_page_from_the_index(gq: Env, web: Web) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from status_scale import build  # the benchmark's finished job files: 120 of them in done/

    build(gq.home, 120)
    first = web.json("/api/queue")
    assert first["finished_total"] == 120 and first["pages"] == 3
    assert [j["id"] for j in first["finished"]] == list(range(120, 70, -1))
    assert first["finished"][0]["info"] == "exit=0" and first["finished"][0]["ran"]
    last = web.json("/api/queue?page=2")
    assert [j["id"] for j in last["finished"]] == list(range(20, 0, -1)) and last["page"] == 2
    assert web.json("/api/queue?page=9")["page"] == 2  # past the end: the last page


def test_a_new_token_is_honoured_by_a_server_already_running(gq: Env, web: Web) -> None:
    """Rotating a leaked token must revoke it everywhere, the service's long-running server too."""
    assert web.request("/api/queue")[0] == 200
    renewed = Web(gq, "--new-token")
    try:
        assert web.request("/api/queue")[0] == 403  # signed with the old token, at the server started before
        status, headers, _body = web.request("/?token=" + renewed.token, auth=False)
        assert status == 303 and headers["location"] == "/#token=" + renewed.token
        assert web.request("/api/queue", auth=sign(renewed.token, "GET", "/api/queue", web.server))[0] == 200
    finally:
        renewed.stop()


def test_odd_numbers_in_a_query_are_no_server_error(gq: Env, web: Web) -> None:
    job_id = gq.add("--hold", "--", "true")
    for path in ("/api/queue?page=%C2%B2", "/?page=%C2%B2", f"/api/job/{job_id}/log?offset=%C2%B2"):
        assert web.request(path)[0] == 200, path
    assert web.request("/api/queue?page=" + "9" * 5000)[0] == 200
    assert web.stop() == 0 and "Traceback" not in web.proc.stderr.read()


def test_a_folded_sweep_counts_its_finished_jobs_as_status_does(gq: Env, web: Web) -> None:
    """The page's sweep line counts every job of the sweep (its finished ones too, whether the view
    read them as rows or from the finished index's many), the same line `gpuq status` prints."""
    gq.script("job.py", "print('ran')\n")
    gq.gpuq("add", "-q", "--sweep", "x=1,2,3,4,5,6", "job.py", "--x", "{x}")
    gq.gpuq("hold", "5,6")
    gq.gpuq("run")
    line = "sweep of 6 over x: 4 done, 0 running, 2 waiting, 0 failed ("
    assert line in gq.gpuq("status").stdout
    for many in (False, True):  # 4 finished jobs are rows; then 13 are, more than the view reads as rows
        if many:
            for _ in range(9):
                gq.add("job.py")
            gq.gpuq("run")
        [folded] = web.json("/api/queue")["waiting"]
        assert folded["folded"] and line in folded["info"], folded["info"]
        assert [job["id"] for job in folded["jobs"]] == [5, 6]


def test_an_undecodable_byte_in_an_argument_or_directory_comes_escaped(gq: Env, web: Web, tmp_path: Path) -> None:
    """As `status --json` writes it: a job with a non-UTF-8 argument or working directory made every
    /api/queue a 500 (no job shown) and its own /api/job a 500 for good."""
    odd_dir = tmp_path / "d\udce9j\udce0"  # the bytes d\xe9j\xe0 as Python keeps them
    odd_dir.mkdir()
    by_arg = gq.add("--hold", "--", "python", "train.py", "--data", "/data/caf\udce9.csv")
    by_dir = gq.add("--hold", "--", "true", cwd=odd_dir)
    queue = web.json("/api/queue")
    assert {row["id"] for row in queue["waiting"]} == {by_arg, by_dir}
    assert "/data/caf\\udce9.csv" in dict(web.json(f"/api/job/{by_arg}")["card"])["command"]
    assert "d\\udce9j\\udce0" in " ".join(value for _label, value in web.json(f"/api/job/{by_dir}")["card"])
