"""The names a job's life is spelled with: its states (the directories job files sit in), the control
actions, where it came from. Spelled only here, so a typo is a NameError, not a silent miss; `TABLE`
holds what every display looks up per state, so a new state is one constant and one row here.
"""

# Real annotations, no future import: see test_the_everyday_commands_compile_no_source.
from typing import NamedTuple, Optional

from gpuq.core.job import Job

PENDING = "pending"
RUNNING = "running"
DONE = "done"
FAILED = "failed"
PREEMPTED = "preempted"
INTERRUPTED = "interrupted"
CANCELLED = "cancelled"
HELD = "held"  # `gpuq hold`: kept out of the queue until `gpuq release`
SLURM = "slurm"  # handed to a Slurm cluster (`gpuq slurm submit`); Slurm runs it, `gpuq slurm sync` records its end
HERE_ONLY = "cancelled here only"  # the first words of the note of a job its cluster could not be told of
RAY = "ray"  # handed to a Ray cluster (`gpuq ray submit`); Ray runs it, `gpuq ray sync` records its end


class State(NamedTuple):
    """One row of TABLE."""

    name: str  # the directory, and the word every display shows
    finished: bool  # ended for good: `gpuq clear` may remove it
    glyph: str  # the St column of `gpuq status`
    rank: int  # the state that stands for a sweep in `gpuq status`: the lowest of its jobs'
    shows_note: bool  # the Info cell of `gpuq status` ends with the job's `note`
    # For a state an attempt ends in (a run of `gpuq history`; an attempt that ends in pending/
    # failed and was retried): its name in the legend of `history --plot`, the colour of its
    # bars there, and its place in that legend.
    label: Optional[str] = None
    colour: Optional[str] = None
    legend: Optional[int] = None


# Every state a valid job can be in, in the order a job moves through them: when a crash leaves
# two copies with the same rev, the later one in this order is kept (engine/lifecycle/repairs.py).
# fmt: off
TABLE = (
    #     name         finished glyph rank  note   label              colour     legend
    State(PENDING,     False,   "⏳", 1,    False, "failed, retried", "#ff9896", 2),
    State(RUNNING,     False,   "🔄", 0,    False),
    State(DONE,        True,    "✅", 7,    False, "done",            "#2ca02c", 0),
    State(FAILED,      True,    "❌", 3,    True,  "failed",          "#d62728", 1),
    State(PREEMPTED,   False,   "💤", 5,    True,  "preempted",       "#ff7f0e", 4),
    State(INTERRUPTED, False,   "⚡", 4,    True,  "interrupted",     "#9467bd", 5),
    State(CANCELLED,   True,    "🚫", 6,    True,  "cancelled",       "#7f7f7f", 3),
    State(HELD,        False,   "⏸️", 2,    True),
    State(SLURM,       False,   "🚀", 8,    False),
    State(RAY,         False,   "🛰️", 9,    False),
)
# fmt: on
BY_NAME = {state.name: state for state in TABLE}

STATES = tuple(state.name for state in TABLE)
FINISHED = tuple(state.name for state in TABLE if state.finished)  # (DONE, FAILED, CANCELLED)
UNFINISHED = tuple(state.name for state in TABLE if not state.finished)  # few files each, listed in full
ACTIVE = (PENDING, RUNNING)  # what the scheduler reads on every step
NEEDS_USER = (PREEMPTED, INTERRUPTED, HELD)  # stopped; only a person (resume, recover, release) moves them on
WAITING = (PENDING, HELD)  # queued and never started since: what `gpuq edit` may change
REJECTED = "rejected"  # not a state: the directory for dropped files that are not jobs

# Control requests left in control/ for a running job's supervisor, saying why it is signalled.
KILL = "kill"  # `gpuq kill`: the job ends in cancelled/
CANCEL = "cancel"  # `gpuq cancel` of a running job: killed, and it ends in cancelled/, said so
PREEMPT = "preempt"  # `gpuq preempt`: preempted/, until `gpuq resume`
PREEMPT_RESUME = "preempt-resume"  # the worker made room for an urgent job: resumed by itself
TIME_LIMIT = "time-limit"  # its supervisor stops it at its --time: only said, for `status` and `show`
KILL_ACTIONS = (KILL, CANCEL)  # the job ends in cancelled/
PREEMPT_ACTIONS = (PREEMPT, PREEMPT_RESUME)
ACTIONS = (KILL, CANCEL, PREEMPT, PREEMPT_RESUME)
# who asked, as each kill action's note says it
KILLED_BY = {KILL: "killed by user (gpuq kill)", CANCEL: "cancelled by user (gpuq cancel)"}

# the note `gpuq hold` leaves on a job it holds: a held row says "held" once, so displays leave it out
HELD_NOTE = "held by user (`gpuq release` puts it back in line)"

URGENT_FORCE = "force"  # `urgent` of a job queued with --urgent=force: it may preempt a job without a checkpoint

# Where a job came from (its `source` field); a dropped file's is "dropped:" + its file name.
SOURCE_CLI = "cli"
SOURCE_ADOPT = "adopt"
SOURCE_DROPPED = "dropped:"
SOURCE_IMPORTED = "import:"  # + "sqlite" or "json": brought over from the original gpuq

SLURM_SUBMITTING = "SUBMITTING"  # the `slurm.state` of a pending job while sbatch is being asked


def why_ended(state: str, reason: Optional[str], note: Optional[str]) -> Optional[str]:
    """Why a job, or one attempt, ended in `state`, as status, `history ID` and notifications say it:
    its failure's reason (an attempt retried after one ended in pending/), then its note where
    `state` shows one (a preemption's cause, a kill), a time or host memory limit said once."""
    said = [reason] if reason and state in (FAILED, PENDING) else []
    limits = ("time limit", "host memory limit")
    if note and BY_NAME[state].shows_note and not (reason and any(w in note and w in reason for w in limits)):
        said.append(note)
    return "; ".join(said) or None


def handing_over(job: Job) -> bool:
    """Whether a pending job is marked by a hand-over to Slurm under way (it never starts here). Here,
    not in transitions, because the scheduler asks it on `gpuq status`'s path."""
    mark = job.slurm
    return isinstance(mark, dict) and mark.get("state") == SLURM_SUBMITTING
