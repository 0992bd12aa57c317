"""`history --plot` shaded by GPU utilisation (issue 29): a recorded series as spans of time (pure),
the bands of the figure read back from its matplotlib artists, and a real worker's record drawn
by `gpuq history --plot`."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import Env, wait_for
from test_gpu_use import gpu_record, util_gpus
from test_gpu_worker import Gpus, add, fake_gpus, release
from test_history import T0, attempt, job

from gpuq.engine.tracking import gpuseries, gpuuse
from gpuq.engine.views import history
from gpuq.spool import Spool

PERIOD = 0.2  # GPUQ_GPU_SAMPLE_SECONDS in the end-to-end test


def recorded(gpus: list[int], started: float, samples: list[tuple[float, list]]) -> dict:
    one = gpuuse.new_attempt(gpus, started)
    for at, utils in samples:
        gpuuse.add_sample(one, at, utils, [1] * len(gpus))
    return one


def two_runs() -> list[history.PastRun]:
    """Job 1 on GPU 0 for the first hour; job 2 (no GPU detail) an hour later."""
    return history.runs(
        [("done", job(1, [attempt(0, 1, "done")], gpus=[0])), ("done", job(2, [attempt(2, 1, "done")]))]
    )


def test_a_series_becomes_spans_in_time_order() -> None:
    # GPU 1 (second in `gpus`): busy 4 s, idle 2 s, unknown for 2 s, idle again; the run ended at 1009
    one = recorded([3, 1], 1000.0, [(1002, [0, 100]), (1004, [0, 100]), (1006, [0, 0]), (1008, [0, None])])
    gpuuse.add_sample(one, 1010.0, [0, 0], [1, 1])
    expected = [(1000.0, 1004.0, 100.0), (1004.0, 1006.0, 0.0), (1008.0, 1009.0, 0.0)]
    assert gpuseries.spans(one, 1, end=1009.0) == expected
    # merged up to 5 s: the first span is the time-weighted mean of 4 s at 100% and 2 s at 0%
    first, second = gpuseries.spans(one, 1, end=1009.0, resolution=5.0)
    assert first[:2] == (1000.0, 1006.0) and first[2] == pytest.approx(400 / 6)
    assert second == (1008.0, 1009.0, 0.0)
    assert gpuseries.spans(gpuuse.new_attempt([0], 1000.0), 0, end=2000.0) == []  # never sampled


def test_a_run_finds_its_attempt_by_start_and_its_lanes_by_gpu_index() -> None:
    # a recovered job: the requeue reset `attempts`, so the numbers in the record say nothing
    record = {"attempts": {"1": recorded([2], 500.0, [(510, [80])]), "2": recorded([0, 2], 1000.0, [(1010, [90, 5])])}}
    assert gpuseries.of_run(record, 1000.4, 1010.0) == {"0": [(1000.0, 1010.0, 90.0)], "2": [(1000.0, 1010.0, 5.0)]}
    assert gpuseries.of_run(record, 500.0, 505.0) == {"2": [(500.0, 505.0, 80.0)]}
    assert gpuseries.of_run(record, 700.0, 800.0) == {}  # an attempt the supervisor did not sample
    assert gpuseries.of_run({}, 500.0, 505.0) == {}


def band_colours(fig: object) -> list[tuple[float, tuple]]:
    """(left edge, RGBA) of each utilisation band, in time order."""
    from gpuq.cli import plot

    fig.draw_without_rendering()  # type: ignore[attr-defined]  # colours are mapped from values when drawn
    ax = fig.axes[0]  # type: ignore[attr-defined]
    (bands,) = [c for c in ax.collections if c.get_gid() == plot.BAND_GID]
    lefts = [float(path.vertices[:, 0].min()) for path in bands.get_paths()]
    return sorted(zip(lefts, (tuple(c) for c in bands.get_facecolors())))


def test_plot_bands_a_bar_by_utilisation_and_leaves_unrecorded_bars_plain() -> None:
    plot = pytest.importorskip("gpuq.cli.plot", reason="needs matplotlib (the plot extra)")
    pytest.importorskip("matplotlib", reason="needs matplotlib (the plot extra)")
    runs = two_runs()
    busy_then_idle = recorded([0], T0, [(T0 + 1800, [100]), (T0 + 3600, [0])])
    shaded = {(1, T0): gpuseries.of_run({"attempts": {"1": busy_then_idle}}, T0, T0 + 3600)}
    fig = plot.figure(runs, utilisation=shaded)
    (busy_left, busy), (idle_left, idle) = band_colours(fig)
    assert busy_left < idle_left  # 100% first, then 0%
    assert busy == pytest.approx(plot_cmap(1.0)) and idle == pytest.approx(plot_cmap(0.0))
    assert sum(abs(a - b) for a, b in zip(busy[:3], idle[:3])) > 1.0  # clearly different colours
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[-2:] == ["inner band: GPU utilisation", "plain bar: no GPU record"]
    assert any(a.get_xlabel() == "GPU utilisation %" for a in fig.axes[1:])  # the colour bar
    bars = [p.get_gid() for p in fig.axes[0].patches]
    assert "gpuq-run-1-1-0" in bars and "gpuq-run-2-1-machine" in bars  # the job without a record still plots
    plain = plot.figure(runs)  # no records at all: today's picture, no colour bar, no note
    assert len(plain.axes) == 1 and not [c for c in plain.axes[0].collections if c.get_gid() == plot.BAND_GID]
    assert "plain bar: no GPU record" not in [t.get_text() for t in plain.axes[0].get_legend().get_texts()]


def plot_cmap(value: float) -> tuple:
    from matplotlib import colormaps

    from gpuq.cli import plot

    return tuple(colormaps[plot.CMAP](value))


def test_of_runs_reads_only_the_records_there_are(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.layout.ensure()
    spool.reports.write_gpu_use(1, {"attempts": {"1": recorded([0], T0, [(T0 + 3600, [70])])}})
    runs = two_runs()
    assert gpuseries.of_runs(spool, runs) == {(1, T0): {"0": [(T0, T0 + 3600, 70.0)]}}
    assert gpuseries.of_runs(spool, []) == {}


def test_group_figures_weigh_each_jobs_gpu_time(tmp_path: Path) -> None:
    """A `history` group's mean utilisation is over all its jobs' GPU time (1 h at 100%, 30 min at
    0% and 30 min at 40%: 60%), its peak the largest, its idle time the sum; a job without a record
    adds nothing."""
    spool = Spool(tmp_path / "spool")
    spool.layout.ensure()
    spool.reports.write_gpu_use(1, {"attempts": {"1": recorded([0], 0.0, [(3600, [100])])}})
    spool.reports.write_gpu_use(2, {"attempts": {"1": recorded([0, 1], 0.0, [(1800, [0, 40])])}})
    assert gpuuse.of_jobs(spool, [1, 2, 3]) == {"mean_util": 60.0, "peak_mem_mib": 1, "gpu_hours_idle": 0.5}
    assert gpuuse.of_jobs(spool, [3]) is None


def svg_band_fills(path: Path) -> list[str]:
    from gpuq.cli import plot

    root = ET.parse(path).getroot()
    (group,) = [el for el in root.iter() if el.get("id") == plot.BAND_GID]
    return [el.get("style", "") for el in group.iter("{http://www.w3.org/2000/svg}path")]


def test_history_plot_shades_a_real_jobs_busy_then_idle_gpu(gq: Env) -> None:
    pytest.importorskip("matplotlib", reason="needs matplotlib (the plot extra)")
    gpus = Gpus(gq, fake_gpus(1))
    gq.env.update(GPUQ_GPU_SAMPLE_SECONDS=str(PERIOD))
    job_id = add(gq, "--gpus", "1")
    gq.start_worker()  # after the add: a foreground worker that finds nothing to do exits
    gq.wait_state(job_id, "running")
    gpus.set(util_gpus(100))
    wait_for(lambda: len(gpu_record(gq, job_id).get("attempts", {}).get("1", {}).get("points", ())) >= 4, 15)
    gpus.set(util_gpus(0))
    went_idle = time.time()
    wait_for(lambda: gpu_record(gq, job_id)["attempts"]["1"]["at"] > went_idle + 4 * PERIOD, 15)
    release(gq)
    gq.wait_state(job_id, "done")
    out = gq.work / "timeline.svg"
    assert gq.gpuq("history", "--plot", str(out)).stdout == f"wrote {out}: 1 run\n"
    fills = svg_band_fills(out)
    dark, white = "fill: #08306b", "fill: #f7fbff"  # the ends of the colour map: 100% and 0%
    assert len(fills) >= 2 and dark in fills[0] and white in fills[-1], fills
