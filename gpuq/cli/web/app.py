"""The ASGI application of `gpuq web` (Starlette): the pages, the JSON they poll, the actions.
Anyone on the machine can reach loopback, so every request for data (`/api/`) must be signed with
the token, else 403; the pages themselves hold no data. The token never travels after the printed
URL, in whose fragment no browser sends it: no cookie (a cookie goes to every port of the host,
another user's server's too), only a signature over the one request. A changing request is a POST
whose Origin must be the page's own, so another site open in the same browser cannot act through it.
"""

from __future__ import annotations

import hmac
import os
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, MutableMapping, Optional
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from gpuq.cli.top.model import Ring
from gpuq.cli.web import data
from gpuq.core.errors import GpuqError, UsageError
from gpuq.core.words import utf8
from gpuq.spool import Spool

STATIC = Path(__file__).resolve().parent / "static"
ASSETS = {"web.css": "text/css; charset=utf-8", "web.js": "text/javascript; charset=utf-8"}
PAGES = ("index.html", "job.html")
# The page runs only its own script and style: a name that got past the escaping could still run nothing.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
}
AUTH_HEADER = "x-gpuq-auth"  # TS.HEX: HMAC-SHA256, keyed with the token, of "METHOD\nPATH?QUERY\nTS\nSERVER"
WINDOW_MS = 60_000  # how long a signature is good for, either side of this server's clock (TS is in ms)
FORBIDDEN = "403 forbidden: open the URL `gpuq web` printed (it carries the token)"

Asgi = Callable[[Any, Any, Any], Awaitable[None]]  # an ASGI application: (scope, receive, send)


def signature(token: str, method: str, target: str, ts: int, server: str) -> str:
    """What the page's script sends for one request (web.js's `signed`): `target` is the path
    with its query as sent, `server` the id of the server start it is for (`TokenGate.hello`)."""
    return f"{ts}." + _mac(token, f"{method}\n{target}\n{ts}\n{server}")


def _mac(token: str, text: str) -> str:
    return hmac.new(token.encode(), text.encode(), "sha256").hexdigest()


class TokenGate:
    """Every `/api/` request signed with the token now (the file's: `--new-token` revokes the old
    one); an old `?token=` URL is sent to its fragment form, serving nothing."""

    def __init__(self, app: Asgi, token: Callable[[], Optional[str]], port: int) -> None:
        self.app, self.token, self.port = app, token, port
        # The id of this start, in every signature: one made for another `gpuq web` of the same token
        # (as the open page of a stopped one sends whoever took its port) or for this port's earlier
        # server is refused here.
        self.server = os.urandom(16).hex()
        self.posted: dict[str, int] = {}  # POST signatures in the window: a captured action acts once

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).update(SECURITY_HEADERS)
            await send(message)

        request, token = Request(scope), self.token()
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = dict(query).get("token")
        response: Optional[Response] = None
        if given is not None and request.method == "GET":  # a URL printed before the fragment form
            if token is not None and hmac.compare_digest(given.encode(), token.encode()):
                rest = urlencode([(k, v) for k, v in query if k != "token"])
                here = "/" + scope["path"].lstrip("/")  # never `//host`: a redirect elsewhere
                response = RedirectResponse(here + (f"?{rest}" if rest else "") + f"#token={token}", 303)
            else:
                response = PlainTextResponse(FORBIDDEN + "\n", 403)
        elif scope["path"] == "/api/server":  # unsigned: what the page signs for
            response = JSONResponse(self.hello(token) if token else {"error": FORBIDDEN}, 200 if token else 403)
        elif scope["path"].startswith("/api/"):
            refused = self.refused(request, token)
            response = JSONResponse({"error": refused}, 403) if refused else None
        await (response or self.app)(scope, receive, secured)

    def hello(self, token: str) -> dict[str, Any]:
        """This start's id and port, with a proof keyed with the token that ties them together: the
        page signs for the id, and takes a new one (after a restart) only from a server that knows the
        token and listens on the port the first one did (the server's own: `ssh -L` moves the page's)."""
        return {"server": self.server, "port": self.port, "proof": _mac(token, f"server\n{self.server}\n{self.port}")}

    def refused(self, request: Request, token: Optional[str]) -> Optional[str]:
        """Why this request's signature is not one the page made just now for it, or None."""
        scope, now, given = request.scope, time.time() * 1000, request.headers.get(AUTH_HEADER, "")
        ts = _count(given.partition(".")[0])
        target = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        target += ("?" + scope["query_string"].decode("latin-1")) if scope.get("query_string") else ""
        if token is None or ts is None:
            return FORBIDDEN
        if not hmac.compare_digest(given.encode(), signature(token, request.method, target, ts, self.server).encode()):
            return FORBIDDEN
        if abs(now - ts) > WINDOW_MS:
            return "403: signed more than a minute off this server's clock: is the browser's device's clock right?"
        if request.method == "POST":
            self.posted = {mac: t for mac, t in self.posted.items() if t >= now - WINDOW_MS}
            if given in self.posted:
                return "403: this very request was made already: do it again from the page"
            self.posted[given] = ts
        return None


