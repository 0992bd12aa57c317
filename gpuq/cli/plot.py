"""`gpuq history --plot FILE`: a timeline of runs, one lane per GPU. matplotlib (an optional extra)
is imported only by `figure`; its object API (no pyplot) never opens a display.
"""

from __future__ import annotations

import os
from collections import defaultdict
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any, Optional, Sequence

from gpuq.core.errors import GpuqError
from gpuq.core.states import PREEMPTED, TABLE
from gpuq.core.words import plural
from gpuq.engine.views.history import PastRun
from gpuq.system.extras import install_command

FORMATS = (".png", ".svg")
MISSING = "history --plot needs matplotlib"  # and the command that installs it (system/extras.py)
# Attempt outcome -> (legend label, colour), in legend order: the states an attempt ends in.
OUTCOMES = {s.name: (s.label, s.colour) for s in sorted((s for s in TABLE if s.label), key=lambda s: s.legend or 0)}
OTHER = ("other", "#bcbd22")
BAR_GID = "gpuq-run"  # SVG id of each bar: gpuq-run-JOB-N-LANE, N the job's Nth run by start time
MIN_WIDTH_FRACTION = 0.001  # a 2-second failure stays visible on a week-long axis
BAND_GID = "gpuq-gpu-use"  # SVG id of the utilisation bands (one collection)
BAND_HEIGHT = 0.45  # inside a bar of 0.7: the outcome's colour stays visible above and below
CMAP = "Blues"  # sequential, and a hue no outcome uses: idle is near white, busy dark blue
# (job id, run start) -> per GPU lane: (start, end, utilisation %) spans (engine/tracking/gpuseries)
Utilisation = dict[tuple[int, float], dict[str, list[tuple[float, float, float]]]]


class PlotUnavailable(GpuqError, ImportError):
    """matplotlib is not installed."""


