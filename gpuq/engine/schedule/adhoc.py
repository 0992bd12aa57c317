"""`gpuq lease -- CMD`: a command outside the queue run under GPU leases that every user's gpuq
honours, held by this process (the lease's pid, so the command's processes are its tree) until the
command ends; the command holds the leases' locks too, so a SIGKILLed `gpuq lease` leaves them alive
while its command runs. SIGINT is forwarded only when stdin is not a terminal: there Ctrl-C reaches the command
directly (twice would read to Jupyter as "shut down now").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from gpuq.core.errors import GpuqError, Refused, UsageError
from gpuq.core.words import cap_text
from gpuq.engine.schedule import turns
from gpuq.engine.schedule.leasing import Claim, claim_gpus, record_usage
from gpuq.engine.schedule.placement import Blocked, Placement, Request
from gpuq.spool import Spool
from gpuq.system import policy as machine_policy
from gpuq.system.gpus import GpuLook
from gpuq.system.lease_io import user_name
from gpuq.system.leases import HeldTicket, Lease, LeaseDir, LeaseDirProblem, say_once, spool_ids

POLL_SECONDS = 0.5  # how often a waiting `gpuq lease` asks again: a claim is a look and a few files


class NotFree(GpuqError):
    """--no-wait and the GPUs are taken."""

    exit_code = 75  # sysexits.h's EX_TEMPFAIL: "try again later"


def lease_and_run(cmd: list[str], request: Request, *, wait: bool = True) -> int:
    """Run `cmd` under leases of the GPUs `request` asks for; its exit code (128 + N for signal N)."""
    program = _program(cmd[0])
    claim = _claim(request, os.path.basename(cmd[0]), wait)
    try:
        env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=",".join(map(str, claim.gpus)))
        return _run([program, *cmd[1:]], env, [held.fd for held in claim if held.fd is not None])
    finally:
        record_usage(claim, _stderr)
        claim.release()


def _claim(request: Request, name: str, wait: bool) -> Claim:
    """The leases, once free GPUs are this user's to take: within their cap, and no other user's
    turn first (turns.py, as for a worker's jobs). While it waits for others it holds a ticket, so
    that their workers give it its turn."""
    told, ticket = False, None
    rules = machine_policy.load(lambda line: say_once(line, _stderr))
    cap = rules.of(user_name(os.geteuid())).max_gpus
    if cap is not None and request.gpus > cap:  # whatever ends, never within the cap
        raise _refusal(Blocked(cap_text(cap, request.gpus), forever=True))
    admission = _Admission()
    here = Spool()  # $GPUQ_HOME: its jobs are "your job #N", another queue's say so
    try:
        while True:
            admission.capped = False
            mine = spool_ids(here.home, here.lease_id.read())  # read again: its first lease makes it
            got = claim_gpus(request, job=None, name=name, spool=None, mine=mine, log=_stderr, admit=admission)
            if not isinstance(got, Blocked):
                if told:
                    _stderr(f"GPU {','.join(map(str, got.gpus))} leased; starting {name}")
                return got
            if got.forever or not wait:
                raise _refusal(got)
            if not told:
                _stderr(f"{got.reason} (Ctrl-C to give up)")
                told = True
            if ticket is None and not admission.capped:
                ticket = _post_ticket(request)
            time.sleep(POLL_SECONDS)
    finally:
        if ticket is not None:
            ticket.release()


class _Admission:
    """`claim_gpus`'s last word for `gpuq lease`: this user's cap and the other users' turns."""

    def __init__(self) -> None:
        self.capped = False
        self.patience = turns.Patience()  # kept while it waits: a turn not taken is passed over

    def __call__(self, decision: Placement, seen: GpuLook, live: Sequence[Lease], directory: LeaseDir) -> Any:
        rules = machine_policy.load(lambda line: say_once(line, _stderr))
        me = os.geteuid()
        held = frozenset(lease.gpu_uuid for lease in live if lease.uid == me)
        uuid_of = {gpu.index: gpu.uuid for gpu in seen.gpus}
        cap = rules.of(user_name(me)).max_gpus
        tickets = directory.tickets()
        self.patience.look(tickets, (lease.gpu_uuid for lease in live), time.monotonic(), uuid_of.values())
        why = turns.held_back(decision.gpus, uuid_of, tickets, directory, rules, cap, held, self.patience)
        if why is None:
            return None
        self.capped = why.capped
        return Blocked(why.reason, why.forever)


def _post_ticket(request: Request) -> Optional[HeldTicket]:
    try:
        return LeaseDir.open().post_ticket(
            job=None, spool=None, gpus=request.gpus, mem_mib=request.gpu_mem_mib, gpu_uuids=None
        )
    except LeaseDirProblem as exc:
        say_once(str(exc), _stderr)
        return None


def _refusal(blocked: Blocked) -> GpuqError:
    would = blocked.reason.replace("waiting for", "it would wait for", 1)
    exc: GpuqError = NotFree(f"not started (--no-wait): {would}")
    if blocked.forever:  # a request that could never be met here: exit 2, as `add --gpus` more than there are
        exc = UsageError(blocked.reason.replace("this worker has", "this machine has"))
    exc.prefix = "gpuq lease"
    return exc


def _program(word: str) -> str:
    """The command's program as the shell would find it, checked before any wait for a GPU."""
    found = shutil.which(word) if os.sep not in word else word
    if found is None or not os.path.exists(found):
        raise _cannot(word, "no such program" + ("" if os.sep in word else " on PATH"), 127)
    if os.path.isdir(found):
        raise _cannot(word, "is a directory", 126)
    if not os.access(found, os.X_OK):
        raise _cannot(word, "permission denied (not executable)", 126)
    return word


def _cannot(word: str, why: str, code: int) -> GpuqError:
    """The exit codes a shell gives: 127 for a program not found, 126 for one found that cannot run."""
    exc = Refused(f"cannot run {word}: {why}")
    exc.prefix, exc.exit_code = "gpuq lease", code
    return exc


def _run(argv: list[str], env: dict[str, str], locks: Sequence[int]) -> int:
    """The command's exit status, signals forwarded to it (one that comes before it exists, once it does).
    It inherits the leases' locks, so that they outlive this process while it runs (lease_layout.md)."""
    interactive = sys.stdin is not None and sys.stdin.isatty()
    forwarded = (signal.SIGTERM, signal.SIGHUP) + (() if interactive else (signal.SIGINT,))
    child: list[subprocess.Popen] = []
    early: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        if not child:
            early.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            child[0].send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in forwarded}
    if interactive:  # a handler, not SIG_IGN: an ignored SIGINT would be inherited by the command
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, lambda _signum, _frame: None)
    try:
        try:
            child.append(subprocess.Popen(argv, env=env, pass_fds=locks))
        except OSError as exc:  # found, yet it does not start (no #! line, not a binary of this machine)
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            raise _cannot(argv[0], exc.strerror or str(exc), code) from None
        for signum in early:
            child[0].send_signal(signum)
        code = child[0].wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - code if code < 0 else code


def _stderr(line: str) -> None:
    sys.stderr.write(f"gpuq lease: {line}\n")
    sys.stderr.flush()
