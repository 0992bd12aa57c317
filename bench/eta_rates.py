"""Other ways to take a running job's rate, replayed on looks `eta_accuracy.py` recorded.

Each variant replaces `eta.rate_of` (and, with `--paced-tail`, `eta.tail_seconds`) for the replay
only, then scores every recording as `eta_accuracy.py --from-raw` does (its `score`): median, p90
and worst error per load. gpuq itself is not changed.

    python bench/eta_rates.py bench/eta_raw_2hogs_1200_a.json bench/eta_raw_2hogs_3000.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eta_accuracy  # noqa: E402

from gpuq.engine.tracking import eta  # noqa: E402

Points = list[tuple[float, float]]
Rate = tuple[Optional[float], str]


def _between(a: tuple[float, float], b: tuple[float, float]) -> Rate:
    if b[0] - a[0] < eta.MIN_SPAN or b[1] <= a[1]:
        return None, ""
    return (b[1] - a[1]) / (b[0] - a[0]), ""


def _slope(points: Points) -> Rate:
    """Least-squares steps per second."""
    if len(points) < 2:
        return None, ""
    mt = sum(t for t, _ in points) / len(points)
    ms = sum(s for _, s in points) / len(points)
    num = sum((t - mt) * (s - ms) for t, s in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return (num / den, "") if den > 0 and num > 0 else (None, "")


def _last_half(points: Points) -> Points:
    if len(points) < 2:
        return points
    cut = points[-1][0] - (points[-1][0] - points[0][0]) / 2
    recent = [p for p in points if p[0] >= cut]
    return recent if len(recent) >= 3 else points


BLEND = eta.rate_of
VARIANTS: dict[str, Callable[..., Rate]] = {
    "gpuq (blend)": BLEND,
    "window alone": lambda points, _w=None: BLEND(points, 1.0),
    "mean since first": lambda points, _w=None: BLEND(points, 0.0),
    "last half": lambda points, _w=None: _between(_last_half(points)[0], points[-1]) if points else (None, ""),
    "least squares": lambda points, _w=None: _slope(points),
    "least squares, last half": lambda points, _w=None: _slope(_last_half(points)),
}


def paced_tail(run: Optional[eta.Attempt], rate: Optional[float]) -> float:
    """The learned tail always at the job's pace (gpuq keeps the seconds within PACE_BAND)."""
    if run is None or run.tail is None:
        return 0.0
    return run.tail_steps / rate if rate and run.tail_steps else run.tail


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", type=Path, nargs="+", help="looks recorded by eta_accuracy.py --raw")
    ap.add_argument("--paced-tail", action="store_true", help="also scale the tail to the pace always")
    args = ap.parse_args(argv)
    if args.paced_tail:
        eta.tail_seconds = paced_tail
    print("| recording | rate | load: median / p90 / worst |\n|---|---|---|")
    for path in args.raw:
        raw = json.loads(path.read_text())
        for name, variant in VARIANTS.items():
            eta.rate_of = variant
            scored = eta_accuracy.score(raw)
            cells = "; ".join(
                f"{load}: {eta_accuracy.stats(res['new']).replace(' |', ' /')}" for load, res in scored.items()
            )
            print(f"| {path.name} | {name} | {cells} |")
        eta.rate_of = BLEND
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
