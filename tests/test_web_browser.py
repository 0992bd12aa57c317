"""`gpuq web` in a real browser: Debian's Chromium, headless, through Selenium, against a real
`gpuq web` and a real worker with simulated GPUs (GPUQ_FAKE_GPUS). The queue changes by itself as
jobs start and end, a job's page follows its log, a hostile job name is text, cancel from the page
cancels, a phone's 360 px has no sideways scroll, the token reaches no other port's server and a
server that took the port after ours stopped learns nothing it can use. Skipped, saying why,
without the browser.

The README's screenshots are taken here: with GPUQ_SAVE_SCREENSHOTS=1 they are written to docs/."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
from conftest import REPO, WAIT_FOR_GO, Env, wait_for
from test_gpu_worker import Gpus, fake_gpus
from test_web import Web

pytest.importorskip("starlette", reason="the web extra (starlette) is not installed")
selenium = pytest.importorskip("selenium", reason="selenium is not installed (the test extra)")

from selenium import webdriver  # noqa: E402  (after the skip: only with selenium)
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM, DRIVER = shutil.which("chromium") or "/usr/bin/chromium", "/usr/bin/chromedriver"
PHONE = {"width": 360, "height": 740, "deviceScaleFactor": 2, "mobile": True}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        pytest.skip("Chromium is not installed (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    try:
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    except WebDriverException as exc:
        pytest.skip(f"Chromium does not start here: {exc.msg}")
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def served(gq: Env, browser: Any) -> Iterator[tuple[Env, Web, Any]]:
    doc = fake_gpus(2)
    doc["gpus"][0]["utilization_gpu"], doc["gpus"][1]["utilization_gpu"] = 87, 3
    Gpus(gq, doc)
    gq.env["GPUQ_GPU_SAMPLE_SECONDS"] = "0.2"
    gq.start_worker("--watch")
    web = Web(gq)
    browser.delete_all_cookies()
    browser.execute_cdp_cmd("Storage.clearDataForOrigin", {"origin": web.base, "storageTypes": "all"})
    try:
        yield gq, web, browser
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        web.stop()


def text_of(driver: Any, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def job_box(driver: Any, section: str, job_id: int) -> Any:
    found = driver.find_elements(By.CSS_SELECTOR, f"#{section} [data-id='{job_id}']")
    return found[0] if found else None


def test_the_queue_appears_and_changes_by_itself_as_a_job_starts_and_ends(served: tuple[Env, Web, Any]) -> None:
    gq, web, driver = served
    driver.get(web.url)
    assert driver.current_url == web.base + "/"  # the token left the address
    wait_for(lambda: "nothing running" in text_of(driver, "running"), what="the empty queue")
    assert "GPU 0" in text_of(driver, "gpus") and "87%" in text_of(driver, "gpus")
    gq.script("job.py", WAIT_FOR_GO)
    job_id = gq.add("--name", "train-a", "job.py")
    box = wait_for(lambda: job_box(driver, "running", job_id), 20, what="the job shown running, without a reload")
    assert "train-a" in box.text
    wait_for(lambda: f"#{job_id}" in text_of(driver, "gpus"), 20, what="the GPU's holder")
    (gq.work / "go").write_text("")
    done = wait_for(lambda: job_box(driver, "finished", job_id), 20, what="the job shown finished")
    assert "done" in done.text and "exit=0" in done.text and job_box(driver, "running", job_id) is None


def test_a_job_page_follows_its_log(served: tuple[Env, Web, Any]) -> None:
    gq, web, driver = served
    body = "print('epoch one', flush=True)\n" + WAIT_FOR_GO + "print('epoch two', flush=True)\n"
    body += WAIT_FOR_GO.replace("'go'", "'go2'")
    gq.script("job.py", body)
    job_id = gq.add("job.py")
    gq.wait_state(job_id, "running")
    driver.get(f"{web.url}")
    driver.get(f"{web.base}/job/{job_id}")
    wait_for(lambda: "epoch one" in text_of(driver, "log"), 20, what="the log's first line")
    assert "epoch two" not in text_of(driver, "log") and text_of(driver, "log-state") == "following"
    card = text_of(driver, "card")  # `gpuq show`'s lines: what runs, where, with which python and why
    assert "job.py" in card and str(gq.work) in card and "(from PATH)" in card
    chart = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#chart .util-line polyline"), 20, what="GPU chart")
    assert text_of(driver, "chart").startswith("GPU 0") and chart[0].get_attribute("points")  # the recorded series
    (gq.work / "go").write_text("")
    wait_for(lambda: "epoch two" in text_of(driver, "log"), 20, what="the next line, without a reload")
    (gq.work / "go2").write_text("")
    wait_for(lambda: "=== gpuq: exit 0" in text_of(driver, "log"), 20, what="the log's end")
    wait_for(lambda: "done" in text_of(driver, "title"), 20, what="the page to say done")


def test_a_hostile_job_name_renders_as_text_and_runs_nothing(served: tuple[Env, Web, Any]) -> None:
    gq, web, driver = served
    name = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
    gq.script("job.py", "print('\\x1b[31m<b>red</b>\\x1b[0m')\n")
    job_id = gq.add("--name", name, "job.py")
    gq.wait_state(job_id, "done")
    driver.get(web.url)
    box = wait_for(lambda: job_box(driver, "finished", job_id), 20, what="the job")
    assert box.find_element(By.CLASS_NAME, "name").text == name
    driver.get(f"{web.base}/job/{job_id}")
    wait_for(lambda: "<b>red</b>" in text_of(driver, "log"), 20, what="the log")
    assert name in text_of(driver, "title") and "\x1b" not in text_of(driver, "log")
    assert driver.execute_script("return window.pwned") is None
    assert driver.find_elements(By.CSS_SELECTOR, "main img, #log b") == []


def test_without_the_token_the_browser_gets_403(served: tuple[Env, Web, Any]) -> None:
    gq, web, driver = served
    gq.add("--name", "private-run", "--hold", "--", "true")
    driver.get(web.base + "/")
    wait_for(lambda: "403 forbidden" in text_of(driver, "message"), what="the page to say it has no token")
    assert "private-run" not in driver.page_source
    driver.get(web.url)
    wait_for(lambda: "private-run" in text_of(driver, "waiting"), what="the queue with the token")


def test_cancel_from_the_page_cancels_the_job(served: tuple[Env, Web, Any]) -> None:
    gq, web, driver = served
    gq.script("job.py", WAIT_FOR_GO)
    job_id = gq.add("job.py")
    gq.wait_state(job_id, "running")
    driver.get(web.url)
    driver.get(f"{web.base}/job/{job_id}")
    button = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "button[data-action='cancel']"), what="cancel")
    button[0].click()
    alert = wait_for(lambda: _alert(driver), what="the confirmation")
    assert f"#{job_id}" in alert.text
    alert.accept()
    assert gq.wait_state(job_id, "cancelled")["exit_code"] is not None  # it was running: killed first
    wait_for(lambda: "cancelled" in text_of(driver, "message"), 20, what="the page to say so")


def _alert(driver: Any) -> Any:
    try:
        alert = driver.switch_to.alert
        alert.text  # noqa: B018  (raises while there is none)
        return alert
    except WebDriverException:
        return None


def test_a_360px_phone_has_no_horizontal_scroll(served: tuple[Env, Web, Any], tmp_path: Path) -> None:
    gq, web, driver = served
    long = "a-very-long-experiment-name-without-spaces-" * 4
    gq.script("job.py", "print('x' * 3000)\nprint('Step 40/100', flush=True)\n" + WAIT_FOR_GO)
    running = gq.add("--name", long, "job.py", "--lr", "0.0003" * 20)
    waiting = gq.add("--name", "eval", "--after", str(running), "--", "python3", "-c", "pass")
    gq.wait_state(running, "running")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
    driver.get(web.url)
    wait_for(lambda: job_box(driver, "running", running) and job_box(driver, "waiting", waiting), 20, what="jobs")
    for path in ("/", f"/job/{running}"):
        driver.get(web.base + path)
        wait_for(lambda: driver.execute_script("return document.readyState") == "complete", what="the page")
        width = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        assert width[1] == 360 and width[0] <= width[1], (path, width)
    driver.get(web.base + "/")
    wait_for(lambda: job_box(driver, "running", running), what="the queue")
    where = REPO / "docs" if os.environ.get("GPUQ_SAVE_SCREENSHOTS") == "1" else tmp_path
    shot = where / "web-phone.png"
    assert driver.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (gq.work / "go").write_text("")


def test_the_readme_screenshot(served: tuple[Env, Web, Any], tmp_path: Path) -> None:
    """The queue as the README shows it: a running job with progress on a busy GPU, one waiting for
    it, one failed; written to docs/web-queue.png with GPUQ_SAVE_SCREENSHOTS=1."""
    gq, web, driver = served
    gq.script("train.py", "import sys\nfor n in range(1, 43):\n    print(f'Step {n}/100', flush=True)\n" + WAIT_FOR_GO)
    gq.script("oom.py", "raise SystemExit('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB')\n")
    failed = gq.add("--name", "exp04/oom", "oom.py")
    gq.wait_state(failed, "failed")
    running = gq.add("--name", "exp05/train", "train.py", "--lr", "3e-4")
    gq.add("--name", "exp05/eval", "--after", str(running), "--", "python3", "eval.py")
    gq.gpuq("add", "-q", "--name", "exp06/sweep", "--sweep", "lr=1e-4,3e-4,1e-3", "--hold", "train.py", "--lr", "{lr}")
    gq.wait_state(running, "running")
    wait_for(lambda: "Step 42/100" in gq.log(running), 20, what="the job's progress")
    gpus = Gpus(gq, fake_gpus(2))  # the file the worker reads afresh at every look
    busy = iter(range(1000))

    def history_drawn() -> bool:
        """GPU 0 busier at each look, holding 41 GB, until the page's chart has a few points."""
        doc = fake_gpus(2)
        doc["gpus"][0].update(memory_used_mib=41000, utilization_gpu=min(100, 40 + 9 * next(busy)))
        doc["gpus"][1]["utilization_gpu"] = 3
        gpus.set(doc)
        # read in the page at once: a redraw between finding the line and reading it made it stale
        line = "document.querySelector('#gpus .util-line polyline')"
        points = driver.execute_script(f"return {line} && {line}.getAttribute('points')")
        return len((points or "").split()) >= 5

    driver.set_window_size(1100, 1000)
    driver.get(web.url)
    wait_for(history_drawn, 60, interval=1.0, what="a few looks at the GPUs drawn")
    wait_for(lambda: "42%" in text_of(driver, "running"), 30, what="its progress on the page")
    wait_for(lambda: f"#{running}" in text_of(driver, "gpus"), 20, what="who holds the GPU")
    assert "sweep of 3 over lr" in text_of(driver, "waiting")  # folded, as `gpuq status` folds it
    assert "CUDA out of memory" in text_of(driver, "finished")
    where = REPO / "docs" if os.environ.get("GPUQ_SAVE_SCREENSHOTS") == "1" else tmp_path
    where.mkdir(exist_ok=True)
    shot = where / "web-queue.png"
    assert driver.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(web.request("/api/queue")[2])["running"][0]["progress"] == 0.42
    (gq.work / "go").write_text("")


