"""The options of the `gpuq` command line as data: what a command and an option are, `add`,
`status` and `eta` (the commands cli/quick.py reads without argparse), and where gpuq's own options end
on an `add` line. cli/commands.py lists every command, these two included; parser.py builds
argparse's parser from that list, and quick.py reads with the same entries, so a spelling, a
default or a converter is written once.

A `Command` names its handler as "module:function" of gpuq.cli, imported only when it runs; its
`Opt`s are in the order `--help` lists them. A converter raises ValueError with a one-line message:
parser.py hands it to argparse, quick.py leaves such a line to argparse.

Plain classes with __slots__ and no typing at run time: every `gpuq status` and `gpuq add` imports
this module (bench/PROFILE.md, section 1).
"""

from __future__ import annotations

from gpuq.core.states import ACTIVE

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator, Optional

# what an option does with what follows it
VALUE = "value"  # takes a value (or, for a positional, the word)
FLAG = "flag"  # True when given
CONST = "const"  # `const` when given
APPEND = "append"  # takes a value each time it is given; a list
REST = "..."  # nargs of the positional that takes every word from there on (argparse.REMAINDER)
HIDDEN = "==SUPPRESS=="  # the help of an option `--help` does not show (argparse.SUPPRESS)
NOTIFY_URL = "--notify-url"  # `--notify URL` and `--notify=URL` as both readings see them (spell_notify_urls)


class Opt:
    """One option (`-d`, `--dir`) or positional (`script`) of a command."""

    __slots__ = ("flags", "dest", "kind", "convert", "default", "const", "metavar", "nargs", "choices", "help")
    __slots__ += ("group", "dash_value", "setting", "read", "before_script")

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
        read: Optional[Callable[[str, str], Any]] = None,
        before_script: Optional[str] = None,
    ) -> None:
        self.flags, self.kind, self.convert, self.const = flags, kind, convert, const
        self.default = default
        self.metavar, self.nargs, self.choices, self.help = metavar, nargs, choices, help
        self.dest = dest or flags[-1].lstrip("-").replace("-", "_")  # argparse's: the long spelling, last
        self.group = group  # options of one group exclude each other
        self.dash_value = dash_value  # its value may start with "-" (`--slurm-opt --time=4:00:00`)
        self.setting = setting  # `gpuq run`: the worker's Settings field it sets (forwarded to a --daemon)
        self.read = read  # `gpuq run`: (text, flag) -> the setting's value; ValueError for bad text
        # `add`'s options whose loss would change whether or when the job runs (dependencies,
        # scheduling, --dry-run): what the job would do if the script got the option instead of
        # gpuq (the original gpuq's `add eval.py --after 1`). After SCRIPT such an option is
        # refused with this said; any other of gpuq's options there only gets a note. A new
        # option of that kind sets it too.
        self.before_script = before_script

    @property
    def positional(self) -> bool:
        return not self.flags[0].startswith("-")

    @property
    def takes_value(self) -> bool:
        return not self.positional and self.kind in (VALUE, APPEND)

    def initial(self) -> Any:
        """The value when not given (a new list for an option that appends)."""
        return [] if self.kind == APPEND else False if self.kind == FLAG else self.default


class Command:
    """A command (`add`, or its other name `enqueue`), or with `actions` a group of them (`slurm`)."""

    __slots__ = ("names", "handler", "help", "description", "options", "actions", "id_states", "_by_flag")

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
        # the states of the jobs its job ids may name: shell completion offers only their ids
        # (`gpuq _ids --state ...`); None: any job's
        self.id_states = id_states
        self._by_flag: Optional[dict[str, Opt]] = None

    def option(self, flag: str) -> Optional[Opt]:
        """The option spelled `flag` (exactly: no abbreviation, no `=VALUE`), or None."""
        if self._by_flag is None:
            self._by_flag = {s: opt for opt in self.options for s in opt.flags if s.startswith("-")}
        return self._by_flag.get(flag)


# ---- value converters ------------------------------------------------------------------------


def ids(text: str) -> list[int]:
    """Job ids: `12`, `3,5`, ranges `12-17` (a whole sweep)."""
    from gpuq.core.sweep import parse_id_ranges  # re and collections: not on a plain `status`'s path

    return parse_id_ranges(text)


def env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 3600:
        raise ValueError(f"not a number of seconds from 0.1 to 3600: {text!r}")
    return value


def positive_id(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise ValueError(f"not a job id: {text!r}")
    return int(text)


def notify_urls(values: list[str], _flag: str = "") -> list[str]:
    """`--notify URL`s, each once; ValueError for one that is not SCHEME://... (checked here and
    not by argparse, which would name the option as spell_notify_urls spells it)."""
    from gpuq.core.job import is_url  # (the job record; `add` loads it anyway, `status` never gets here)

    for url in values:
        if not is_url(url):
            raise ValueError(f"--notify: not a URL such as ntfy://my-topic: {url!r}")
    return list(dict.fromkeys(values))


def gpu_count(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"not a number of GPUs: {text!r}")
    return int(text)


def cpu_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"not a number of CPUs (1 or more): {text!r}")
    return int(text)


# what a job would do if the script got one of these options (Opt.before_script)
UNWAITED = "start without waiting"
IN_TURN = "wait its turn"

# ---- the two commands quick.py reads too (commands.py lists them with the others) --------------

