"""The `gpuq` command line: the argument parser. Each command names its handler as
"module:function" in gpuq.cli, imported only when that command runs, so `gpuq status` does not pay
for the imports of `gpuq run`. For the same reason `parse` builds only the subparser of the command
typed (building all of them costs more than most commands' own work); `build_parser()` builds all.
"""

from __future__ import annotations

import argparse
import os
import sys

from gpuq import __version__
from gpuq.core.errors import UsageError

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Optional


class Formatter(argparse.HelpFormatter):
    """argparse's formatter, told the terminal's width so that it does not import shutil (and bz2,
    lzma with it) for each argument it checks while the parser is built."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: Any = None):
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


def _columns() -> int:
    """shutil.get_terminal_size().columns: $COLUMNS, else the terminal's, else 80."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        exc = UsageError(f"{message} (see `{self.prog} --help`)")
        exc.prefix = self.prog
        raise exc


def _ids(text: str) -> list[int]:
    """Job ids: `12`, `3,5`, ranges `12-17` (a whole sweep)."""
    from gpuq.core.sweep import parse_id_ranges

    try:
        return parse_id_ranges(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _job_ids(text: str) -> list[int]:
    """The job ids of a command that acts on several: as `_ids`, the flag's name left out."""
    from gpuq.core.sweep import parse_id_ranges

    try:
        return parse_id_ranges(text, "ID")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("ID: ", "", 1)) from None


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _pid(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"not a number of seconds from 0.1 to 3600: {text!r}")
    return value


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a number of GPUs: {text!r}")
    return int(text)


