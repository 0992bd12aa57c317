"""Every command of the `gpuq` command line, in the order `gpuq --help` lists them (the vocabulary,
`add` and `run` are in options.py)."""

from __future__ import annotations

from gpuq.cli.options import (
    ADD,
    APPEND,
    EXTEND,
    FLAG,
    HIDDEN,
    REST,
    RUN,
    Command,
    Opt,
    counter,
    gpu_count,
    interval,
    line_count,
    positive_id,
    seconds,
)
from gpuq.core import states
from gpuq.core.states import (
    ACTIVE,
    CANCELLED,
    FAILED,
    HELD,
    INTERRUPTED,
    PENDING,
    PREEMPTED,
    RAY,
    RUNNING,
    SLURM,
    WAITING,
)
from gpuq.core.timespec import parse_duration, parse_id_ranges


def state_names(text: str) -> tuple[str, ...]:
    names = tuple(name for name in text.split(",") if name)
    unknown = [name for name in names if name not in states.STATES]
    if unknown or not names:
        raise ValueError(f"not a state: {text!r}")
    return names


def finished_states(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    wrong = [name for name in names if name not in states.FINISHED]
    if wrong or not names:
        raise ValueError(f"not a finished state: {text!r} (clear removes only {', '.join(states.FINISHED)} jobs)")
    return names


port_number = counter(0, "a port number (0 to 65535)", most=65535)


def age(text: str) -> float:
    """`clear --older-than 7d`: seconds, with a unit (a bare number would be minutes for `--time`)."""
    if text.strip().replace(".", "", 1).isdigit():
        raise ValueError(f"{text!r} needs a unit: {text.strip()}d, {text.strip()}h or {text.strip()}m?")
    try:
        return parse_duration(text, "--older-than")
    except ValueError:
        raise ValueError(f"cannot read {text!r} as an age; use 7d, 12h, 90m or 1d12h") from None


job_ids = parse_id_ranges  # the job ids of a command that acts on several

MCP_CLIENTS = ("claude", "claude-desktop", "codex")  # the clients `gpuq mcp install` knows
SEVERAL = (
    "Each job named is acted on; one that cannot be is named on stderr with the reason, and the command then exits 1."
)
IDS = Opt("ids", convert=job_ids, nargs="+", metavar="ID", help="job ids (ranges like 3-7 too)")
PENDING_IDS = Opt("ids", convert=job_ids, nargs="*", metavar="ID", help="job ids (ranges like 3-7 too)")
EVERY_PENDING = Opt("--all", kind=FLAG, help="every pending job")


# The states of the jobs each command acts on (Command.id_states), as engine/lifecycle checks them;
# `wait` waits for jobs that end without a person.
ENDING = (*ACTIVE, SLURM, RAY)


def _on_each(
    name: str, handler: str, help: str, *options: Opt, id_states: tuple[str, ...], description: str = ""
) -> Command:
    description = f"{description or help[0].upper() + help[1:] + '.'} {SEVERAL}"
    return Command(
        name, handler=handler, help=help, description=description, options=(IDS, *options), id_states=id_states
    )


SLURM_ACTIONS = Command(
    "slurm",
    help="hand queued jobs to a Slurm cluster (sbatch); the spool keeps their state",
    actions=(
        Command(
            "submit",
            handler="cmd_clusters:cmd_slurm_submit",
            help="hand pending jobs to Slurm (sbatch), dependencies kept",
            description="Hand pending jobs to Slurm: each becomes a batch script running its command in its "
            "directory with its environment and venv, --gres=gpu:N from --gpus, --after/--after-any as Slurm "
            "dependencies, requeued with its newest checkpoint at the time limit. They move to slurm/. A job that "
            "cannot go (not pending, a dependency Slurm could not honour, refused by sbatch) stays here, named on "
            "stderr with the reason; the others are handed over, and the command exits 1.",
            id_states=(PENDING,),
            options=(
                PENDING_IDS,
                EVERY_PENDING,
                Opt(
                    "--slurm-opt",
                    kind=APPEND,
                    dash_value=True,
                    metavar="OPT",
                    help="an sbatch option for every job of this hand-over (repeatable): --slurm-opt --time=4:00:00",
                ),
                Opt(
                    "--grace", convert=int, default=120, metavar="SECONDS", help="warn jobs this long before the limit"
                ),
            ),
        ),
        Command(
            "sync",
            handler="cmd_clusters:cmd_slurm_sync",
            help="record what Slurm says of the jobs handed to it (also done by status)",
        ),
    ),
)

RAY_ACTIONS = Command(
    "ray",
    help="hand queued jobs to a Ray cluster (its Jobs API); the spool keeps their state",
    actions=(
        Command(
            "submit",
            handler="cmd_clusters:cmd_ray_submit",
            help="hand pending jobs to a Ray cluster, dependencies and retries kept by gpuq",
            description="Hand pending jobs to a Ray cluster through its Jobs REST API: each runs its command in its "
            "directory with its interpreter and environment (a shared filesystem is assumed), with --gpus, --cpus "
            "and --mem as Ray's entrypoint resources. They move to ray/; a job whose --after jobs have not "
            "succeeded yet waits there and is submitted when they have (`gpuq ray sync`, also done by status). "
            "A job that cannot go (no cluster, resources no node has, a dependency left here) stays pending, named "
            "on stderr with the reason; the others are handed over, and the command exits 1.",
            id_states=(PENDING,),
            options=(
                PENDING_IDS,
                EVERY_PENDING,
                Opt(
                    "--address", metavar="URL", help="the cluster's dashboard (default: $RAY_ADDRESS): http://HEAD:8265"
                ),
            ),
        ),
        Command(
            "sync",
            handler="cmd_clusters:cmd_ray_sync",
            help="record what Ray says of the jobs handed to it, submit those now ready (also done by status)",
        ),
        Command(
            "status",
            handler="cmd_clusters:cmd_ray_status",
            help="the Ray cluster's nodes, their GPUs, and which of our jobs run where",
            options=(
                Opt(
                    "--address",
                    metavar="URL",
                    help="the cluster's dashboard (default: that of the jobs on Ray, else $RAY_ADDRESS)",
                ),
            ),
        ),
    ),
)

STATUS = Command(
    "status",
    handler="cmd_status:cmd_status",
    help="show the queue",
    options=(
        Opt("-a", "--all", kind=FLAG, help="every finished job, not only the recent ones"),
        Opt("--json", kind=FLAG, group="look", help='machine-readable list of jobs (a damaged file: "damaged": true)'),
        Opt("--watch", kind=FLAG, group="look", help="a live view, redrawn in place until Ctrl-C"),
        Opt("--interval", convert=interval, default=2.0, metavar="S", help="with --watch: redraw every S seconds"),
    ),
)

# every command, in the order `gpuq --help` lists them
COMMANDS = (
    ADD,
    RUN,
    Command(
        "stop",
        handler="cmd_worker:cmd_stop",
        help="stop the worker(s); jobs keep running unless --kill-jobs",
        options=(
            Opt("--kill-jobs", kind=FLAG, group="how", help="also kill every running job"),
            Opt("--drain", kind=FLAG, group="how", help="start nothing new; each worker exits when its jobs end"),
        ),
    ),
    Command(
        "wait",
        handler="cmd_worker:cmd_wait",
        help="block until jobs end; exit 0 only if all are done",
        description="Wait until the jobs (default: every job queued or running now) have ended. Exit 0 if "
        "all are done, 1 otherwise, naming the ones that failed, were cancelled, or cannot start by themselves.",
        id_states=ENDING,
        options=(
            Opt("ids", convert=job_ids, nargs="*", metavar="ID"),
            Opt("--timeout", convert=seconds, metavar="S", help="give up after S seconds (exit 1)"),
        ),
    ),
    STATUS,
    Command(
        "gpus",
        handler="cmd_view:cmd_gpus",
        help="the GPUs: memory, gpuq's jobs on each, other processes using them",
        options=(Opt("--json", kind=FLAG, help="a list, one object per GPU"),),
    ),
    Command(
        "top",
        handler="top.command:cmd_top",  # gpuq/cli/top/, imported only when `top` runs
        help="the GPUs and the queue, live, full screen; keys follow a log, kill, cancel, hold, preempt, retry",
        options=(
            Opt("--once", kind=FLAG, help="print one frame to stdout and exit (no terminal needed)"),
            Opt("--interval", convert=interval, default=2.0, metavar="S", help="seconds between looks (default 2)"),
        ),
    ),
    Command(
        "lease",
        handler="cmd_worker:cmd_lease",
        help="run a command outside the queue (a notebook, a script) on GPUs leased from every user's gpuq",
        description="Wait for free GPUs, lease them machine-wide, run CMD with CUDA_VISIBLE_DEVICES set to them, end "
        "the lease when CMD ends. Exits with CMD's exit code; 75 with --no-wait when no GPU is free; 127 when CMD "
        "is not found, 126 when it cannot run.",
        options=(  # --gpus without a default: argparse's exclusive group would not see `--gpus 1` (the default)
            Opt("--gpus", convert=gpu_count, metavar="N", group="size", help="whole GPUs (default 1)"),
            Opt("--gpu-mem", metavar="SIZE", group="size", help="only this much of one GPU (e.g. 20G), shared"),
            Opt("--wait", kind=FLAG, group="wait", help="wait until the GPUs are free (the default)"),
            Opt("--no-wait", kind=FLAG, group="wait", help="exit 75 at once, naming the holders, if none is free"),
            Opt("cmd", nargs=REST, metavar="CMD", help="the command and its arguments (after --)"),
        ),
    ),
    Command(
        "rejected",
        handler="cmd_view:cmd_rejected",
        help="dropped files that were not jobs, each with why; `status` stops mentioning them",
        options=(Opt("--json", kind=FLAG, help="a list: file, rejected_at, reason"),),
    ),
    Command(
        "log",
        "logs",
        handler="cmd_view:cmd_log",
        help="show a job's log",
        options=(
            Opt("id", convert=positive_id),
            Opt("-n", "--lines", convert=line_count, default=40, help="last N lines (default 40)"),
            Opt("-f", "--follow", kind=FLAG, help="keep printing while the job runs (waiting for it to start first)"),
        ),
    ),
    Command(
        "show",
        handler="cmd_view:cmd_show",
        help="one job: command, state and why, times, outcome, GPUs, dependencies (--json: its file)",
        options=(
            Opt("id", convert=positive_id),
            Opt("--env", kind=FLAG, group="what", help="the job's environment, as inherited from the shell"),
            Opt("--json", kind=FLAG, group="what", help="the job's file as it is, environment included"),
        ),
    ),
    Command(
        "triage",
        handler="cmd_view:cmd_triage",
        help="one job: why it waits or failed, its log's end, its checkpoint, and the commands that would fix it",
        options=(
            Opt("id", convert=positive_id),
            Opt(
                "-n",
                "--lines",
                convert=line_count,
                default=30,
                help="last N lines of its log (default 30, at most 500)",
            ),
            Opt("--json", kind=FLAG, help="all of it as one JSON object"),
        ),
    ),
    _on_each(
        "cancel",
        "cmd_jobs:cmd_cancel",
        "cancel jobs; a running one is killed first (as by `gpuq kill`), as Slurm's scancel does",
        Opt(
            "--force",
            kind=FLAG,
            help="for a job on Slurm or Ray whose cluster cannot be told (gone for good): record it "
            "cancelled here anyway; it may still run there",
        ),
        id_states=states.UNFINISHED,
    ),
    _on_each(
        "kill",
        "cmd_jobs:cmd_kill",
        "stop running jobs (SIGTERM to each one's process group, SIGKILL after a grace period; "
        "on Slurm, scancel; on Ray, Ray's stop: either is then cancelled)",
        id_states=(RUNNING,),
    ),
    _on_each(
        "retry",
        "cmd_jobs:cmd_retry",
        "put failed or cancelled jobs back in the queue, each from its newest checkpoint",
        Opt("--from-scratch", kind=FLAG, help="start over, ignoring its checkpoints"),
        id_states=(FAILED, CANCELLED),
    ),
    _on_each(
        "hold",
        "cmd_jobs:cmd_hold",
        "keep pending jobs from starting (in held/) until `gpuq release`; their dependents wait too",
        id_states=(PENDING,),
    ),
    _on_each(
        "release",
        "cmd_jobs:cmd_release",
        "put held jobs back in line, where their priority and id put them",
        id_states=(HELD,),
    ),
    Command(
        "edit",
        handler="cmd_jobs:cmd_edit",
        help="change a pending or held job: in $VISUAL/$EDITOR, or with --set KEY=VALUE",
        description="Edit what a waiting job will run (the fields a hand-dropped job file may have: cmd, cwd, "
        "name, env, after, after_any, retries, priority, gpus, gpu_mem, mem, cpus, retry_oom, keep_checkpoints, "
        "ckpt_glob, min_free). The result is checked like a dropped file and replaces the job at once, or is "
        "refused with the reason and the job left as it was.",
        id_states=WAITING,
        options=(
            Opt("id", convert=positive_id, metavar="ID"),
            Opt("--set", kind=APPEND, metavar="KEY=VALUE", help='VALUE as JSON (5, ["a"]) or text'),
        ),
    ),
    Command(
        "preempt",
        handler="cmd_jobs:cmd_preempt",
        help="stop a running job so it can be resumed from its checkpoint",
        id_states=(RUNNING,),
        options=(
            Opt("id", convert=positive_id, metavar="ID"),
            Opt("--timeout", convert=seconds, default=60.0, metavar="S", help="seconds to wait for it (default 60)"),
            Opt("--force", kind=FLAG, help="SIGKILL whatever is left when the timeout is up"),
        ),
    ),
    _on_each(
        "resume",
        "cmd_jobs:cmd_resume",
        "queue preempted jobs again, each from its newest complete checkpoint",
        Opt("--require-checkpoint", kind=FLAG, help="refuse a job without a checkpoint"),
        Opt("--back", kind=FLAG, help="queue it in normal order instead of first in line"),
        id_states=(PREEMPTED, INTERRUPTED),
        description="Queue preempted (or interrupted) jobs again.",
    ),
    Command(
        "clear",
        handler="cmd_jobs:cmd_clear",
        help="remove finished jobs and their logs, keeping their history and run times",
        description="Remove finished jobs (done, failed, cancelled) and their logs; preempted and interrupted "
        "ones stay, and so do finished jobs an unfinished job (held too) depends on. What `gpuq history` "
        "counts of them and the run times the ETA learns from are kept. It says what it will remove and, "
        "on a terminal, asks.",
        options=(
            Opt("--logs", kind=FLAG, help="only drop the logs of finished jobs (their records stay)"),
            Opt(
                "--state",
                kind=EXTEND,
                convert=finished_states,
                metavar="STATE",
                help="only jobs in these states (done, failed, cancelled; repeat it or give a list: done,failed)",
            ),
            Opt("--older-than", convert=age, metavar="DURATION", help="only jobs that ended this long ago (7d, 12h)"),
            Opt("-y", "--yes", kind=FLAG, help="do not ask, also on a terminal"),
        ),
    ),
    Command(
        "recover",
        handler="cmd_jobs:cmd_recover",
        help="put interrupted jobs back in the queue, each from its newest checkpoint",
        id_states=(INTERRUPTED,),
        options=(
            Opt("--all", kind=FLAG, group="which", help="recover every interrupted job"),
            Opt("--jobs", convert=job_ids, nargs="+", metavar="ID", group="which", help="recover these jobs (3-7 too)"),
            Opt("--from-scratch", kind=FLAG, help="start them over, ignoring their checkpoints"),
        ),
    ),
    Command(
        "adopt",
        handler="cmd_jobs:cmd_adopt",
        help="track a process started outside gpuq as a running job",
        description="Take a running process of yours into the queue: no job of this queue starts on its GPUs "
        "while it runs, and jobs can wait for it (--after). Its GPUs are those its CUDA_VISIBLE_DEVICES names, "
        "else every GPU, with any where it holds memory (without GPUs: the whole machine); adopt says which. "
        "Those it is known to use (named by its CUDA_VISIBLE_DEVICES, or where it holds memory) are leased "
        "until it ends, as many as your cap in the machine's policy allows, so that every user's gpuq on the "
        "machine keeps off them; adopt says which. Its exit code "
        "cannot be known: when it ends it is recorded as done with exit_code null, so `--after` on it starts "
        "whatever its result.",
        options=(
            Opt("pid", convert=counter(1, "a process id"), metavar="PID"),
            Opt("--name", help="job name (default: <cwd name>/<script stem>)"),
            Opt("--log", metavar="FILE", help="the log file the process writes (for progress and ETA)"),
        ),
    ),
    Command(
        "eta",
        handler="cmd_eta:cmd_eta",
        help="progress and expected end of running jobs, expected start of pending ones",
        id_states=ACTIVE,
        options=(Opt("id", convert=positive_id, nargs="?", help="one job (default: every running and pending job)"),),
    ),
    Command(
        "history",
        handler="cmd_history:cmd_history",
        help="where the GPU hours went: runs, failures, GPU-hours per group; a timeline",
        options=(
            Opt("id", convert=positive_id, nargs="?", help="one job: each attempt, what it had, how it ended"),
            Opt("--since", metavar="WHEN", help="only runs that ended since (7d, 12h, 2w, or a date)"),
            Opt("--by", choices=("dir", "script", "day", "sweep"), default="dir", help="group by (default dir)"),
            Opt("--json", kind=FLAG, group="out", help="the groups as JSON (with an id: its attempts)"),
            Opt(
                "--plot",
                metavar="FILE",
                group="out",
                help="draw a timeline into FILE.png or .svg (with an id: its runs; needs the plot extra)",
            ),
        ),
    ),
    SLURM_ACTIONS,
    RAY_ACTIONS,
    Command(
        "import",
        handler="cmd_tools:cmd_import",
        help="bring the original gpuq's queue (gpuq.db or queue.json) into this spool",
        description="Import the queue of the original single-file gpuq: ids, dependencies, exit codes and "
        "logs are kept; running jobs are adopted if their process lives. Done automatically the first time "
        "gpuq runs where such a queue lies ($GPUQ_HOME/gpuq.db or queue.json); the old file is renamed .bak. "
        "With nothing left to import, it says again what was imported and what was not.",
        options=(Opt("path", nargs="?", metavar="PATH", help="the file (default: $GPUQ_HOME/gpuq.db or queue.json)"),),
    ),
    Command(
        "skill",
        handler="cmd_tools:cmd_skill",
        help="the assistant skill: show it, or install it for Claude Code",
        options=(
            Opt("action", choices=("show", "install"), help="show: print it; install: copy it for Claude Code"),
            Opt("--dest", metavar="DIR", help="where to install it (default: ~/.claude/commands)"),
            Opt("--force", kind=FLAG, help="replace a copy you changed (yours is kept as .bak)"),
        ),
    ),
    Command(
        "mcp",
        handler="assistant.install:cmd_mcp",  # gpuq/cli/assistant/: the server and the SDK only when it runs
        help="an MCP server on stdio: the queue as tools for an AI assistant (needs the mcp extra)",
        options=(
            Opt("action", nargs="?", choices=("install",), help="install: how a client starts it"),
            Opt("--client", choices=MCP_CLIENTS, help="install: for this client only"),
            Opt("--write", kind=FLAG, help="install: add it to the client's configuration file (kept as .bak-TIME)"),
            Opt("--force", kind=FLAG, help="install --write: replace a different gpuq entry"),
        ),
    ),
    Command(
        "web",
        handler="web.command:cmd_web",  # gpuq/cli/web/: Starlette and uvicorn only when it runs
        help="the queue in a browser: live queue, jobs, logs, GPUs and actions, behind a token (needs the web extra)",
        description="Serve the queue as a web page until Ctrl-C, on 127.0.0.1 unless --host says otherwise. It "
        "prints the URL to open, with the token every request needs (kept 0600 in the spool); through SSH: "
        "`ssh -L 8080:127.0.0.1:PORT host`, then the same URL with port 8080.",
        options=(
            Opt("--port", convert=port_number, default=0, metavar="N", help="the port (default 0: a free one)"),
            Opt("--host", default="127.0.0.1", metavar="ADDR", help="the address to listen on (default 127.0.0.1)"),
            Opt("--read-only", kind=FLAG, help="show the queue, offer no action"),
            Opt("--new-token", kind=FLAG, help="make a new token: pages opened with the old one get 403"),
        ),
    ),
    Command(
        "service",
        handler="cmd_tools:cmd_service",
        help="a systemd user service that keeps a worker running (Linux)",
        options=(
            Opt("action", choices=("install", "uninstall")),
            Opt("--dest", metavar="DIR", help="write the unit there (default: ~/.config/systemd/user)"),
            Opt(
                "--no-recover",
                kind=FLAG,
                group="recovery",
                help="leave interrupted jobs where they are when the worker starts (default: after a reboot "
                "they go back in the queue, each from its newest checkpoint)",
            ),
            Opt("--recover", kind=FLAG, group="recovery", help=HIDDEN),  # the default now; older scripts give it
            Opt("--web", kind=FLAG, help="install: also a unit keeping `gpuq web` running beside the worker"),
            Opt(
                "--web-port",
                convert=port_number,
                metavar="N",
                help="with --web: its port (default 8737 + your uid %% 1000: each user's own; if something listens "
                "there, the first free one 1000, 2000... above it; the unit's port once installed)",
            ),
            Opt("--force", kind=FLAG, help="replace or remove a unit gpuq did not write"),
        ),
    ),
    Command(
        "completion",
        handler="cmd_tools:cmd_completion",
        help="shell completion: `source <(gpuq completion bash)`",
        options=(Opt("shell", choices=("bash", "zsh")),),
    ),
    Command(  # job ids for shell completion; not a command for people
        "_ids", handler="common:cmd_ids", options=(Opt("--state", convert=state_names, help=HIDDEN),)
    ),
    Command(
        "demo",
        handler="cmd_tools:cmd_demo",
        help="queue and run a small example chain in a throw-away spool (no GPU needed)",
    ),
)
