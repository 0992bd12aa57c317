"""The names a job's life is spelled with: its states, the control actions, where it came from.

A state is the name of the directory a job file sits in (spool_layout.md, section 1); these
constants are the only place they are spelled, so a typo is a NameError, not a silent miss.
"""

from __future__ import annotations

PENDING = "pending"
RUNNING = "running"
DONE = "done"
FAILED = "failed"
PREEMPTED = "preempted"
INTERRUPTED = "interrupted"
CANCELLED = "cancelled"
HELD = "held"  # `gpuq hold`: kept out of the queue until `gpuq release`
SLURM = "slurm"  # handed to a Slurm cluster (`gpuq slurm submit`); Slurm runs it, `gpuq slurm sync` records its end

# Every state a valid job can be in, in the order a job moves through them: when a crash leaves
# two copies with the same rev, the later one in this order is shown (see engine.snapshot).
STATES = (PENDING, RUNNING, DONE, FAILED, PREEMPTED, INTERRUPTED, CANCELLED, HELD, SLURM)
FINISHED = (DONE, FAILED, CANCELLED)  # ended for good: `gpuq clear` may remove them
ACTIVE = (PENDING, RUNNING)  # what the scheduler reads on every step
NEEDS_USER = (PREEMPTED, INTERRUPTED, HELD)  # stopped; only a person (resume, recover, release) moves them on
WAITING = (PENDING, HELD)  # queued and never started since: what `gpuq edit` may change
REJECTED = "rejected"  # not a state: the directory for dropped files that are not jobs

# Control requests left in control/ for a running job's supervisor, saying why it is signalled.
KILL = "kill"  # `gpuq kill`: the job ends in cancelled/
PREEMPT = "preempt"  # `gpuq preempt`: preempted/, until `gpuq resume`
PREEMPT_RESUME = "preempt-resume"  # the worker made room for an urgent job: resumed by itself
PREEMPT_ACTIONS = (PREEMPT, PREEMPT_RESUME)
ACTIONS = (KILL, PREEMPT, PREEMPT_RESUME)

URGENT_FORCE = "force"  # `urgent` of a job queued with --urgent=force: it may preempt a job without a checkpoint

# Where a job came from (its `source` field); a dropped file's is "dropped:" + its file name.
SOURCE_CLI = "cli"
SOURCE_ADOPT = "adopt"
SOURCE_DROPPED = "dropped:"
SOURCE_IMPORTED = "import:"  # + "sqlite" or "json": brought over from the original gpuq

SLURM_SUBMITTING = "SUBMITTING"  # the `slurm.state` of a pending job while sbatch is being asked


def handing_over(job: dict) -> bool:
    """Whether a pending job is marked by a hand-over to Slurm that has not ended (a pending job in
    this sub-state never starts here; transitions.slurm_submitting sets it). Here, not in
    transitions, because the scheduler asks it on `gpuq status`'s path."""
    mark = job.get("slurm")
    return isinstance(mark, dict) and mark.get("state") == SLURM_SUBMITTING
