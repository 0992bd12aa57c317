"""The `gpuq` command line: parse, call the library, print. Nothing here touches spool files.

`gpuq add` and `gpuq status` are typed many times a day, so this module imports only what they
need; the worker (watchdog) and psutil are imported inside the commands that use them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from gpuq import __version__, enqueue, jobs, queue, render, security
from gpuq.spool import Spool, SpoolError, WorkerBusy

USAGE_ERROR = 2


class UsageError(Exception):
    """A bad command line: one line on stderr, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def _ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a job id: {text!r}") from None
    if not ids or any(i <= 0 for i in ids):
        raise argparse.ArgumentTypeError(f"not a job id: {text!r}")
    return ids


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _positive_id(text: str) -> int:
    return _ids(text)[0] if text.isdigit() else _ids(text)[0]


def build_parser() -> Parser:
    parser = Parser(
        prog="gpuq",
        description="A GPU job queue for one machine, kept in a spool directory "
        "($GPUQ_HOME, default ~/.gpuq). Jobs run one at a time per GPU.",
    )
    parser.add_argument("--version", action="version", version=f"gpuq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    for name in ("add", "enqueue"):
        p = sub.add_parser(
            name,
            help="queue SCRIPT [ARGS...] (options before SCRIPT are gpuq's)",
            description="Queue a job. Only options before SCRIPT belong to gpuq; SCRIPT and "
            "everything after it are passed to the job verbatim.",
        )
        p.add_argument("-d", "--dir", help="working directory (default: the current one)")
        p.add_argument("-p", "--python", help="interpreter for a .py SCRIPT (default: nearest .venv, then PATH)")
        p.add_argument("--name", help="job name (default: <dir name>/<script stem>)")
        p.add_argument(
            "--after",
            type=_ids,
            action="append",
            default=[],
            metavar="ID",
            help="start only after job ID finished successfully (repeatable, or ID,ID)",
        )
        p.add_argument(
            "--after-any",
            type=_ids,
            action="append",
            default=[],
            metavar="ID",
            help="start after job ID ended, whatever its result",
        )
        p.add_argument("--retries", type=int, default=0, metavar="N", help="run again up to N times if it fails")
        p.add_argument("--priority", type=int, default=0, metavar="N", help="higher starts first (default 0)")
        p.add_argument(
            "--urgent",
            action="store_true",
            help="start next; if no slot is free, preempt the lowest-priority running job and resume it after",
        )
        p.add_argument(
            "--preemptible",
            action="store_true",
            help="save a checkpoint when preempted (HF Trainer >= 5: adds --enable_jit_checkpoint true)",
        )
        p.add_argument("--ckpt-glob", metavar="GLOB", help="where its checkpoints are (default: HF checkpoint-N)")
        p.add_argument(
            "--resume-arg",
            metavar="TEMPLATE",
            help="how `gpuq resume` passes the checkpoint (default: '--resume_from_checkpoint {ckpt}')",
        )
        p.add_argument(
            "-e",
            "--env",
            type=_env_pair,
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="extra environment variable for the job (repeatable)",
        )
        p.add_argument("-q", "--quiet", action="store_true", help="print only the new job id")
        p.add_argument("script", metavar="SCRIPT", help="a .py file, or any command (bash, torchrun, ...)")
        p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to SCRIPT verbatim")
        p.set_defaults(func=cmd_add)

    p = sub.add_parser("run", help="start a worker", description="Run queued jobs, one at a time per slot.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--watch", action="store_true", help="stay up and wait for new jobs")
    mode.add_argument("--daemon", action="store_true", help="start a resident background worker and return")
    p.add_argument(
        "--gpus",
        metavar="LIST",
        help="one slot per listed GPU (e.g. 0,1); each job gets "
        "CUDA_VISIBLE_DEVICES. Workers with disjoint --gpus can share a spool",
    )
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("stop", help="stop the worker(s); jobs keep running unless --kill-jobs")
    p.add_argument("--kill-jobs", action="store_true", help="also kill every running job")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("status", help="show the queue")
    p.add_argument("-a", "--all", action="store_true", help="every finished job, not only the recent ones")
    p.add_argument("--json", action="store_true", help="machine-readable list of jobs")
    p.set_defaults(func=cmd_status)

    for name in ("log", "logs"):
        p = sub.add_parser(name, help="show a job's log")
        p.add_argument("id", type=_positive_id)
        p.add_argument("-n", "--lines", type=int, default=40, help="last N lines (default 40)")
        p.add_argument("-f", "--follow", action="store_true", help="keep printing while the job runs")
        p.set_defaults(func=cmd_log)

    p = sub.add_parser("show", help="everything about one job (JSON)")
    p.add_argument("id", type=_positive_id)
    p.set_defaults(func=cmd_show)

    simple: list[tuple[str, str, Callable[..., int]]] = [
        ("cancel", "cancel a job that is not running", cmd_cancel),
        ("kill", "stop a running job (SIGTERM to its process group, SIGKILL after a grace period)", cmd_kill),
        ("retry", "put a failed or cancelled job back in the queue", cmd_retry),
    ]
    for name, text, func in simple:
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("ids", type=_positive_id, nargs="+", metavar="ID")
        p.set_defaults(func=func)

    p = sub.add_parser("preempt", help="stop a running job so it can be resumed from its checkpoint")
    p.add_argument("id", type=_positive_id, metavar="ID")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds to wait for it (default 60)")
    p.add_argument("--force", action="store_true", help="SIGKILL whatever is left when the timeout is up")
    p.set_defaults(func=cmd_preempt)

    p = sub.add_parser("resume", help="queue a preempted job again, from its newest complete checkpoint")
    p.add_argument("id", type=_positive_id, metavar="ID")
    p.add_argument("--require-checkpoint", action="store_true", help="refuse when no checkpoint is found")
    p.add_argument("--back", action="store_true", help="queue it in normal order instead of first in line")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("clear", help="remove finished jobs (keeps preempted and interrupted ones)")
    p.set_defaults(func=cmd_clear)

    p = sub.add_parser("recover", help="put interrupted jobs back in the queue")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="recover every interrupted job")
    which.add_argument("--jobs", type=_positive_id, nargs="+", metavar="ID", help="recover these jobs")
    p.set_defaults(func=cmd_recover)

    p = sub.add_parser(
        "adopt",
        help="track a process started outside gpuq as a running job",
        description="Take a running process of yours into the queue: nothing else starts while it runs, and "
        "jobs can wait for it (--after). Its exit code cannot be known: when it ends it is recorded as done "
        "with exit_code null, so `--after` on it starts whatever its result.",
    )
    p.add_argument("pid", type=_pid, metavar="PID")
    p.add_argument("--name", help="job name (default: <cwd name>/<script stem>)")
    p.add_argument("--log", metavar="FILE", help="the log file the process writes (for progress and ETA)")
    p.set_defaults(func=cmd_adopt)

    p = sub.add_parser("eta", help="progress and expected end of running jobs, expected start of pending ones")
    p.add_argument("id", type=_positive_id, nargs="?", help="one job (default: every running and pending job)")
    p.set_defaults(func=cmd_eta)

    p = sub.add_parser("demo", help="queue and run a small example chain in a throw-away spool (no GPU needed)")
    p.set_defaults(func=cmd_demo)
    return parser