def _positive_id(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a job id: {text!r}")
    return int(text)


class _Skipped:
    """Stands for the subparser of a command that is not being built: takes every call, does nothing."""

    def __getattr__(self, _name: str) -> Any:
        return lambda *_args, **_kwargs: self


class _OnlyOne:
    """The subparsers action, building only the command `only` (None: every command). The command
    blocks of build_parser stay as they are: the others get a _Skipped."""

    def __init__(self, action: Any, only: Optional[str]):
        self.action, self.only = action, only

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if self.only is None or name == self.only:
            return self.action.add_parser(name, **kwargs)
        return _Skipped()


def build_parser(only: Optional[str] = None) -> Parser:
    """The parser of every command, or with `only` of that command alone."""
    parser = Parser(
        prog="gpuq",
        description="A GPU job queue for one machine, kept in a spool directory "
        "($GPUQ_HOME, default ~/.gpuq). Jobs run one at a time per GPU.",
    )
    parser.add_argument("--version", action="version", version=f"gpuq {__version__}")
    sub = _OnlyOne(parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser), only)

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
            help="start only after job ID finished successfully (repeatable, ID,ID, or a range 12-17)",
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
        p.add_argument(
            "--sweep",
            action="append",
            default=[],
            metavar="NAME=V1,V2",
            help="one job per value (repeat for a product of lists); {NAME} in the arguments takes the value",
        )
        p.add_argument("--yes", action="store_true", help="with --sweep: queue more than 1,000 jobs")
        p.add_argument("--hold", action="store_true", help="queue it held: it starts only after `gpuq release`")
        p.add_argument("--time", metavar="LIMIT", help="stop it once it has run this long (4h, 90m, 1:30:00)")
        p.add_argument("--begin", metavar="WHEN", help="start it no earlier than WHEN (02:00, +2h, an ISO time)")
        p.add_argument(
            "--snapshot",
            action="store_true",
            help="copy the git repository's tracked files (with uncommitted changes) now: the job runs this code",
        )
        p.add_argument(
            "--gpus",
            type=_count,
            default=1,
            metavar="N",
            help="how many GPUs it needs (default 1; 0: a CPU job, which runs beside GPU jobs)",
        )
        p.add_argument("--notify", action="store_true", help="a desktop notification when it ends (notify-send)")
        p.add_argument(
            "--max-log-size",
            metavar="SIZE",
            help="cap its log (e.g. 1G): keep its head and newest tail, cut the middle",
        )
        p.add_argument(
            "--on-finish",
            metavar="CMD",
            help="a shell command run when it ends, with GPUQ_JOB_ID, _NAME, _STATE, _EXIT_CODE, _LOG set",
        )
        p.add_argument(
            "--gpu-mem",
            metavar="SIZE",
            help="the GPU memory it needs (e.g. 20G): jobs that say so share a GPU while they fit",
        )
        p.add_argument("--priority", type=int, default=0, metavar="N", help="higher starts first (default 0)")
        p.add_argument(
            "--urgent",
            action="store_const",
            const=True,
            default=False,
            help="start next; if no slot is free, preempt the lowest-priority running job that can continue "
            "(--preemptible, or with a checkpoint) and resume it after; if none can, wait for a free slot",
        )
        p.add_argument(  # one word, so that `--urgent train.py` keeps meaning what it always did
            "--urgent=force",
            dest="urgent",
            action="store_const",
            const="force",
            help="as --urgent, but preempt a running job even if it has no checkpoint (it will start over)",
        )
        p.add_argument(
            "--preemptible",
            action="store_true",
            help="save a checkpoint when preempted (HF Trainer >= 5: adds --enable_jit_checkpoint true)",
        )
        p.add_argument("--ckpt-glob", metavar="GLOB", help="where its checkpoints are (default: HF checkpoint-N)")
        p.add_argument(
            "--no-resume",
            action="store_true",
            help="never continue it from its checkpoints (recover, retry and resume start it over)",
        )
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
        p.set_defaults(func="cmd_queue:cmd_add")

    p = sub.add_parser("run", help="start a worker", description="Run queued jobs, one at a time per slot.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--watch", action="store_true", help="stay up and wait for new jobs")
    mode.add_argument("--daemon", action="store_true", help="start a resident background worker and return")
    p.add_argument(
        "--gpus",
        metavar="LIST",
        help="use only these GPUs (e.g. 0,2; default: every GPU found). Workers with disjoint --gpus "
        "can share a spool. Without GPUs: one slot per listed label",
    )
    p.add_argument(
        "--foreign-mem-threshold",
        metavar="SIZE",
        help="memory that processes outside gpuq may hold on a GPU before a whole-GPU job waits for it (default 1G)",
    )
    p.add_argument(
        "--recover",
        action="store_true",
        help="first put interrupted jobs back in the queue (after a reboot), each from its newest checkpoint",
    )
    p.add_argument("--notify", action="store_true", help="a desktop notification whenever a job ends")
    p.add_argument("--max-log-size", metavar="SIZE", help="cap every job's log (a job's own cap comes first)")
    p.add_argument("--default-time", metavar="LIMIT", help="the time limit of jobs without their own --time")
    p.add_argument(
        "--kill-grace",
        metavar="SECONDS",
        help="when a job ends, what is left of its process group gets SIGTERM, then SIGKILL after this (default 10)",
    )
    p.add_argument("--on-finish", metavar="CMD", help="a shell command run whenever a job ends (see `add --on-finish`)")
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func="cmd_worker:cmd_run")

    p = sub.add_parser("stop", help="stop the worker(s); jobs keep running unless --kill-jobs")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--kill-jobs", action="store_true", help="also kill every running job")
    how.add_argument("--drain", action="store_true", help="start nothing new; each worker exits when its jobs end")
    p.set_defaults(func="cmd_worker:cmd_stop")

    p = sub.add_parser(
        "wait",
        help="block until jobs end; exit 0 only if all are done",
        description="Wait until the jobs (default: every job queued or running now) have ended. Exit 0 if "
        "all are done, 1 otherwise, naming the ones that failed, were cancelled, or cannot start by themselves.",
    )
    p.add_argument("ids", type=_ids, nargs="*", metavar="ID")
    p.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds (exit 1)")
    p.set_defaults(func="cmd_worker:cmd_wait")

    p = sub.add_parser("status", help="show the queue")
    p.add_argument("-a", "--all", action="store_true", help="every finished job, not only the recent ones")
    look = p.add_mutually_exclusive_group()
    look.add_argument("--json", action="store_true", help="machine-readable list of jobs")
    look.add_argument("--watch", action="store_true", help="a live view, redrawn in place until Ctrl-C")
    p.add_argument("--interval", type=_seconds, default=2.0, metavar="S", help="with --watch: redraw every S seconds")
    p.set_defaults(func="cmd_view:cmd_status")

    p = sub.add_parser("gpus", help="the GPUs: memory, gpuq's jobs on each, other processes using them")
    p.add_argument("--json", action="store_true", help="a list, one object per GPU")
    p.set_defaults(func="cmd_view:cmd_gpus")

    for name in ("log", "logs"):
        p = sub.add_parser(name, help="show a job's log")
        p.add_argument("id", type=_positive_id)
        p.add_argument("-n", "--lines", type=int, default=40, help="last N lines (default 40)")
        p.add_argument("-f", "--follow", action="store_true", help="keep printing while the job runs")
        p.set_defaults(func="cmd_view:cmd_log")

    p = sub.add_parser("show", help="everything about one job (JSON)")
    p.add_argument("id", type=_positive_id)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--env", action="store_true", help="the job's environment, as inherited from the shell")
    what.add_argument("--json", action="store_true", help="the job's file as it is, environment included")
    p.set_defaults(func="cmd_view:cmd_show")

    several = (
        "Each job named is acted on; one that cannot be is named on stderr with the reason, and the "
        "command then exits 1."
    )
    for name, text in (
        ("cancel", "cancel jobs; a running one is killed first (as by `gpuq kill`), as Slurm's scancel does"),
        ("kill", "stop running jobs (SIGTERM to each one's process group, SIGKILL after a grace period)"),
        ("retry", "put failed or cancelled jobs back in the queue, each from its newest checkpoint"),
        ("hold", "keep pending jobs from starting (in held/) until `gpuq release`; their dependents wait too"),
        ("release", "put held jobs back in line, where their priority and id put them"),
    ):
        p = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}. {several}")
        p.add_argument("ids", type=_job_ids, nargs="+", metavar="ID", help="job ids (ranges like 3-7 too)")
        if name == "retry":
            p.add_argument("--from-scratch", action="store_true", help="start over, ignoring its checkpoints")
        p.set_defaults(func=f"cmd_queue:cmd_{name}")

    p = sub.add_parser(
        "edit",
        help="change a pending or held job: in $VISUAL/$EDITOR, or with --set KEY=VALUE",
        description="Edit what a waiting job will run (the fields a hand-dropped job file may have: cmd, cwd, "
        "name, env, after, after_any, retries, priority, gpus, gpu_mem). The result is checked like a dropped "
        "file and replaces the job at once, or is refused with the reason and the job left as it was.",
    )
    p.add_argument("id", type=_positive_id, metavar="ID")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help='VALUE as JSON (5, ["a"]) or text')
    p.set_defaults(func="cmd_queue:cmd_edit")

    p = sub.add_parser("preempt", help="stop a running job so it can be resumed from its checkpoint")
    p.add_argument("id", type=_positive_id, metavar="ID")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds to wait for it (default 60)")
    p.add_argument("--force", action="store_true", help="SIGKILL whatever is left when the timeout is up")
    p.set_defaults(func="cmd_preempt:cmd_preempt")

    text = "queue preempted jobs again, each from its newest complete checkpoint"
    p = sub.add_parser("resume", help=text, description=f"Queue preempted (or interrupted) jobs again. {several}")
    p.add_argument("ids", type=_job_ids, nargs="+", metavar="ID", help="job ids (ranges like 3-7 too)")
    p.add_argument("--require-checkpoint", action="store_true", help="refuse a job without a checkpoint")
    p.add_argument("--back", action="store_true", help="queue it in normal order instead of first in line")
    p.set_defaults(func="cmd_preempt:cmd_resume")

    p = sub.add_parser("clear", help="remove finished jobs (keeps preempted and interrupted ones)")
    p.add_argument("--logs", action="store_true", help="only drop the logs of finished jobs (their records stay)")
    p.set_defaults(func="cmd_queue:cmd_clear")

    p = sub.add_parser("recover", help="put interrupted jobs back in the queue, each from its newest checkpoint")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="recover every interrupted job")
    which.add_argument("--jobs", type=_job_ids, nargs="+", metavar="ID", help="recover these jobs (3-7 too)")
    p.add_argument("--from-scratch", action="store_true", help="start them over, ignoring their checkpoints")
    p.set_defaults(func="cmd_queue:cmd_recover")

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
    p.set_defaults(func="cmd_preempt:cmd_adopt")

    p = sub.add_parser("eta", help="progress and expected end of running jobs, expected start of pending ones")
    p.add_argument("id", type=_positive_id, nargs="?", help="one job (default: every running and pending job)")
    p.set_defaults(func="cmd_view:cmd_eta")

    p = sub.add_parser("history", help="where the GPU hours went: runs, failures, GPU-hours per group; a timeline")
    p.add_argument("--since", metavar="WHEN", help="only runs that ended since (7d, 12h, 2w, or a date)")
    p.add_argument("--by", choices=("dir", "script", "day", "sweep"), default="dir", help="group by (default dir)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the groups as JSON")
    out.add_argument("--plot", metavar="FILE", help="draw a timeline into FILE.png or .svg (needs gpuq-spool[plot])")
    p.set_defaults(func="cmd_history:cmd_history")

    # ---- gpuq slurm submit | sync (issue 18) ----
    class SlurmOptParser(Parser):
        """`--slurm-opt --time=4:00:00`: argparse takes a value that starts with `-` for an option."""

        def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def,override]
            words, out = list(args or []), []
            while words:
                word = words.pop(0)
                out.append(f"{word}={words.pop(0)}" if word == "--slurm-opt" and words else word)
            return super().parse_known_args(out, namespace)

    p = sub.add_parser("slurm", help="hand queued jobs to a Slurm cluster (sbatch); the spool keeps their state")
    slurm = p.add_subparsers(dest="slurm_command", metavar="ACTION", parser_class=SlurmOptParser, required=True)
    s = slurm.add_parser(
        "submit",
        help="hand pending jobs to Slurm (sbatch), dependencies kept",
        description="Hand pending jobs to Slurm: each becomes a batch script running its command in its "
        "directory with its environment and venv, --gres=gpu:N from --gpus, --after/--after-any as Slurm "
        "dependencies, requeued with its newest checkpoint at the time limit. They move to slurm/. A job that "
        "cannot go (not pending, a dependency Slurm could not honour, refused by sbatch) stays here, named on "
        "stderr with the reason; the others are handed over, and the command exits 1.",
    )
    s.add_argument("ids", type=_job_ids, nargs="*", metavar="ID", help="job ids (ranges like 3-7 too)")
    s.add_argument("--all", action="store_true", help="every pending job")
    s.add_argument(
        "--slurm-opt",
        action="append",
        default=[],
        metavar="OPT",
        help="an sbatch option for every job of this hand-over (repeatable): --slurm-opt --time=4:00:00",
    )
    s.add_argument("--grace", type=int, default=120, metavar="SECONDS", help="warn jobs this long before the limit")
    s.set_defaults(func="cmd_slurm:cmd_submit")
    s = slurm.add_parser("sync", help="record what Slurm says of the jobs handed to it (also done by status)")
    s.set_defaults(func="cmd_slurm:cmd_sync")

    p = sub.add_parser(
        "import",
        help="bring the original gpuq's queue (gpuq.db or queue.json) into this spool",
        description="Import the queue of the original single-file gpuq: ids, dependencies, exit codes and "
        "logs are kept; running jobs are adopted if their process lives. Done automatically the first time "
        "gpuq runs where such a queue lies ($GPUQ_HOME/gpuq.db or queue.json); the old file is renamed .bak.",
    )
    p.add_argument("path", nargs="?", metavar="PATH", help="the file (default: $GPUQ_HOME/gpuq.db or queue.json)")
    p.set_defaults(func="cmd_tools:cmd_import")

    p = sub.add_parser("skill", help="the assistant skill: show it, or install it for Claude Code")
    p.add_argument("action", choices=("show", "install"), help="show: print it; install: copy it for Claude Code")
    p.add_argument("--dest", metavar="DIR", help="where to install it (default: ~/.claude/commands)")
    p.add_argument("--force", action="store_true", help="replace a copy you changed (yours is kept as .bak)")
    p.set_defaults(func="cmd_tools:cmd_skill")

    p = sub.add_parser("service", help="a systemd user service that keeps a worker running (Linux)")
    p.add_argument("action", choices=("install", "uninstall"))
    p.add_argument("--dest", metavar="DIR", help="write the unit there (default: ~/.config/systemd/user)")
    p.add_argument("--recover", action="store_true", help="the worker re-queues interrupted jobs when it starts")
    p.add_argument("--force", action="store_true", help="replace or remove a unit gpuq did not write")
    p.set_defaults(func="cmd_tools:cmd_service")

    p = sub.add_parser("completion", help="shell completion: `source <(gpuq completion bash)`")
    p.add_argument("shell", choices=("bash", "zsh"))
    p.set_defaults(func="cmd_tools:cmd_completion")

    p = sub.add_parser("_ids")  # job ids for shell completion; not a command for people
    p.set_defaults(func="cmd_tools:cmd_ids")

    p = sub.add_parser("demo", help="queue and run a small example chain in a throw-away spool (no GPU needed)")
    p.set_defaults(func="cli:cmd_demo")
    return parser