class Listener(http.server.ThreadingHTTPServer):
    """Another user's server on this host (their "tensorboard"): it records every request it is
    sent, whole, and answers each with an empty page, or for a path in `answers` (without its
    query) with the status and JSON given."""

    def __init__(self, port: int = 0, answers: Optional[dict[str, tuple[int, bytes]]] = None) -> None:
        self.got: list[bytes] = []
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def record(self) -> None:
                listener.got.append(f"{self.command} {self.path}\n{self.headers}".encode())
                status, body = (answers or {}).get(self.path.split("?")[0], (0, b""))
                self.send_response(status or 200)
                self.send_header("Content-Type", "application/json" if status else "text/html")
                self.end_headers()
                self.wfile.write(body if status else b"<!doctype html><title>tensorboard</title>")

            do_GET = do_POST = record

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def _listen(port: int, answers: Optional[dict[str, tuple[int, bytes]]] = None) -> Optional[Listener]:
    try:
        return Listener(port, answers)
    except OSError:
        return None


def test_the_token_reaches_no_server_on_another_port(served: tuple[Env, Web, Any]) -> None:
    """A cookie, whatever its flags, goes to every port of its host: the other user's server there
    got `Cookie: gpuq-...=TOKEN` and cancelled jobs with it."""
    gq, web, driver = served
    gq.add("--name", "mine", "--hold", "--", "true")
    other = Listener()
    try:
        driver.get(web.url)
        wait_for(lambda: "mine" in text_of(driver, "waiting"), what="the queue with the token")
        assert driver.current_url == web.base + "/"  # the fragment left the address bar too
        driver.get(f"http://127.0.0.1:{other.server_port}/")
        driver.get(f"http://127.0.0.1:{other.server_port}/static/web.js")
        wait_for(lambda: len(other.got) >= 2, what="the other server visited")
        heard = b"\n".join(other.got).lower()
        assert web.token.encode() not in heard and b"cookie" not in heard and b"x-gpuq-auth" not in heard, heard
        driver.get(web.base + "/")  # the token kept for this port's page alone
        wait_for(lambda: "mine" in text_of(driver, "waiting"), what="the queue again, without the token in the URL")
    finally:
        other.close()


