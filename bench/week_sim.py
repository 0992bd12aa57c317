"""The week of `week.py` in simulation: the same trace, gpuq's own placement code, no processes.

Each step hands the ready jobs, in queue order, to `placement.place_in_order` over 4 simulated
80 GB GPUs and the jobs holding them, as the worker's planner does; time jumps from one event to the
next (a job ends, dies of out-of-memory, or an urgent one arrives). A job that needs twice what it
asks dies at 30% of its run and is queued again at its place with twice the share, going on from its
checkpoint (the last 80%), as `--retry-oom` does in the real week; urgent jobs go first in line. Not
simulated: the worker crash (its jobs go on through it), preemption (the real week preempts none).

What it is for: trying a scheduling rule over many weeks in seconds before spending minutes of a
real one. The real week is the measure; this only ranks rules. Each trial jitters every duration by
+-3% and delays each start by a time drawn from `--delay` (default 0.05-0.3 s: gpuq's hand-over
from `add` to a job's first instruction is about 0.05 s in bench/RESULTS.md, the rest allows for a
busy machine); `--stagger` queues job N at N x stagger seconds, as one `gpuq add` after another
does (about 0.05 s each here).

Rules (`--rule`, each changing one choice of gpuq's placement for the run):
  current          gpuq as it is
  keep-freest      the first in line keeps the GPUs with the most free memory
  keep-fullest     ... the least free memory (least room unused while they empty)
  keep-fewest      ... the fewest gpuq jobs
  keep-oldest      ... whose oldest job started first (rather than whose newest did)
  fit-worst        a shared job goes where the most memory is free (rather than the best fit)
  fit-first        ... on the lowest-numbered GPU where it fits
  order-longest    the queue in order of duration, longest first (an oracle: gpuq knows no durations)
  backfill-known   Slurm's backfill with every duration known (an oracle): a job behind the first in
                   line may start where it ends before the jobs already there

    python bench/week_sim.py [--rule current ...] [--seeds 7,1,2,3] [--trials 10] [--stagger 0.05]
                             [--delay 0.05,0.3]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import week  # noqa: E402

from gpuq.engine.schedule import placement  # noqa: E402
from gpuq.engine.schedule.placement import Blocked, Holding, Placement, Request  # noqa: E402
from gpuq.engine.schedule.scheduler import BEHIND  # noqa: E402
from gpuq.system.gpus import Gpu  # noqa: E402

MIB = 1024  # MiB in a GiB
OOM_AT, RESUMED = 0.3, 0.8  # dies at 30% of its run; a retry goes on from the checkpoint at 20%
MAX_DELAY = 0.3  # the longest start-up delay drawn by default (`--delay`)


def simulate(
    jobs: list[week.Job],
    delay: Callable[[], float],
    stagger: float,
    order: Callable[[Any], Any],
    backfill: bool = False,
) -> float:
    """The makespan of one simulated week (`backfill`: see `_backfill_known`)."""
    bound = week.lower_bound(jobs)
    expected = max(bound[1], bound[2])
    gpus = [Gpu(i, "Fake 80GB", f"GPU-{i}", week.GPU_GB * MIB, 0, ()) for i in range(week.GPUS)]
    asked = {j.id: j.asked for j in jobs}
    left = {j.id: 1.0 for j in jobs}
    arrives = {j.id: j.id * stagger if j.urgent_at is None else j.urgent_at * expected for j in jobs}
    done: set[int] = set()
    running: dict[int, tuple[tuple[int, ...], float, float, bool]] = {}  # id -> gpus, start, end, dies
    events = sorted((at, jid) for jid, at in arrives.items() if at > 0)
    heapq.heapify(events)
    now = 0.0
    while len(done) < len(jobs):
        ready = [
            j for j in jobs
            if j.id not in done and j.id not in running and arrives[j.id] <= now + 1e-9
            and (j.after is None or j.after in done)
        ]  # fmt: skip
        urgent = sorted((j for j in ready if j.urgent_at is not None), key=lambda j: arrives[j.id])
        queue = urgent + sorted((j for j in ready if j.urgent_at is None), key=order)
        requests = [(j.id, _request(asked[j.id])) for j in queue]
        holdings = [Holding(jid, g, _request(asked[jid]).gpu_mem_mib, since=s) for jid, (g, s, _, _) in running.items()]
        decisions = placement.place_in_order(requests, gpus, None, holdings)
        if backfill:
            lengths = {j.id: (OOM_AT if asked[j.id] < j.need else left[j.id]) * j.seconds for j in queue}
            _backfill_known(now, queue, decisions, lengths, running, gpus, holdings, asked)
        for job in queue:
            decision = decisions[job.id]
            if isinstance(decision, Placement):
                start = now + delay()
                dies = asked[job.id] < job.need
                end = start + (OOM_AT if dies else left[job.id]) * job.seconds
                running[job.id] = (decision.gpus, start, end, dies)
                heapq.heappush(events, (end, job.id))
        now = _next(events, running, done, asked, left)
    return now


def _backfill_known(
    now: float,
    queue: list[week.Job],
    decisions: dict[int, Any],
    lengths: dict[int, float],
    running: dict,
    gpus: list[Gpu],
    holdings: list[Holding],
    asked: dict[int, int],
) -> None:
    """Slurm's backfill, with every job's duration known (an oracle): a job waiting behind the first
    in line starts on any GPU where it fits and ends before every job already there (allowing the
    longest start-up delay), so no GPU empties later for it, the kept ones included."""
    started = [(jid, d.gpus) for jid, d in decisions.items() if isinstance(d, Placement)]
    held = holdings + [Holding(jid, on, _request(asked[jid]).gpu_mem_mib) for jid, on in started]
    busy_until: dict[int, float] = {}
    for gpus_held, _start, end, _dies in running.values():
        for index in gpus_held:
            busy_until[index] = max(busy_until.get(index, 0.0), end)
    for job in queue:
        decision = decisions[job.id]
        if not (isinstance(decision, Blocked) and decision.reason.startswith(BEHIND)):
            continue
        for index in sorted(busy_until, key=lambda i: busy_until[i]):
            if now + MAX_DELAY + lengths[job.id] > busy_until[index]:
                continue
            where = placement.place(_request(asked[job.id]), gpus, {index}, held)
            if isinstance(where, Placement):
                decisions[job.id] = where
                held.append(Holding(job.id, where.gpus, _request(asked[job.id]).gpu_mem_mib))
                break


def _request(asked_gb: int) -> Request:
    return Request(1, None if asked_gb >= week.GPU_GB else asked_gb * MIB)


def _next(events: list, running: dict, done: set[int], asked: dict[int, int], left: dict[int, float]) -> float:
    """Moves time to the next event and applies every event at that instant."""
    if not events:
        raise RuntimeError("nothing runs and nothing is due: the simulated week cannot end")
    now = events[0][0]
    while events and events[0][0] <= now + 1e-9:
        at, jid = heapq.heappop(events)
        if jid in running and running[jid][2] == at:
            dies = running.pop(jid)[3]
            if dies:
                asked[jid], left[jid] = asked[jid] * 2, RESUMED
            else:
                done.add(jid)
    return now


# -- the rules ------------------------------------------------------------------------------------


def _keep_by(key: Callable[[Any, float, float], Any]) -> Callable[..., set[int]]:
    """A `reserve` that keeps the GPUs first by `key(state, newest start, oldest start)`."""

    def reserve(request: Request, gpus: Any, allowed: Any, holdings: Any, *_: Any, **__: Any) -> set[int]:
        states = placement._states(sorted(gpus, key=lambda g: g.index), list(holdings), ())
        starts = {s.gpu.index: [h.since for h in holdings if s.gpu.index in h.gpus] for s in states}

        def order(s: Any) -> Any:
            here = starts[s.gpu.index]
            return key(s, max(here, default=-math.inf), min(here, default=math.inf))

        states.sort(key=order)
        return {s.gpu.index for s in states[: request.gpus]}

    return reserve


def _fit_by(key: Callable[[Any, int], Any]) -> Callable[..., Any]:
    """A shared placement that picks among the GPUs where the job fits by `key(state, need)`."""
    best_fit = placement._place_shared

    def place_shared(count: int, need: int, states: list, text: Any) -> Any:
        fits = [s for s in states if not s.whole and s.free_mib >= need]
        if len(fits) < count:
            return best_fit(count, need, states, text)
        return Placement(tuple(sorted(s.gpu.index for s in sorted(fits, key=lambda s: key(s, need))[:count])))

    return place_shared


RULES: dict[str, dict[str, Any]] = {
    "current": {},
    "keep-freest": {"reserve": _keep_by(lambda s, newest, oldest: (-s.free_mib, newest, s.gpu.index))},
    "keep-fullest": {"reserve": _keep_by(lambda s, newest, oldest: (s.free_mib, newest, s.gpu.index))},
    "keep-fewest": {"reserve": _keep_by(lambda s, newest, oldest: (len(s.jobs), newest, s.gpu.index))},
    "keep-oldest": {"reserve": _keep_by(lambda s, newest, oldest: (oldest, s.gpu.index))},
    "fit-worst": {"_place_shared": _fit_by(lambda s, need: (need - s.free_mib, s.gpu.index))},
    "fit-first": {"_place_shared": _fit_by(lambda s, need: (s.gpu.index,))},
    "order-longest": {"order": lambda j: -j.seconds},
    "backfill-known": {"backfill": True},
}


def trials(rule: str, seed: int, count: int, stagger: float, delay: tuple[float, float] = (0.05, 0.3)) -> list[float]:
    """The makespans over the lower bound of `count` jittered weeks of `seed` under `rule`."""
    changes = {k: v for k, v in RULES[rule].items() if k not in ("order", "backfill")}
    saved = {name: getattr(placement, name) for name in changes}
    rng = random.Random(1000 + seed)
    base = week.trace(seed, 1.0)
    bound = max(week.lower_bound(base)[1:])
    ratios = []
    try:
        for name, value in changes.items():
            setattr(placement, name, value)
        for _ in range(count):
            jobs = week.trace(seed, 1.0)
            for job in jobs:
                job.seconds *= rng.uniform(0.97, 1.03)
            order = RULES[rule].get("order", lambda j: j.id)
            backfill = RULES[rule].get("backfill", False)
            ratios.append(simulate(jobs, lambda: rng.uniform(*delay), stagger, order, backfill) / bound)
    finally:
        for name, value in saved.items():
            setattr(placement, name, value)
    return ratios


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rule", action="append", choices=sorted(RULES), help="rules to compare (default: all)")
    ap.add_argument("--seeds", default="7,1,2,3,4,5,6,8", help="traces, by seed (week.py replays seed 7)")
    ap.add_argument("--trials", type=int, default=10, help="jittered weeks per seed and rule")
    ap.add_argument("--stagger", type=float, default=0.05, help="seconds between one job's queueing and the next")
    ap.add_argument("--delay", default="0.05,0.3", help="LOW,HIGH: seconds from a job's placement to its start")
    args = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        low, high = (float(x) for x in args.delay.split(","))
    except ValueError:
        ap.error(f"--seeds: numbers separated by commas; --delay: LOW,HIGH (got {args.seeds!r}, {args.delay!r})")
    if args.trials < 1 or args.stagger < 0 or not 0 <= low <= high:
        ap.error("--trials >= 1, --stagger >= 0, --delay 0 <= LOW <= HIGH")
    weeks = f"{args.trials} jittered weeks (stagger {args.stagger} s, delay {low}-{high} s)"
    print(f"Median makespan / lower bound over {weeks}:\n")
    print("| rule | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |")
    print("|---|" + "---|" * (len(seeds) + 1))
    for rule in args.rule or list(RULES):
        medians = [statistics.median(trials(rule, seed, args.trials, args.stagger, (low, high))) for seed in seeds]
        cells = " | ".join(f"{m:.3f}" for m in medians)
        print(f"| {rule} | {cells} | {statistics.mean(medians):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