def split_add_argv(parser: Parser, argv: list[str]) -> tuple[list[str], list[str]]:
    """Split `add` arguments at SCRIPT: gpuq's options before it, the job's words from it on."""
    add = _add_parser(parser)
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


def misplaced_option(parser: Parser, words: list[str]) -> list[str]:
    """The first of gpuq's own long `add` options among the job's words, with its value: most
    likely meant for gpuq (the original gpuq took them from anywhere on the line)."""
    add = _add_parser(parser)
    for i, word in enumerate(words):
        for action in add._actions:
            if word.split("=", 1)[0] in action.option_strings and word.startswith("--") and word != "--help":
                takes_value = action.nargs != 0 and "=" not in word
                return words[i : i + 2] if takes_value else [word]
    return []


def _commands(parser: Parser) -> dict[str, Parser]:
    return parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]


def _add_parser(parser: Parser) -> Parser:
    """`add`'s subparser (or `enqueue`'s, the same options), whichever was built."""
    commands = _commands(parser)
    return commands["add"] if "add" in commands else commands["enqueue"]


def parse(argv: list[str]) -> argparse.Namespace:
    wanted = argv[0] if argv and not argv[0].startswith("-") else None
    parser = build_parser(only=wanted)
    if wanted is not None and wanted not in _commands(parser):
        parser = build_parser()  # not a command: the full parser says so and lists them
    if argv and argv[0] in ("add", "enqueue"):
        own, job_words = split_add_argv(parser, argv[1:])
        separated = argv[1 + len(own) : 2 + len(own)] == ["--"]
        stray = misplaced_option(parser, job_words[1:]) if job_words and not separated else []
        if stray:
            import shlex

            fix = shlex.join(["gpuq", argv[0], *own, *stray, job_words[0]])
            print(
                f"gpuq {argv[0]}: note: {stray[0]} comes after the script, so {job_words[0]} gets it; gpuq's "
                f"options go before the script ({fix} ...); `--` before the script silences this note",
                file=sys.stderr,
            )
        args = parser.parse_args([argv[0], *own, "--", "_"]) if job_words else parser.parse_args(argv)
        if job_words:
            args.script, args.args = job_words[0], job_words[1:]
        return args
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        raise SystemExit(UsageError.exit_code)
    return args