def test_who_takes_the_port_after_the_server_stopped_learns_nothing_it_can_use(
    served: tuple[Env, Web, Any],
) -> None:
    """The open page polls on: whoever serves the port then is sent signatures, never the token, and
    no signature made before a server started is taken by it."""
    gq, web, driver = served
    gq.add("--name", "mine", "--hold", "--", "true")
    driver.get(web.url)
    wait_for(lambda: "mine" in text_of(driver, "waiting"), what="the queue")
    port = web.port
    assert web.stop() == 0
    taker = wait_for(lambda: _listen(port), what="another server on the port")
    try:
        wait_for(lambda: any(b"/api/queue" in got for got in taker.got), 20, what="the open page's poll")
    finally:
        taker.close()
    heard = b"\n".join(taker.got)
    assert web.token.encode() not in heard and b"cookie" not in heard.lower(), heard
    poll = next(got.decode() for got in taker.got if "/api/queue" in got.decode())
    path = poll.split()[1]
    auth = next(line.split(":", 1)[1].strip() for line in poll.splitlines() if line.lower().startswith("x-gpuq-auth:"))
    assert auth == web.sign("GET", path, int(auth.split(".")[0]))  # the page's own signature
    again = Web(gq, "--port", str(port))  # its owner's server back on the port, within the minute
    try:
        status, _headers, body = again.request(path, auth=auth)  # replayed: refused
        assert status == 403 and b"mine" not in body, (status, body)
        _wait_live_again(driver)
    finally:
        again.stop()


