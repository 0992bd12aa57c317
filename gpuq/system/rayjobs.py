"""The Ray client: Ray's Jobs REST API (`/api/jobs/`) and state API (`/api/v0/nodes`) over urllib,
so gpuq needs no Ray package. The address is the dashboard's URL (`http://HEAD:8265`), as
`ray job submit --address` and `RAY_ADDRESS` take it. Job states: PENDING, RUNNING, STOPPED (by a
user), SUCCEEDED, FAILED; an ended job carries `driver_exit_code` and a `message`."""

from __future__ import annotations

import json
import os
import socket
import urllib.parse
from typing import Any, Mapping, NamedTuple, Optional

from gpuq.core.errors import GpuqError, UsageError

TIMEOUT = 15.0  # seconds per request
FINAL_STATES = frozenset(("STOPPED", "SUCCEEDED", "FAILED"))
ADDRESS_VARIABLE = "RAY_ADDRESS"


class RayError(GpuqError):
    """Ray could not be asked, or refused."""


class RayUnreachable(RayError):
    """No answer from the address: nothing was done there."""


class RayNoAnswer(RayError):
    """A request sent got no answer within TIMEOUT, or none that reads as HTTP: what it asked for
    may or may not have been done."""


class RayJob(NamedTuple):
    submission_id: str
    state: str
    message: Optional[str] = None
    exit_code: Optional[int] = None
    start: Optional[float] = None  # seconds since the epoch
    end: Optional[float] = None
    node_id: Optional[str] = None
    error_type: Optional[str] = None  # JOB_ENTRYPOINT_COMMAND_ERROR: the command's own exit code; else Ray's

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES


class Node(NamedTuple):
    node_id: str
    ip: str
    alive: bool
    head: bool
    total: dict[str, float]  # Ray's resource names: CPU, GPU, memory (bytes), ...


def address(given: Optional[str], env: Optional[Mapping[str, str]] = None) -> str:
    """The dashboard URL: `--address`, else RAY_ADDRESS; a bare host:port gets http://."""
    value = given or (os.environ if env is None else env).get(ADDRESS_VARIABLE) or ""
    if not value:
        raise UsageError("no Ray cluster named: give --address http://HEAD:8265 or set RAY_ADDRESS")
    if value.startswith("ray://"):
        raise UsageError(f"{value} is a Ray Client address; gpuq needs the dashboard's: http://HEAD:8265")
    if "://" not in value:
        value = "http://" + value
    if not value.startswith(("http://", "https://")):
        raise UsageError(f"not an HTTP address: {value}")
    parts = urllib.parse.urlsplit(value)
    try:
        parts.port  # noqa: B018  (http.client refuses it only once a request is made: no cluster's fault)
    except ValueError:
        raise UsageError(f"not a port: {parts.netloc.rpartition(':')[2]} (in {value})") from None
    return value.rstrip("/")


def _call(url: str, method: str = "GET", body: Optional[dict] = None) -> Any:
    import urllib.request  # with http.client, email and ssl: only when Ray is asked (it brings urllib.error)

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            text = answer.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        raise RayError(f"Ray answered {exc.code} to {method} {url}: {_detail(exc)}") from None
    except (urllib.error.URLError, TimeoutError, socket.timeout) as exc:  # socket.timeout: 3.9's TimeoutError
        why = getattr(exc, "reason", exc)
        if isinstance(why, (TimeoutError, socket.timeout)):  # sent, unanswered in time
            raise RayNoAnswer(f"Ray did not answer {method} {url} within {TIMEOUT:.0f}s") from None
        # urllib wraps in URLError only what connecting and sending raise (refused, no such name):
        raise RayUnreachable(f"no Ray cluster answers at {url.split('/api/')[0]}: {why}") from None
    except Exception as exc:  # sent, unread: a close without a reply (RemoteDisconnected, a reset), a garbage
        # status line, a body cut short; what it asked may have been done
        raise RayNoAnswer(f"no usable answer from Ray to {method} {url}: {exc!r:.200}") from None
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        raise RayError(f"Ray's answer to {method} {url} is not JSON: {text[:200]!r}") from None


