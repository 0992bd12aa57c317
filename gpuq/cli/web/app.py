"""The ASGI application of `gpuq web` (Starlette): the pages, the JSON they poll, the actions.
Anyone on the machine can reach loopback, so every request needs the token (in the URL once, then
in an HttpOnly, SameSite=Strict cookie), else 403; a changing request is a POST whose Origin must
be the page's own, so another site open in the same browser cannot act through it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from gpuq.cli.top.model import Ring
from gpuq.cli.web import data
from gpuq.core.errors import GpuqError, UsageError
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
COOKIE_SECONDS = 30 * 24 * 3600
FORBIDDEN = "403 forbidden: open the URL `gpuq web` printed (it carries the token)\n"

Asgi = Callable[[Any, Any, Any], Awaitable[None]]  # an ASGI application: (scope, receive, send)


def cookie_name(token: str) -> str:
    """Named after the token, so two users' servers on one host (cookies ignore the port) never
    overwrite each other's."""
    return "gpuq-" + hashlib.sha256(token.encode()).hexdigest()[:12]


def _embedded(value: Any) -> str:
    """JSON inside a <script type="application/json">: no `<` can close the element."""
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


class TokenGate:
    """Every request: the token from the cookie, or from `?token=` once (answered with the cookie
    and a redirect to the same address without it, so it leaves the address bar and history)."""

    def __init__(self, app: Asgi, token: Callable[[], Optional[str]]) -> None:
        self.app, self.token = app, token  # the token now (the file's: `--new-token` revokes the old one)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request, token = Request(scope), self.token()

        def valid(given: Optional[str]) -> bool:
            return None not in (given, token) and hmac.compare_digest(str(given).encode(), str(token).encode())

        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = dict(query).get("token")
        if token is not None and valid(given) and request.method == "GET":
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            here = "/" + scope["path"].lstrip("/")  # never `//host`: a redirect elsewhere
            response: Response = RedirectResponse(here + (f"?{rest}" if rest else ""), status_code=303)
            # kept 30 days: a phone's browser that closes keeps the page's key (the token outlives restarts too)
            response.set_cookie(
                cookie_name(token), token, max_age=COOKIE_SECONDS, httponly=True, samesite="strict", path="/"
            )
        elif token is not None and valid(request.cookies.get(cookie_name(token))):
            await self.app(scope, receive, send)
            return
        else:
            response = PlainTextResponse(FORBIDDEN, status_code=403)
        response.headers.update(SECURITY_HEADERS)
        await response(scope, receive, send)


def same_origin(request: Request) -> bool:
    """The Origin a browser sends with a POST is the page's own: its scheme, host and port as the
    browser reached us (through `ssh -L`, a port of the laptop's)."""
    origin, host = request.headers.get("origin"), request.headers.get("host")
    site = request.headers.get("sec-fetch-site")
    return bool(origin and host) and origin == f"http://{host}" and site in (None, "same-origin")


def build(sp: Spool, read_only: bool = False) -> Asgi:
    ring = Ring()  # the GPUs over the last minutes, from the looks of this server
    # A first look before serving: the modules a look imports and the finished index it brings up
    # to date are then ready for the first page, not paid for by it.
    data.queue(sp, ring)
    files = {name: Path(STATIC, name).read_text(encoding="utf-8") for name in (*ASSETS, *PAGES)}

    def page(name: str, initial: dict[str, Any]) -> Response:
        initial["read_only"] = read_only
        body = files[name].replace("{{initial}}", _embedded(initial))
        return Response(body, media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)

    def answer(value: Any, code: int = 200) -> Response:
        return JSONResponse(value, status_code=code, headers=SECURITY_HEADERS)

    def index(request: Request) -> Response:
        return page("index.html", {"queue": data.queue(sp, ring, _page(request))})

    def job_page(request: Request) -> Response:
        job_id = request.path_params["id"]
        try:
            return page("job.html", {"job": data.job(sp, job_id), "log": data.log(sp, job_id, None)})
        except GpuqError as exc:
            return PlainTextResponse(f"{exc}\n", status_code=404, headers=SECURITY_HEADERS)

    def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return PlainTextResponse("not found\n", status_code=404, headers=SECURITY_HEADERS)
        return Response(files[name], media_type=ASSETS[name], headers=SECURITY_HEADERS)

    def api_queue(request: Request) -> Response:
        return answer(data.queue(sp, ring, _page(request)))

    def api_job(request: Request) -> Response:
        return _or_error(lambda: data.job(sp, request.path_params["id"]), answer)

    def api_log(request: Request) -> Response:
        given = request.query_params.get("offset")
        offset = _count(given) if given else None
        return _or_error(lambda: data.log(sp, request.path_params["id"], offset), answer)

    def api_act(request: Request) -> Response:
        if read_only:
            return answer({"error": "this page is read-only (gpuq web --read-only)"}, 403)
        if not same_origin(request):
            return answer({"error": "refused: the request did not come from this page"}, 403)
        name = request.path_params["action"]
        if name not in data.ACTIONS:
            return answer({"error": f"no such action: {name}"}, 404)
        return _or_error(lambda: {"said": data.act(sp, name, request.path_params["id"])}, answer)

    routes = [
        Route("/", index),
        Route("/job/{id:int}", job_page),
        Route("/static/{name}", asset),
        Route("/api/queue", api_queue),
        Route("/api/job/{id:int}", api_job),
        Route("/api/job/{id:int}/log", api_log),
        Route("/api/job/{id:int}/{action}", api_act, methods=["POST"]),
    ]
    return TokenGate(Starlette(routes=routes), sp.web_token.follow())


def _page(request: Request) -> int:
    return _count(request.query_params.get("page", "")) or 0


def _count(given: str) -> Optional[int]:
    """A whole number from a query (ASCII digits, at most 18: a file offset or a page fits), or None."""
    return int(given) if given.isascii() and given.isdigit() and len(given) <= 18 else None


def _or_error(make: Callable[[], Any], answer: Callable[..., Response]) -> Response:
    """A refusal is the CLI's one line: 404 no such job, 409 not in that state, 400 a bad request."""
    try:
        return answer(make())
    except UsageError as exc:
        return answer({"error": str(exc)}, 400)
    except GpuqError as exc:
        text = str(exc)
        return answer({"error": text}, 404 if text.startswith("no such job") else 409)
