"""`gpuq web`: listen (127.0.0.1 unless told), print the URL with the token, serve until Ctrl-C.
Starlette and uvicorn are imported only here, once they are known to be installed."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
from importlib.util import find_spec
from typing import Any

from gpuq.cli.common import spool
from gpuq.cli.parser import said_by
from gpuq.core.errors import Refused
from gpuq.system.extras import install_command

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def listen(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise said_by("gpuq web", Refused(f"cannot listen on {host}: {exc.strerror}")) from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise said_by("gpuq web", Refused(f"cannot listen on {host}:{port}: {exc.strerror or exc}")) from None
    sock.set_inheritable(True)
    return sock


def url(sock: socket.socket, host: str, token: str) -> str:
    bound = sock.getsockname()
    shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{bound[1]}/#token={token}"  # a fragment: the browser sends it to no server


def cmd_web(args: argparse.Namespace) -> int:
    absent = [name for name in ("starlette", "uvicorn") if find_spec(name) is None]
    if absent:
        raise said_by("gpuq web", Refused(f"needs {' and '.join(absent)}, not installed: {install_command('web')}"))
    sp = spool()
    token = sp.web_token.get(new=args.new_token)
    sock = listen(args.host, args.port)
    if args.host not in LOOPBACK:
        print(
            f"gpuq web: listening on {args.host}: reachable from other machines, with the token as the only key "
            "and nothing encrypted; `ssh -L` to a loopback address is safer (and a browser signs the page's "
            "requests only there: by another name it is not a secure context)",
            file=sys.stderr,
        )
    import uvicorn  # the server: only now that it is known to be there (tens of ms)

    from gpuq.cli.web import app  # Starlette: with it

    # the queue read once: the first page is quick
    application = app.build(sp, sock.getsockname()[1], read_only=args.read_only)
    server = uvicorn.Server(uvicorn.Config(application, log_level="warning", access_log=False, lifespan="off"))

    def stop(_signum: int, _frame: Any) -> None:
        server.should_exit = True  # seen as soon as it serves; uvicorn's own handler takes over then

    for signum in (signal.SIGINT, signal.SIGTERM):  # a Ctrl-C right after the URL is a clean exit too
        signal.signal(signum, stop)
    print(url(sock, args.host, token), flush=True)  # once it can answer at once
    server.run(sockets=[sock])
    return 0