def split_add_argv(parser: Parser, argv: list[str]) -> tuple[list[str], list[str]]:
    """Split `add` arguments at SCRIPT: gpuq's options before it, the job's words from it on."""
    add = parser._subparsers._group_actions[0].choices["add"]  # type: ignore[union-attr]
    takes_value = {s for a in add._actions if a.nargs != 0 for s in a.option_strings}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[:i], argv[i + 1 :]
        if word in takes_value:
            i += 2
        elif word.startswith("-") and word != "-":
            i += 1
        else:
            return argv[:i], argv[i:]
    return argv, []


def parse(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    if argv and argv[0] in ("add", "enqueue"):
        own, job_words = split_add_argv(parser, argv[1:])
        args = parser.parse_args([argv[0], *own, "--", "_"]) if job_words else parser.parse_args(argv)
        if job_words:
            args.script, args.args = job_words[0], job_words[1:]
        return args
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        raise SystemExit(USAGE_ERROR)
    return args


def spool() -> Spool:
    return Spool().ensure()


# ---- commands ---------------------------------------------------------------------------------
def cmd_add(args: argparse.Namespace) -> int:
    user_umask = jobs.current_umask()  # before Spool.ensure() sets gpuq's own 077
    cwd = Path(args.dir).expanduser().absolute() if args.dir else Path.cwd()
    if not cwd.is_dir():
        raise UsageError(f"gpuq add: directory not found: {cwd}")
    if args.retries < 0:
        raise UsageError("gpuq add: --retries must be 0 or more")
    if args.name is not None:
        try:
            jobs.check_name(args.name)
        except jobs.InvalidJob as exc:
            raise UsageError(f"gpuq add: --name: {exc}") from None
    try:
        cmd, venv = enqueue.resolve_command(args.script, args.args, cwd, args.python)
        cmd, options = _preempt_options(args, cmd, venv)  # before env is read: it may add to it
        ref, job = enqueue.enqueue(
            spool(),
            cmd=cmd,
            cwd=cwd,
            name=args.name,
            venv=venv,
            env=dict(args.env),
            shell_env=dict(os.environ),
            after=[i for ids in args.after for i in ids],
            after_any=[i for ids in args.after_any for i in ids],
            retries=args.retries,
            priority=args.priority,
            options=options,
            umask=user_umask,
        )
    except enqueue.EnqueueError as exc:
        raise UsageError(f"gpuq add: {exc}") from None
    if args.quiet:
        print(job["id"])
        return 0
    deps = job["after"] + job["after_any"]
    print(f"[+] Job #{job['id']}: {job['name']}" + (f"  after {', '.join(f'#{d}' for d in deps)}" if deps else ""))
    return 0


def _preempt_options(args: argparse.Namespace, cmd: list[str], venv: Optional[str]) -> tuple[list[str], dict[str, Any]]:
    """The command and job fields for --urgent/--preemptible/--ckpt-glob/--resume-arg
    (--preemptible may add a flag to the command and GPUQ_PREEMPTIBLE=1 to args.env)."""
    options: dict[str, Any] = {"urgent": args.urgent, "preemptible": args.preemptible, "ckpt_glob": args.ckpt_glob}
    if args.resume_arg is not None:
        from gpuq.preempt import check_resume_arg

        problem = check_resume_arg(args.resume_arg)
        if problem:
            raise UsageError(f"gpuq add: {problem}")
        options["resume_arg"] = args.resume_arg
    if args.preemptible:
        from gpuq.preempt import PREEMPTIBLE_ENV, make_preemptible

        cmd, message = make_preemptible(cmd, venv)
        args.env.append((PREEMPTIBLE_ENV, "1"))
        if not args.quiet:
            print(f"preemptible: {message}")
    return cmd, options


def cmd_run(args: argparse.Namespace) -> int:
    from gpuq import daemon

    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()] if args.gpus else None
    if args.gpus is not None and not gpus:
        raise UsageError("gpuq run: --gpus needs a list such as 0 or 0,1")
    if args.daemon:
        return daemon.start_background(spool(), gpus)
    return daemon.run_foreground(spool(), gpus, watch=args.watch, ready_fd=args.ready_fd)