ADD = Command(
    "add",
    "enqueue",
    handler="cmd_queue:cmd_add",
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
            kind=APPEND,
            convert=ids,
            metavar="ID",
            before_script=UNWAITED,
            help="start only after job ID finished successfully (repeatable, ID,ID, or a range 12-17)",
        ),
        Opt(
            "--after-any",
            kind=APPEND,
            convert=ids,
            metavar="ID",
            before_script=UNWAITED,
            help="start after job ID ended, whatever its result",
        ),
        Opt("--retries", convert=int, default=0, metavar="N", help="run again up to N times if it fails"),
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
            kind=FLAG,
            help="a desktop notification when it ends (notify-send); --notify URL: its events sent to URL "
            "through Apprise (ntfy://, tgram://, slack://, discord://, mailto://, json://...; repeatable)",
        ),
        Opt(NOTIFY_URL, kind=APPEND, help=HIDDEN),  # `--notify URL`, as spell_notify_urls reads it
        Opt(
            "--max-log-size",
            metavar="SIZE",
            help="cap its log (e.g. 1G): keep its head and newest tail, cut the middle",
        ),
        Opt(
            "--on-finish",
            metavar="CMD",
            help="a shell command run when it ends, with GPUQ_JOB_ID, _NAME, _STATE, _EXIT_CODE, _LOG set",
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
        Opt("script", metavar="SCRIPT", help="a .py file, or any command (bash, torchrun, ...)"),
        Opt("args", nargs=REST, metavar="ARGS", help="passed to SCRIPT verbatim"),
    ),
)

STATUS = Command(
    "status",
    handler="cmd_view:cmd_status",
    help="show the queue",
    options=(
        Opt("-a", "--all", kind=FLAG, help="every finished job, not only the recent ones"),
        Opt("--json", kind=FLAG, group="look", help="machine-readable list of jobs"),
        Opt("--watch", kind=FLAG, group="look", help="a live view, redrawn in place until Ctrl-C"),
        Opt("--interval", convert=interval, default=2.0, metavar="S", help="with --watch: redraw every S seconds"),
    ),
)

ETA = Command(
    "eta",
    handler="cmd_view:cmd_eta",
    help="progress and expected end of running jobs, expected start of pending ones",
    id_states=ACTIVE,
    options=(Opt("id", convert=positive_id, nargs="?", help="one job (default: every running and pending job)"),),
)

# ---- where gpuq's own options end on an `add` line --------------------------------------------


def spell_notify_urls(command: Command, words: list[str]) -> list[str]:
    """`--notify URL` (the next word has `://`, and is no option) and `--notify=URL` among gpuq's options at the start
    of `words` (up to `--` or SCRIPT), each as `--notify-url URL`. A plain `--notify` stays the
    desktop notification: `gpuq add --notify python train.py` keeps meaning what it always did."""
    out, i = [], 0
    while i < len(words):
        word = words[i]
        if word == "--" or not word.startswith("-") or word == "-":
            return out + words[i:]
        following = words[i + 1] if i + 1 < len(words) else "-"
        if word == "--notify" and "://" in following and not following.startswith("-"):
            out += [NOTIFY_URL, words[i + 1]]
            i += 2
            continue
        if word.startswith("--notify="):
            out += [NOTIFY_URL, word[len("--notify=") :]]
            i += 1
            continue
        opt = command.option(word)
        step = 2 if opt is not None and opt.takes_value else 1
        out += words[i : i + step]
        i += step
    return out


def split_at_script(command: Command, words: list[str]) -> tuple[list[str], list[str]]:
    """`add`'s words split at SCRIPT: gpuq's options before it, the job's words from it on (a `--`
    between them dropped)."""
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return words[:i], words[i + 1 :]
        opt = command.option(word)
        if opt is not None and opt.takes_value:
            i += 2
        elif word.startswith("-") and word != "-":
            i += 1
        else:
            return words[:i], words[i:]
    return words, []


def misplaced_option(command: Command, words: list[str]) -> list[str]:
    """The first of gpuq's own long options among the job's words, with its value: most likely
    meant for gpuq (the original gpuq took them from anywhere on the line). parser.py notes it, or
    refuses the line if it is one of `late_options`; quick.py leaves such a line to parser.py."""
    for _at, found, _opt in _own_options(command, words):
        return found
    return []


def late_options(command: Command, words: list[str]) -> list[tuple[int, list[str], Opt]]:
    """gpuq's dependency and scheduling options (Opt.before_script) among the job's words: (where,
    the option with its value, the option). The job would run without them: parser.py refuses.
    With a late --dry-run, a late --json (which goes only with it) is moved with it."""
    own = [(at, found, opt) for at, found, opt in _own_options(command, words) if opt is not None]
    late = [(at, found, opt) for at, found, opt in own if opt.before_script]
    if any(opt.dest == "dry_run" for _at, _found, opt in late):
        late = [(at, found, opt) for at, found, opt in own if opt.before_script or opt.dest == "json"]
    return late


def _own_options(command: Command, words: list[str]) -> Iterator[tuple[int, list[str], Optional[Opt]]]:
    """Each of gpuq's own long options among `words`, in order: (where, the option with its value,
    the option; None for `--help`)."""
    i = 0
    while i < len(words):
        word = words[i]
        name = word.split("=", 1)[0]
        opt = command.option(name) if word.startswith("--") and word != "--help" else None
        if name == "--help" and word != "--help":
            yield i, [word], None
        elif opt is not None and opt.takes_value and "=" not in word:
            yield i, words[i : i + 2], opt
            i += 1  # its value is not an option, whatever it looks like
        elif opt is not None:
            yield i, [word], opt
        i += 1