def plot(
    runs: Sequence[PastRun], path: str, title: Optional[str] = None, utilisation: Optional[Utilisation] = None
) -> None:
    """Bars coloured by the attempt's outcome, adopted runs hatched (approximate times), markers where
    a preemption stopped and resumed a job, a band inside a bar for its GPU utilisation."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise ValueError(f"history --plot {path}: the file name must end in .png or .svg")
    figure(runs, title, utilisation).savefig(path, format=suffix[1:], dpi=100)


def figure(runs: Sequence[PastRun], title: Optional[str] = None, utilisation: Optional[Utilisation] = None) -> Any:
    try:
        from matplotlib import collections, colors, dates, figure, lines, patches  # the plot extra: here only
    except ImportError:
        raise PlotUnavailable(f"{MISSING}: {install_command('plot')}") from None
    mpl = SimpleNamespace(
        collections=collections, colors=colors, dates=dates, figure=figure, lines=lines, patches=patches
    )
    lanes = lane_order(runs)
    given = utilisation or {}
    shaded = {key: given[key] for key in ((r.job_id, r.start) for r in runs) if key in given}  # what is drawn
    colour_bar = 0.7 if shaded else 0.0  # room for it below the time axis
    fig = mpl.figure.Figure(figsize=(12, 1.6 + colour_bar + 0.45 * max(1, len(lanes))), layout="constrained")
    ax = fig.add_subplot()
    if runs:
        _draw(ax, runs, lanes, mpl, shaded)
    else:
        ax.text(0.5, 0.5, "no finished runs in this period", ha="center", va="center", transform=ax.transAxes)
        ax.set_yticks([])
        ax.set_xticks([])
    hours = sum(run.gpu_hours for run in runs)
    ax.set_title(title or f"gpuq history: {plural(len(runs), 'run')}, {hours:.1f} GPU-hours")
    return fig


def lane_order(runs: Sequence[PastRun]) -> list[str]:
    names = {lane for run in runs for lane in run.lanes}
    gpus = sorted(
        (n for n in names if n not in ("machine", "cpu")),
        key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n),
    )
    return gpus + [n for n in ("machine", "cpu") if n in names]


def _draw(ax: Any, runs: Sequence[PastRun], lanes: list[str], mpl: Any, shaded: Utilisation) -> None:
    mdates = mpl.dates
    tz = datetime.now(timezone.utc).astimezone().tzinfo  # show local time, as `gpuq status` does
    row = {lane: index for index, lane in enumerate(lanes)}

    def num(stamp: float) -> float:
        return float(mdates.date2num(datetime.fromtimestamp(stamp, timezone.utc)))

    shown = _draw_bars(ax, runs, row, num)
    markers = _mark_preemptions(ax, runs, row, num)
    bands = _draw_bands(ax, runs, row, num, shaded, mpl)
    if bands is not None:
        ax.figure.colorbar(bands, ax=ax, location="bottom", shrink=0.3, aspect=40, label="GPU utilisation %")
    ax.set_yticks(range(len(lanes)), [lane if lane in ("machine", "cpu") else f"GPU {lane}" for lane in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.5)  # first GPU at the top
    locator = mdates.AutoDateLocator(tz=tz)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=tz))
    ax.grid(axis="x", alpha=0.3)
    plain = bands is not None and any(run.gpu_count and (run.job_id, run.start) not in shaded for run in runs)
    _legend(ax, shown, markers, any(run.adopted for run in runs), bands is not None, plain, mpl)


def _draw_bars(ax: Any, runs: Sequence[PastRun], row: dict[str, int], num: Any) -> list[str]:
    """The outcomes drawn, in legend order."""
    span = max(run.end for run in runs) - min(run.start for run in runs)
    min_days = span * MIN_WIDTH_FRACTION / 86400.0
    # Bar ids number a job's runs by start time: attempt numbers repeat after a retry or recovery
    # resets the job's `attempts`, and SVG ids must be unique.
    number: dict[int, int] = {}
    seen: dict[int, int] = defaultdict(int)
    for run in sorted(runs, key=lambda r: r.start):
        seen[run.job_id] += 1
        number[id(run)] = seen[run.job_id]
    bars: dict[str, list[tuple[PastRun, str]]] = defaultdict(list)
    for run in runs:
        bars[run.outcome] += [(run, lane) for lane in run.lanes]
    order = sorted(bars, key=lambda outcome: (list(OUTCOMES).index(outcome) if outcome in OUTCOMES else 99, outcome))
    # One barh call per outcome rather than one per bar: thousands of runs stay a few seconds.
    for outcome in order:
        items = bars[outcome]
        container = ax.barh(
            [row[lane] for _, lane in items],
            [max(run.seconds / 86400.0, min_days) for run, _ in items],
            left=[num(run.start) for run, _ in items],
            height=0.7,
            color=OUTCOMES.get(outcome, OTHER)[1],
        )
        for patch, (run, lane) in zip(container.patches, items):
            patch.set_gid(f"{BAR_GID}-{run.job_id}-{number[id(run)]}-{lane}")
            if run.adopted:
                patch.set_hatch("//")
    return order


def _draw_bands(ax: Any, runs: Sequence[PastRun], row: dict[str, int], num: Any, shaded: Utilisation, mpl: Any) -> Any:
    """One collection: thousands of spans stay quick."""
    boxes, values = [], []
    for run in runs:
        series = shaded.get((run.job_id, run.start)) or {}
        for lane in run.lanes:
            low, high = row[lane] - BAND_HEIGHT / 2, row[lane] + BAND_HEIGHT / 2
            for start, end, util in series.get(lane, ()):
                left, right = num(start), num(end)
                boxes.append(((left, low), (left, high), (right, high), (right, low)))
                values.append(util)
    if not boxes:
        return None
    norm = mpl.colors.Normalize(0, 100)
    bands = mpl.collections.PolyCollection(boxes, array=values, cmap=CMAP, norm=norm, edgecolors="none", zorder=2)
    bands.set_gid(BAND_GID)
    ax.add_collection(bands)
    return bands


def _mark_preemptions(ax: Any, runs: Sequence[PastRun], row: dict[str, int], num: Any) -> list[tuple[str, str]]:
    by_job: dict[int, list[PastRun]] = defaultdict(list)  # each job's runs by start time
    for run in sorted(runs, key=lambda r: r.start):
        by_job[run.job_id].append(run)
    stops: list[tuple[float, int]] = []
    resumes: list[tuple[float, int]] = []
    for attempts in by_job.values():
        for earlier, later in zip(attempts, attempts[1:] + [None]):
            if earlier.outcome != PREEMPTED:
                continue
            stops += [(num(earlier.end), row[lane]) for lane in earlier.lanes]
            if later is not None:
                resumes += [(num(later.start), row[lane]) for lane in later.lanes]
    drawn = []
    for points, marker, label, gid in (
        (stops, "v", "preempted here", "gpuq-preempt"),
        (resumes, ">", "resumed", "gpuq-resume"),
    ):
        if points:
            xs, ys = zip(*points)
            ax.scatter(xs, ys, marker=marker, s=40, color="black", zorder=3, gid=gid)
            drawn.append((marker, label))
    return drawn


def _legend(
    ax: Any, outcomes: list[str], markers: list[tuple[str, str]], adopted: bool, banded: bool, plain: bool, mpl: Any
) -> None:
    # Handles made here, not taken from the bars: a hatched (adopted) first bar must not make
    # its whole outcome look hatched in the legend.
    Line2D, Patch = mpl.lines.Line2D, mpl.patches.Patch
    handles: list[Any] = [Patch(color=OUTCOMES.get(o, OTHER)[1], label=OUTCOMES.get(o, OTHER)[0]) for o in outcomes]
    handles += [Line2D([], [], marker=m, color="black", linestyle="none", label=label) for m, label in markers]
    if adopted:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="adopted (times approximate)"))
    if banded:
        handles.append(Patch(facecolor="#6baed6", label="inner band: GPU utilisation"))
    if plain:
        handles.append(Patch(visible=False, label="plain bar: no GPU record"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
