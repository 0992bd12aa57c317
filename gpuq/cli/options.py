"""The command line's options as data (with `add`'s and `run`'s long lists), so that a spelling, a
default or a converter is written once: parser.py, the MCP server and completion all read it.
A converter raises ValueError with a one-line message.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from gpuq.core.keep import parse_keep
from gpuq.core.timespec import parse_duration, parse_id_ranges, parse_memory_mib, parse_typed_bytes

# what an option does with what follows it
VALUE = "value"  # takes a value (or, for a positional, the word)
FLAG = "flag"  # True when given
CONST = "const"  # `const` when given
APPEND = "append"  # takes a value each time it is given; a list
EXTEND = "extend"  # takes a list each time it is given (`--after 3,5`); one list of them all
NOTIFY = "notify"  # `--notify`: True when given alone; `--notify URL`, `--notify=URL`: a URL of `notify_url`
REST = "..."  # nargs of the positional that takes every word from there on (argparse.REMAINDER)
HIDDEN = "==SUPPRESS=="  # the help of an option `--help` does not show (argparse.SUPPRESS)


class Opt:
    def __init__(
        self,
        *flags: str,
        help: Optional[str] = None,
        kind: str = VALUE,
        convert: Optional[Callable[[str], Any]] = None,
        default: Any = None,
        const: Any = None,
        metavar: Optional[str] = None,
        nargs: Any = None,
        choices: Optional[tuple[str, ...]] = None,
        dest: Optional[str] = None,
        group: Optional[str] = None,
        dash_value: bool = False,
        setting: Optional[str] = None,
        read: Optional[Callable[[Any, str], Any]] = None,
        before_script: Optional[str] = None,
    ) -> None:
        self.flags, self.kind, self.convert, self.default, self.const = flags, kind, convert, default, const
        self.metavar, self.nargs, self.choices, self.help = metavar, nargs, choices, help
        self.dest = dest or flags[-1].lstrip("-").replace("-", "_")  # argparse's: the long spelling, last
        self.group = group  # options of one group exclude each other
        self.dash_value = dash_value  # its value may start with "-" (`--slurm-opt --time=4:00:00`)
        self.setting = setting  # `gpuq run`: the worker's Settings field it sets (forwarded to a --daemon)
        self.read = read  # `gpuq run`: (text, flag) -> the setting's value; ValueError for bad text
        # what the job would do if the script got this option of `add` instead of gpuq (`add eval.py
        # --after 1`, as the original gpuq allowed): after SCRIPT it is refused, with this said
        self.before_script = before_script

    @property
    def positional(self) -> bool:
        return not self.flags[0].startswith("-")

    @property
    def takes_value(self) -> bool:
        return not self.positional and self.kind in (VALUE, APPEND, EXTEND)

    def initial(self) -> Any:
        if self.kind in (APPEND, EXTEND):
            return []
        return False if self.kind in (FLAG, NOTIFY) else self.default


class Command:
    """A command and its other names; its handler "module:function" of gpuq.cli is imported only
    when it runs. With `actions`, a group of commands (`slurm`)."""

    def __init__(
        self,
        *names: str,
        handler: Optional[str] = None,
        help: Optional[str] = None,
        description: Optional[str] = None,
        options: tuple[Opt, ...] = (),
        actions: tuple[Command, ...] = (),
        id_states: Optional[tuple[str, ...]] = None,
    ) -> None:
        self.names, self.handler, self.help, self.description = names, handler, help, description
        self.options, self.actions = options, actions
        # the states of the jobs its ids may name, whose ids shell completion offers; None: any
        self.id_states = id_states


def env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _number(text: str) -> float:
    """What `text` says as a float; -1.0, outside every range below, when it is no number."""
    try:
        return float(text)
    except ValueError:
        return -1.0


def interval(text: str) -> float:
    value = _number(text)
    if not 0.1 <= value <= 3600:
        raise ValueError(f"not a number of seconds from 0.1 to 3600: {text!r}")
    return value


def counter(least: int, what: str, most: float = float("inf")) -> Callable[[str], int]:
    """A converter of a whole number from `least` to `most`, said `what` it is not."""

    def count(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or not least <= int(text) <= most:
            raise ValueError(f"not {what}: {text!r}")
        return int(text)

    return count


def seconds(text: str) -> float:
    """A number of seconds, 0 or more (a timeout)."""
    value = _number(text)
    if not 0 <= value < 1e9:  # also refuses nan and inf
        raise ValueError(f"not a number of seconds (0 or more): {text!r}")
    return value


positive_id = counter(1, "a job id")
line_count = counter(0, "a number of lines (0 or more)")
gpu_count = counter(0, "a number of GPUs")
cpu_count = counter(1, "a number of CPUs (1 or more)")


# `gpuq run`'s readers: (text, flag) -> the worker's setting


def gpu_labels(text: str, flag: str) -> list[str]:
    labels = [label.strip() for label in text.split(",") if label.strip()]
    if not labels:
        raise ValueError(f"{flag} needs a list such as 0 or 0,1")
    return labels


def grace_seconds(text: str, flag: str) -> float:
    grace = _number(text)
    if not 0 <= grace <= 3600:
        raise ValueError(f"{flag}: expected seconds from 0 to 3600, got {text!r}")
    return grace


def cpu_total(text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{flag}: expected a number of CPUs (1 or more), got {text!r}")
    return int(text)


# what a job would do if the script got one of these options (Opt.before_script)
UNWAITED = "start without waiting"
IN_TURN = "wait its turn"

ADD = Command(
    "add",
    "enqueue",
    handler="cmd_add:cmd_add",
    help="queue SCRIPT [ARGS...] (options before SCRIPT are gpuq's)",
    description="Queue a job. Only options before SCRIPT belong to gpuq; SCRIPT and "
    "everything after it are passed to the job verbatim. A dependency or scheduling option of gpuq's "
    "(--after, --after-any, --begin, --hold, --urgent, --priority, --time), or --dry-run, after SCRIPT is "
    "refused, as the job would run without it; `--` before SCRIPT passes it to the job.",
    options=(
        Opt("-d", "--dir", help="working directory (default: the current one)"),
        Opt("-p", "--python", help="interpreter for a .py SCRIPT (default: nearest .venv, active conda env, PATH)"),
        Opt("--conda", metavar="ENV", help="run it in this conda/mamba environment (a name, or a path)"),
        Opt("--name", help="job name (default: <dir name>/<script stem>)"),
        Opt(
            "--after",
            kind=EXTEND,
            convert=parse_id_ranges,
            metavar="ID",
            before_script=UNWAITED,
            help="start only after job ID finished successfully (repeatable, ID,ID, or a range 12-17)",
        ),
        Opt(
            "--after-any",
            kind=EXTEND,
            convert=parse_id_ranges,
            metavar="ID",
            before_script=UNWAITED,
            help="start after job ID ended, whatever its result",
        ),
        Opt("--retries", convert=int, default=0, metavar="N", help="run again up to N times if it fails"),
        Opt(
            "--retry-oom",
            convert=counter(0, "a number of retries (0 or more)"),
            default=0,
            metavar="N",
            help="after an out-of-memory failure run again up to N more times with more room: --gpu-mem doubled "
            "(up to a whole GPU, then the GPU with the most memory), --mem doubled; GPUQ_OOM_RETRY=k is set",
        ),
        Opt(
            "--sweep",
            kind=APPEND,
            metavar="NAME=V1,V2",
            help="one job per value (repeat for a product of lists); {NAME} in the arguments takes the value",
        ),
        Opt("--yes", kind=FLAG, help="with --sweep: queue more than 1,000 jobs"),
        Opt(
            "--hold",
            kind=FLAG,
            before_script="start without being held",
            help="queue it held: it starts only after `gpuq release`",
        ),
        Opt(
            "--time",
            metavar="LIMIT",
            before_script="run without that time limit",
            help="stop it once it has run this long: 4h, 90m, 45s, 2d, 1h30m, 1:30:00 (h:mm:ss), 90:00 (mm:ss), "
            "2-12:00:00 (d-hh:mm:ss); a bare number is minutes, as in Slurm (--time 2: two minutes)",
        ),
        Opt(
            "--begin",
            metavar="WHEN",
            before_script=UNWAITED,
            help="start it no earlier than WHEN: 02:00 (the next 2 am), +2h or +1h30m (from now; a unit is needed), "
            "2026-12-03T02:00 (local time unless it gives an offset), now",
        ),
        Opt(
            "--snapshot",
            kind=FLAG,
            help="copy the git repository's tracked files (with uncommitted changes) now: the job runs this code",
        ),
        Opt(
            "--gpus",
            convert=gpu_count,
            default=1,
            metavar="N",
            help="how many GPUs it needs (default 1; 0: a CPU job, which runs beside GPU jobs)",
        ),
        Opt(
            "--notify",
            kind=NOTIFY,
            help="a desktop notification when it ends (notify-send); --notify URL: its events sent to URL "
            "through Apprise (ntfy://, tgram://, slack://, discord://, mailto://, json://...; repeatable)",
        ),
        Opt("--notify-url", kind=APPEND, help=HIDDEN),  # where `--notify URL` puts its URLs
        Opt(
            "--max-log-size",
            metavar="SIZE",
            help="cap its log (e.g. 1G): keep its head and newest tail, cut the middle",
        ),
        Opt(
            "--on-finish",
            metavar="CMD",
            help="a shell command run when it ends (GPUQ_EVENT=finished) and when it is stuck or leaves its GPU "
            "idle (stuck, gpu_idle), with GPUQ_JOB_ID, _NAME, _STATE, _EXIT_CODE, _LOG set",
        ),
        Opt(
            "--gpu-mem",
            metavar="SIZE",
            help="the GPU memory it needs (e.g. 20G): jobs that say so share a GPU while they fit",
        ),
        Opt(
            "--mem",
            metavar="SIZE",
            help="the host memory it reserves while it runs (e.g. 32G): it starts when that much is free",
        ),
        Opt(
            "--cpus",
            convert=cpu_count,
            metavar="N",
            help="the CPUs it reserves while it runs: it starts when that many are free",
        ),
        Opt(
            "--priority",
            convert=int,
            default=0,
            metavar="N",
            before_script=IN_TURN,
            help="higher starts first (default 0)",
        ),
        Opt(
            "--urgent",
            kind=CONST,
            const=True,
            default=False,
            before_script=IN_TURN,
            help="start next; if no slot is free, preempt the lowest-priority running job that can continue "
            "(--preemptible, or with a checkpoint) and resume it after; if none can, wait for a free slot",
        ),
        Opt(  # one word, so that `--urgent train.py` keeps meaning what it always did
            "--urgent=force",
            dest="urgent",
            kind=CONST,
            const="force",
            default=False,
            before_script=IN_TURN,
            help="as --urgent, but preempt a running job even if it has no checkpoint (it will start over)",
        ),
        Opt(
            "--preemptible",
            kind=FLAG,
            help="save a checkpoint when preempted (HF Trainer >= 5: adds --enable_jit_checkpoint true)",
        ),
        Opt("--ckpt-glob", metavar="GLOB", help="where its checkpoints are (default: HF checkpoint-N)"),
        Opt(
            "--keep-checkpoints",
            convert=parse_keep,
            metavar="N|best|all",
            help="keep only its newest N complete checkpoints (best: the newest and the best by its metric; "
            "all: every one), removing older ones while it runs and when it ends "
            "(default: keep_checkpoints in the config file)",
        ),
        Opt(
            "--min-free",
            metavar="SIZE",
            help="start it only while its output's filesystem has SIZE free (default: twice its last checkpoint)",
        ),
        Opt(
            "--no-resume",
            kind=FLAG,
            help="never continue it from its checkpoints (recover, retry and resume start it over)",
        ),
        Opt(
            "--resume-arg",
            metavar="TEMPLATE",
            help="how `gpuq resume` passes the checkpoint (default: '--resume_from_checkpoint {ckpt}')",
        ),
        Opt(
            "-e",
            "--env",
            kind=APPEND,
            convert=env_pair,
            metavar="KEY=VALUE",
            help="extra environment variable for the job (repeatable)",
        ),
        Opt("-q", "--quiet", kind=FLAG, help="print only the new job id"),
        Opt(
            "--dry-run",
            kind=FLAG,
            before_script="be queued and run for real",
            help="print what would be queued and whether it would start; write nothing",
        ),
        Opt("--json", kind=FLAG, help="with --dry-run: print it as JSON"),
        Opt(
            "cmd",
            nargs=REST,
            metavar="SCRIPT [ARGS...]",
            help="a .py file, or any command (bash, torchrun, ...), and its arguments, passed verbatim",
        ),
    ),
)

RUN = Command(
    "run",
    handler="cmd_worker:cmd_run",
    help="start a worker",
    description="Run queued jobs, one at a time per slot.",
    options=(
        Opt("--watch", kind=FLAG, group="mode", help="stay up and wait for new jobs"),
        Opt("--daemon", kind=FLAG, group="mode", help="start a resident background worker and return"),
        Opt(
            "--gpus",
            metavar="LIST",
            setting="gpus",
            read=gpu_labels,
            help="use only these GPUs (e.g. 0,2; default: every GPU found). Workers with disjoint --gpus "
            "can share a spool. Without GPUs: one slot per listed label",
        ),
        Opt(
            "--foreign-mem-threshold",
            metavar="SIZE",
            setting="foreign_threshold_mib",
            read=parse_memory_mib,
            help="memory that processes outside gpuq may hold on a GPU before a whole-GPU job waits for it "
            "(default 1G)",
        ),
        Opt(
            "--recover",
            kind=FLAG,
            setting="recover",
            help="first put interrupted jobs back in the queue (after a reboot), each from its newest checkpoint",
        ),
        Opt(
            "--notify",
            kind=NOTIFY,
            setting="notify",
            help="a desktop notification whenever a job ends; --notify URL: every job's events sent to URL "
            "(see `add --notify`; default: GPUQ_NOTIFY, else notify in ~/.config/gpuq/config.toml)",
        ),
        Opt("--notify-url", kind=APPEND, setting="notify_urls", help=HIDDEN),
        Opt(
            "--max-log-size",
            metavar="SIZE",
            setting="max_log_bytes",
            read=parse_typed_bytes,
            help="cap every job's log (a job's own cap comes first)",
        ),
        Opt(
            "--default-time",
            metavar="LIMIT",
            setting="default_time",
            read=parse_duration,
            help="the time limit of jobs without their own --time (4h, 90m; a bare number is minutes)",
        ),
        Opt(
            "--kill-grace",
            metavar="SECONDS",
            setting="kill_grace",
            read=grace_seconds,
            help="when a job ends, what is left of its process group gets SIGTERM, then SIGKILL after this "
            "(default 10)",
        ),
        # what jobs may reserve of the machine in all (engine/schedule/hostroom.py)
        Opt(
            "--mem",
            metavar="SIZE",
            setting="host_mem_mib",
            read=parse_memory_mib,
            help="host memory jobs may reserve in all with `add --mem` "
            "(default: the machine's, less GPUQ_HOST_MEM_MARGIN)",
        ),
        Opt(
            "--cpus",
            metavar="N",
            setting="host_cpus",
            read=cpu_total,
            help="CPUs jobs may reserve in all with `add --cpus` (default: those the worker may run on)",
        ),
        Opt(
            "--on-finish",
            metavar="CMD",
            setting="on_finish",
            help="a shell command run whenever a job ends, is stuck or leaves its GPU idle (see `add --on-finish`)",
        ),
        Opt("--ready-fd", convert=int, help=HIDDEN),  # the background worker tells its starter it holds its locks
    ),
)