def _detail(exc: Any) -> str:
    """The last line of an error reply's body, else its reason: a body that stalls or breaks off
    (a timeout, http.client's IncompleteRead) leaves the status line to say it."""
    try:
        lines = exc.read().decode("utf-8", "replace").strip().splitlines()
    except Exception:  # see above: an OSError or an HTTPException, neither of which the caller wants
        lines = []
    return lines[-1] if lines else str(exc.reason)


def submit(
    base: str,
    entrypoint: str,
    submission_id: str,
    *,
    gpus: float,
    cpus: float,
    memory: int,
    env: dict[str, str],
    metadata: dict[str, str],
    resources: Optional[dict[str, float]] = None,
) -> str:
    body: dict[str, Any] = {
        "entrypoint": entrypoint,
        "submission_id": submission_id,
        "runtime_env": {"env_vars": env},
        "metadata": metadata,
        "entrypoint_num_gpus": gpus,
        "entrypoint_num_cpus": cpus,
    }
    if memory:
        body["entrypoint_memory"] = memory
    if resources:  # e.g. a node's `accelerator_type:A100`, as Ray's own `accelerator_type=` asks it
        body["entrypoint_resources"] = resources
    answer = _call(f"{base}/api/jobs/", "POST", body)
    return str((answer or {}).get("submission_id") or submission_id)


def _seconds(ms: Any) -> Optional[float]:
    return ms / 1000.0 if isinstance(ms, (int, float)) and ms > 0 else None


def get(base: str, submission_id: str) -> Optional[RayJob]:
    """The job as Ray says it is; None when Ray knows no job of that id."""
    try:
        data = _call(f"{base}/api/jobs/{submission_id}")
    except RayError as exc:
        if " 404 " in str(exc) or "does not exist" in str(exc):
            return None
        raise
    code = data.get("driver_exit_code")
    return RayJob(
        submission_id,
        str(data.get("status")),
        data.get("message"),
        code if isinstance(code, int) else None,
        _seconds(data.get("start_time")),
        _seconds(data.get("end_time")),
        data.get("driver_node_id"),
        data.get("error_type"),
    )


def logs(base: str, submission_id: str) -> str:
    return str((_call(f"{base}/api/jobs/{submission_id}/logs") or {}).get("logs") or "")


def stop(base: str, submission_id: str) -> bool:
    """Ask Ray to stop the job (SIGTERM, then SIGKILL after Ray's grace); False if it had ended."""
    return bool((_call(f"{base}/api/jobs/{submission_id}/stop", "POST", {}) or {}).get("stopped"))


def nodes(base: str) -> list[Node]:
    """The cluster's nodes with their total resources (Ray's state API)."""
    data = _call(f"{base}/api/v0/nodes?limit=1000&detail=1")
    rows = (((data or {}).get("data") or {}).get("result") or {}).get("result") or []
    return [
        Node(
            str(row.get("node_id")),
            str(row.get("node_ip")),
            row.get("state") == "ALIVE",
            bool(row.get("is_head_node")),
            {str(k): float(v) for k, v in (row.get("resources_total") or {}).items()},
        )
        for row in rows
    ]


def gpu_memory(base: str) -> dict[str, list[int]]:
    """Each live node's GPUs' memory in MiB, by node id, as the dashboard's agents read it with NVML
    (the dashboard's node summary: no stable API, so anything unexpected reads as none). GPUs a
    node only declares (`ray start --num-gpus`) are not there."""
    data = _call(f"{base}/nodes?view=summary")
    rows = ((data or {}).get("data") or {}).get("summary") or []
    found: dict[str, list[int]] = {}
    for row in rows if isinstance(rows, list) else []:
        node = (row.get("raylet") or {}) if isinstance(row, dict) else {}
        told = [g.get("memoryTotal", g.get("memory_total")) for g in row.get("gpus") or [] if isinstance(g, dict)]
        sizes = [int(s) for s in told if isinstance(s, (int, float)) and s > 0]
        if node.get("nodeId") and node.get("state", "ALIVE") == "ALIVE" and sizes:
            found[str(node["nodeId"])] = sizes
    return found