def same_origin(request: Request) -> bool:
    """The Origin a browser sends with a POST is the page's own: its scheme, host and port as the
    browser reached us (through `ssh -L`, a port of the laptop's)."""
    origin, host = request.headers.get("origin"), request.headers.get("host")
    site = request.headers.get("sec-fetch-site")
    return bool(origin and host) and origin == f"http://{host}" and site in (None, "same-origin")


def build(sp: Spool, port: int, read_only: bool = False) -> Asgi:
    ring = Ring()  # the GPUs over the last minutes, from the looks of this server
    # A first look before serving: the modules a look imports and the finished index it brings up
    # to date are then ready for the first page, not paid for by it.
    data.queue(sp, ring)
    files = {name: Path(STATIC, name).read_text(encoding="utf-8") for name in (*ASSETS, *PAGES)}

    def page(name: str) -> Callable[[Request], Response]:
        """A page holds no data (it is served unsigned): its script asks the API for all it shows."""
        return lambda _request: Response(files[name], media_type="text/html; charset=utf-8")

    def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return PlainTextResponse("not found\n", status_code=404)
        return Response(files[name], media_type=ASSETS[name])

    def api_queue(request: Request) -> Response:
        return JSONResponse(utf8(data.queue(sp, ring, _page(request))))

    def api_job(request: Request) -> Response:
        return _or_error(lambda: {**data.job(sp, request.path_params["id"]), "read_only": read_only})

    def api_log(request: Request) -> Response:
        given = request.query_params.get("offset")
        offset = _count(given) if given else None
        return _or_error(lambda: data.log(sp, request.path_params["id"], offset))

    def api_act(request: Request) -> Response:
        if read_only:
            return JSONResponse({"error": "this page is read-only (gpuq web --read-only)"}, 403)
        if not same_origin(request):
            return JSONResponse({"error": "refused: the request did not come from this page"}, 403)
        name = request.path_params["action"]
        if name not in data.ACTIONS:
            return JSONResponse({"error": f"no such action: {name}"}, 404)
        return _or_error(lambda: {"said": data.act(sp, name, request.path_params["id"])})

    routes = [
        Route("/", page("index.html")),
        Route("/job/{id:int}", page("job.html")),
        Route("/static/{name}", asset),
        Route("/api/queue", api_queue),
        Route("/api/job/{id:int}", api_job),
        Route("/api/job/{id:int}/log", api_log),
        Route("/api/job/{id:int}/{action}", api_act, methods=["POST"]),
    ]
    return TokenGate(Starlette(routes=routes), sp.web_token.follow(), port)


def _page(request: Request) -> int:
    return _count(request.query_params.get("page", "")) or 0


def _count(given: str) -> Optional[int]:
    """A whole number from a query (ASCII digits, at most 18: a file offset or a page fits), or None."""
    return int(given) if given.isascii() and given.isdigit() and len(given) <= 18 else None


def _or_error(make: Callable[[], Any]) -> Response:
    """A refusal is the CLI's one line: 404 no such job, 409 not in that state, 400 a bad request."""
    try:
        return JSONResponse(utf8(make()))  # an undecodable byte of an argument or path as \udcXX
    except UsageError as exc:
        return JSONResponse({"error": utf8(str(exc))}, 400)
    except GpuqError as exc:
        text = utf8(str(exc))
        return JSONResponse({"error": text}, 404 if text.startswith("no such job") else 409)