def cmd_stop(args: argparse.Namespace) -> int:
    sp = spool()
    stopped = queue.stop_workers(sp)
    print(f"stopped worker(s): {', '.join(str(w.get('pid')) for w in stopped)}" if stopped else "no worker was running")
    running = queue.running_jobs(sp)
    if args.kill_jobs:
        for job in running:
            queue.kill(sp, job["id"])
            print(f"killed job #{job['id']} {job['name']}")
    elif running:
        names = ", ".join(f"#{j['id']} {j['name']}" for j in running)
        print(
            f"jobs keep running: {names} (their supervisors record how they end). "
            "`gpuq stop --kill-jobs` stops them too."
        )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    st = queue.status(spool(), show_all=args.all, summarize=None if args.json else render.finished_cells)
    if args.json:
        print(json.dumps([_json_row(r) for r in st.rows], indent=2))
        return 0
    pending = sum(1 for r in st.rows if r.state == "pending")
    print(render.worker_line(st.workers, pending))
    if st.rows:
        print("\n".join(render.status_table(st.rows)))
    else:
        print("no jobs")
    if st.hidden_finished:
        print(f"({st.hidden_finished} older finished job(s) hidden; `gpuq status -a` shows all)")
    for name in st.dropped:
        print(f"pending/{security.display(name)}: dropped file, not taken in yet (a worker takes it in)")
    return 0


