"""`gpuq web`'s first page with many finished jobs: how long the page (its HTML, then the queue its
script asks for: workers, running and waiting jobs, the newest page of finished ones) takes to be served.

    python bench/web_first_page.py /tmp/gpuq-web10k --finished 10000 --rounds 20 --starts 5

The spool is filled as bench/status_scale.py's `build` fills it (plain writes of finished job files,
not gpuq's fsynced publish), plus a few pending jobs queued with `gpuq add --hold`. A real `gpuq web`
is started on a free loopback port; each request is a new connection, those of the API signed with
the token as the page's script signs them, as a browser's load of the page. It prints, in
milliseconds: the first page after the server printed its URL (median, min and max over `--starts`
servers), the median, min and max of `--rounds` later loads of the page and of its poll
(`/api/queue`), then one page with the finished index removed (`cold`: every finished file read,
as after `rm -r cache/`).
"""

from __future__ import annotations

import argparse
import hmac
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from status_scale import build  # noqa: E402  (bench/ on the path first)


def fill(home: Path, finished: int, pending: int) -> None:
    from gpuq.spool import Spool

    if len(Spool(home).ensure().jobs.names("done")) < finished:
        build(home, finished)
    have = len(Spool(home).jobs.names("held"))
    env = dict(os.environ, GPUQ_HOME=str(home))
    for _n in range(have, pending):
        subprocess.run(
            [sys.executable, "-m", "gpuq", "add", "-q", "--hold", "--", "python3", "train.py"],
            env=env,
            cwd=home,
            check=True,
            capture_output=True,
        )


class Server:
    def __init__(self, home: Path) -> None:
        env = dict(os.environ, GPUQ_HOME=str(home))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuq", "web", "--port", "0"], env=env, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        found = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/#token=([0-9a-f]+)", line)
        if not found:
            self.stop()
            raise SystemExit(f"gpuq web printed {line!r}")
        self.port, self.token = int(found.group(1)), found.group(2)
        self.server = ""  # the id of this start, which the page asks for (`/api/server`) and signs for

    def get(self, path: str) -> tuple[float, int]:
        """Seconds from connecting to the whole answer read, and its size; for `/`, the page's and
        then those its script asks for: which server it is, then the queue."""
        if path != "/":
            return self.fetch(path)
        loads = [self.fetch("/"), self.fetch("/api/server"), self.fetch("/api/queue")]
        return sum(t for t, _size in loads), sum(size for _t, size in loads)

    def fetch(self, path: str) -> tuple[float, int]:
        start = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        ts = int(time.time() * 1000)
        mac = hmac.new(self.token.encode(), f"GET\n{path}\n{ts}\n{self.server}".encode(), "sha256").hexdigest()
        conn.request("GET", path, headers={"X-Gpuq-Auth": f"{ts}.{mac}"})
        resp = conn.getresponse()
        body = resp.read()
        elapsed = time.perf_counter() - start
        conn.close()
        if resp.status != 200:
            raise SystemExit(f"GET {path}: {resp.status} {body[:200]!r}")
        if path == "/api/server":
            self.server = json.loads(body)["server"]
        return elapsed, len(body)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("home", type=Path)
    parser.add_argument("--finished", type=int, default=10000)
    parser.add_argument("--pending", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--starts", type=int, default=5, help="servers started, each timed on its first page")
    args = parser.parse_args()
    fill(args.home, args.finished, args.pending)
    env = dict(os.environ, GPUQ_HOME=str(args.home))
    subprocess.run([sys.executable, "-m", "gpuq", "status"], env=env, check=True, capture_output=True)  # the index
    out: dict[str, object] = {"finished": args.finished, "pending": args.pending, "load_before": os.getloadavg()[0]}
    firsts = []
    for _start in range(args.starts - 1):  # a new server each time: its first page
        server = Server(args.home)
        try:
            firsts.append(server.get("/")[0])
        finally:
            server.stop()
    server = Server(args.home)
    try:
        first, size = server.get("/")
        firsts.append(first)
        out["first_median_ms"], out["page_bytes"] = round(statistics.median(firsts) * 1000, 1), size
        out["first_min_ms"], out["first_max_ms"] = round(min(firsts) * 1000, 1), round(max(firsts) * 1000, 1)
        pages = [server.get("/")[0] for _ in range(args.rounds)]
        polls = [server.get("/api/queue")[0] for _ in range(args.rounds)]
        shutil.rmtree(args.home / "cache")
        os.mkdir(args.home / "cache", 0o700)
        out["cold_ms"] = round(server.get("/")[0] * 1000, 1)
    finally:
        server.stop()
    for name, values in (("page", pages), ("poll", polls)):
        out[f"{name}_median_ms"] = round(statistics.median(values) * 1000, 1)
        out[f"{name}_min_ms"], out[f"{name}_max_ms"] = round(min(values) * 1000, 1), round(max(values) * 1000, 1)
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