def test_a_signature_the_page_made_opens_no_other_server_of_the_same_token(served: tuple[Env, Web, Any]) -> None:
    """Two `gpuq web` of one user, on two ports. Whoever takes the first one's port after it stopped
    is sent the open page's signed polls; tried at the second server, within their minute, they
    are refused, even when the taker passes off the second server's id as its own: the page takes a
    new id only from its own server's port. Its owner's server back on the port, the page goes on."""
    gq, web, driver = served
    gq.add("--name", "mine", "--hold", "--", "true")
    other = Web(gq)  # the same token, another port
    try:
        driver.get(web.url)
        wait_for(lambda: "mine" in text_of(driver, "waiting"), what="the queue")
        port = web.port
        assert web.stop() == 0
        relayed = other.request("/api/server", auth=False)[2]  # the other server's id, with its proof
        refused = json.dumps({"error": "403 forbidden"}).encode()
        answers = {"/api/server": (200, relayed), "/api/queue": (403, refused)}
        taker = wait_for(lambda: _listen(port, answers), what="another server on the port")
        try:
            wait_for(lambda: len(taker.got) >= 4, 20, what="the open page's requests")
        finally:
            taker.close()
        heard = [got.decode() for got in taker.got]
        assert web.token not in "\n".join(heard) and "cookie" not in "\n".join(heard).lower()
        polls = [
            (got.split()[1], line.split(":", 1)[1].strip())
            for got in heard
            for line in got.splitlines()
            if line.lower().startswith("x-gpuq-auth:")
        ]
        assert polls, heard
        for path, auth in polls:  # replayed at once, well within the signatures' minute
            status, _headers, body = other.request(path, auth=auth)
            assert status == 403 and b"mine" not in body, (path, status, body)
        assert "another server answers at this address" in text_of(driver, "live")
        again = Web(gq, "--port", str(port))  # its owner's server back on the port: a new id, taken
        try:
            _wait_live_again(driver)
        finally:
            again.stop()
    finally:
        other.stop()


def _wait_live_again(driver: Any) -> None:
    wait_for(
        lambda: "live" in text_of(driver, "live") and "offline" not in text_of(driver, "live"),
        20,
        what="the open page working again",
    )