def _json_row(row: queue.Row) -> dict[str, Any]:
    job = row.job
    out = {
        key: job.get(key)
        for key in (
            "id",
            "name",
            "pid",
            "exit_code",
            "after",
            "after_any",
            "cmd",
            "cwd",
            "created_at",
            "started_at",
            "finished_at",
            "attempts",
            "retries",
            "priority",
            "slot",
            "log",
            "note",
            "urgent",
            "preemptible",
            "checkpoint",
            "resumed_from",
            "resumed_from_step",
            "preemptions",
        )
    }
    out["state"] = row.state
    out["waiting"] = row.wait.reason if row.wait else None
    est = row.estimate
    out["progress"] = round(est.fraction, 4) if est and est.fraction is not None else None
    out["eta_seconds"] = round(est.eta_seconds, 1) if est and est.eta_seconds is not None else None
    out["starts_in_seconds"] = round(est.starts_in, 1) if est and est.starts_in is not None else None
    out["eta_method"] = est.method if est else None
    out["progress_source"] = est.reading.source if est and est.reading else None
    out["adopted"] = bool(job.get("adopted"))
    return out


def _pid(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return int(text)


def cmd_adopt(args: argparse.Namespace) -> int:
    from gpuq import adopt

    try:
        ref, job = adopt.adopt(spool(), args.pid, name=args.name, log=args.log)
    except adopt.AdoptError as exc:
        print(f"gpuq adopt: {exc}", file=sys.stderr)
        return 1
    print(f"[+] Job #{job['id']}: {job['name']} adopted (pid {job['pid']}, started {job['started_at']})")
    print(f"    log: {job['log']}" if job["log"] else "    no log: progress only from checkpoints (use --log FILE)")
    return 0


def cmd_eta(args: argparse.Namespace) -> int:
    sp = spool()
    if args.id is not None:
        queue.get(sp, args.id)  # "no such job #N" as a one-line error
    rows = [r for r in queue.status(sp).rows if r.estimate is not None]  # running and pending rows
    if args.id is not None:
        rows = [r for r in rows if r.job["id"] == args.id]
        if not rows:
            state = queue.get(sp, args.id)[0].state
            print(f"#{args.id}: {state}; an ETA is given for running and pending jobs only")
            return 0
    if not rows:
        print("no running or pending jobs")
    for line in render.eta_lines(rows):
        print(line)
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    sp = spool()
    ref, job = queue.get(sp, args.id)
    path = sp.log_path(args.id)
    for line in render.tail_lines(path, args.lines):
        print(line)
    if args.follow:
        from gpuq.follow import follow

        follow(sp, args.id, path)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    ref, job = queue.get(spool(), args.id)
    print(json.dumps(dict(job, state=ref.state, file=ref.name), indent=2, ensure_ascii=False))
    return 0


def cmd_preempt(args: argparse.Namespace) -> int:
    from gpuq import preempt

    if args.timeout < 0:
        raise UsageError("gpuq preempt: --timeout must be 0 or more")
    outcome = preempt.preempt(spool(), args.id, args.timeout, args.force, say=print)
    job = outcome.job
    if outcome.state == "preempted":
        print(f"[~] Job #{job['id']}: {job['name']} preempted (exit {job.get('exit_code')}): {job.get('note')}")
        print(f"    `gpuq resume {job['id']}` continues it")
        return 0
    if outcome.left and outcome.state == "running" and job.get("pid") in outcome.left:
        print(f"job #{job['id']} did not exit within {args.timeout:g}s; left running, unchanged (--force kills it)")
    elif outcome.left:
        print(
            f"job #{job['id']}: its main process exited but {', '.join(map(str, outcome.left))} ignore SIGTERM; "
            f"it keeps its slot until they are gone (`gpuq preempt {job['id']} --force` kills them)"
        )
    else:
        print(f"job #{job['id']} ended on its own meanwhile: {outcome.state}")
    return 1


def cmd_resume(args: argparse.Namespace) -> int:
    from gpuq import preempt

    resumed = preempt.resume(spool(), args.id, args.require_checkpoint, front=not args.back)
    job = resumed.job
    if resumed.checkpoint is None:
        print(f"no checkpoint found for job #{job['id']}: {job.get('note')}")
    where = "in normal order" if args.back else "first in line"
    print(f"[+] Job #{job['id']}: {job['name']} back in the queue ({where}): {job.get('note')}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    for job_id in args.ids:
        job = queue.cancel(spool(), job_id)
        print(f"[-] Job #{job_id}: {job['name']} cancelled")
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    for job_id in args.ids:
        print(f"sending SIGTERM to job #{job_id}'s process group (SIGKILL after {queue.KILL_GRACE_SECONDS:.0f}s)...")
        job = queue.kill(spool(), job_id)
        print(f"[-] Job #{job_id}: {job['name']} killed (exit {job.get('exit_code')})")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    for job_id in args.ids:
        job = queue.retry(spool(), job_id)
        print(f"[+] Job #{job_id}: {job['name']} back in the queue")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    report = queue.clear(spool())
    print(f"removed {len(report.removed)} finished job(s)")
    if report.kept_for_dependents:
        print("kept (waiting jobs depend on them): " + ", ".join(f"#{i}" for i in sorted(report.kept_for_dependents)))
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    sp = spool()
    if args.all or args.jobs:
        jobs_back = queue.recover(sp, None if args.all else args.jobs)
        print(f"Re-queued {len(jobs_back)} job(s)." + (" Run `gpuq run` to execute." if jobs_back else ""))
        return 0
    found = queue.interrupted(sp)
    if not found:
        print("no interrupted jobs")
        return 0
    for job in found:
        print(f"  #{job['id']} {job['name']}: {job.get('note') or 'interrupted'}")
    if not sys.stdin.isatty():
        print(f"would re-queue {len(found)} job(s); run `gpuq recover --all` (or --jobs ID...) to do it")
        return 0
    if input(f"Re-queue these {len(found)} job(s)? [y/N] ").strip().lower() in ("y", "yes"):
        print(f"Re-queued {len(queue.recover(sp, [j['id'] for j in found]))} job(s).")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gpuq.demo import run_demo

    return run_demo()


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse(argv)
        return args.func(args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return USAGE_ERROR
    except WorkerBusy as exc:
        print(f"gpuq: {exc}; stop it with `gpuq stop`, or give each worker its own --gpus", file=sys.stderr)
        return 1
    except (queue.QueueError, SpoolError) as exc:
        print(f"gpuq: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gpuq: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
