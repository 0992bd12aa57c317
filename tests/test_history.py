"""gpuq.engine.views.history (pure, over hand-built job dicts with known durations) and the timeline
picture of gpuq.cli.plot (real PNG and SVG files, read back)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

import pytest
from conftest import wait_for
from test_preempt import FAKE, last_step

from gpuq.cli import render
from gpuq.core.job import Job
from gpuq.engine.views import attempts, history
from gpuq.engine.views.history import PastRun
from gpuq.system.extras import install_command
from gpuq.system.leases import LeaseDir

REPO = Path(__file__).resolve().parent.parent
HOUR = 3600.0
# Local noon of a fixed day, so "day" groups do not depend on the machine's time zone.
T0 = datetime(2024, 5, 1, 12, 0).astimezone().timestamp()


def iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp).astimezone().isoformat(timespec="milliseconds")


def attempt(start_h: float, hours: float, outcome: str, number: int = 1) -> dict:
    start = T0 + start_h * HOUR
    return {
        "attempt": number,
        "started_at": iso(start),
        "finished_at": iso(start + hours * HOUR),
        "exit_code": 0 if outcome == "done" else 1,
        "signal": None,
        "outcome": outcome,
    }


def job(job_id: int, attempts: list[dict], cwd: str = "/w/a", cmd: Optional[list] = None, **extra: Any) -> Job:
    last = attempts[-1] if attempts else {}
    return Job(
        {
            "id": job_id,
            "name": f"job{job_id}",
            "cmd": cmd or ["python", "train.py"],
            "cwd": cwd,
            "created_at": iso(T0 - HOUR),
            "started_at": last.get("started_at"),
            "finished_at": last.get("finished_at"),
            "exit_code": last.get("exit_code"),
            "history": attempts,
            "preemptions": [],
            "slot": None,
            **extra,
        }
    )


def preempted_then_resumed(job_id: int = 7) -> dict:
    """Ran 1 h on GPU 0, preempted, resumed 0.5 h later, finished after 2 h more."""
    return job(
        job_id,
        [attempt(0, 1, "preempted", 1), attempt(1.5, 2, "done", 2)],
        slot="0",
        preemptions=[{"at": iso(T0 + 1 * HOUR), "by": "user", "exit_code": 143}],
    )


# -- runs --


def test_gpu_hours_sum_over_gpus_held() -> None:
    jobs = [
        ("done", job(1, [attempt(0, 1.5, "done")], gpus=[0, 1])),
        ("done", job(2, [attempt(0, 0.5, "done")], slot="2")),
    ]
    [group] = history.summarize(jobs, by="dir")
    assert group.gpu_hours == pytest.approx(3.5)
    assert group.runs == 2 and group.done == 2 and group.jobs == 2


@pytest.mark.parametrize(
    ("fields", "gpus", "count"),
    [
        ({"gpus": [2, 3]}, ("2", "3"), 2),
        ({"gpus": [1], "slot": "0,1"}, ("1",), 1),  # the recorded list wins over the slot
        ({"slot": "0,1"}, ("0", "1"), 2),
        ({"gpu_request": 3}, (), 3),  # whole-machine worker: count known, indices not
        ({}, (), 1),
        ({"gpu_request": 0, "slot": "0"}, (), 0),  # CPU job
    ],
)
def test_gpus_held(fields: dict, gpus: tuple, count: int) -> None:
    [run] = history.runs([("done", job(1, [attempt(0, 2, "done")], **fields))])
    assert (run.gpus, run.gpu_count) == (gpus, count)
    assert run.gpu_hours == pytest.approx(2 * count)


def test_attempt_records_its_own_gpus() -> None:
    first = dict(attempt(0, 1, "preempted", 1), gpus=[3])
    [one, two] = history.runs([("done", job(1, [first, attempt(2, 1, "done", 2)], gpus=[0, 1]))])
    assert one.gpus == ("3",) and two.gpus == ("0", "1")


def test_preempted_and_resumed_job_is_two_runs_and_one_preemption() -> None:
    runs = history.runs([("done", preempted_then_resumed())])
    assert [(r.attempt, r.outcome, r.seconds) for r in runs] == [(1, "preempted", HOUR), (2, "done", 2 * HOUR)]
    [group] = history.summarize([("done", preempted_then_resumed())], by="script")
    assert (group.runs, group.jobs, group.done, group.preempted) == (2, 1, 1, 1)
    assert group.gpu_hours == pytest.approx(3.0)  # the gap between the attempts is not counted
    assert group.first == pytest.approx(T0) and group.last == pytest.approx(T0 + 3.5 * HOUR)


def test_outcomes_counted_per_attempt() -> None:
    jobs = [
        ("failed", job(1, [attempt(0, 0.1, "pending", 1), attempt(0.2, 0.1, "failed", 2)])),  # retried, then failed
        ("cancelled", job(2, [attempt(0, 0.3, "cancelled")])),
        ("interrupted", job(3, [attempt(0, 0.4, "interrupted")])),
        ("done", job(4, [attempt(0, 1, "done")])),
    ]
    [group] = history.summarize(jobs, by="dir")
    assert (group.runs, group.done, group.failed, group.cancelled, group.interrupted) == (5, 1, 2, 1, 1)


def test_median_over_all_runs() -> None:
    jobs = [("done", job(i, [attempt(0, hours, "done")])) for i, hours in enumerate([1, 4, 2])]
    [group] = history.summarize(jobs, by="dir")
    assert group.median_seconds == pytest.approx(2 * HOUR)


def test_runs_without_start_or_end_are_left_out_and_bad_times_do_not_crash() -> None:
    broken = attempt(0, 1, "done")
    broken["finished_at"] = "not a time"
    unfinished = dict(attempt(0, 1, "done"), finished_at=None)
    jobs = [("done", job(1, [broken])), ("done", job(2, [unfinished])), ("done", job(3, [attempt(0, 1, "done")]))]
    assert [r.job_id for r in history.runs(jobs)] == [3]


def test_job_without_history_uses_its_own_times() -> None:
    old = job(1, [])
    old.update(started_at=iso(T0), finished_at=iso(T0 + 2 * HOUR), history=[])
    [run] = history.runs([("failed", old)])
    assert run.outcome == "failed" and run.seconds == pytest.approx(2 * HOUR)


def test_adopted_jobs_are_included_and_marked() -> None:
    jobs = [("done", job(1, [attempt(0, 1, "done")], adopted=True)), ("done", job(2, [attempt(0, 1, "done")]))]
    [group] = history.summarize(jobs, by="dir")
    assert group.runs == 2 and group.adopted == 1
    assert [r.adopted for r in history.runs(jobs)] == [True, False]


# -- grouping and the window --


def sample_jobs() -> list[tuple[str, dict]]:
    return [
        ("done", job(1, [attempt(0, 1, "done")], cwd="/w/b", cmd=["python", "-u", "src/train.py", "--lr", "1"])),
        ("failed", job(2, [attempt(24, 2, "failed")], cwd="/w/a", cmd=["torchrun", "--nproc", "2", "eval.py"])),
        ("done", job(3, [attempt(25, 1, "done")], cwd="/w/a", cmd=["python", "-m", "pkg.train"], sweep={"id": 10})),
        ("done", job(4, [attempt(48, 3, "done")], cwd="/w/b", cmd=["./run"], sweep={"id": 9, "values": {"lr": "1"}})),
    ]


@pytest.mark.parametrize(
    ("by", "expected"),
    [
        ("dir", [("/w/a", 2, 3.0), ("/w/b", 2, 4.0)]),
        ("script", [("eval.py", 1, 2.0), ("pkg.train", 1, 1.0), ("run", 1, 3.0), ("train.py", 1, 1.0)]),
        ("day", [("2024-05-01", 1, 1.0), ("2024-05-02", 2, 3.0), ("2024-05-03", 1, 3.0)]),
        ("sweep", [(9, 1, 3.0), (10, 1, 1.0), (None, 2, 3.0)]),  # numerically, jobs outside sweeps last
    ],
)
def test_grouping(by: str, expected: list) -> None:
    groups = history.summarize(sample_jobs(), by=by)
    assert [(g.key, g.runs, round(g.gpu_hours, 6)) for g in groups] == expected


def test_since_counts_runs_that_ended_after_it() -> None:
    since = T0 + 24.5 * HOUR  # after job 1 ended, while job 2 was running
    groups = history.summarize(sample_jobs(), since=since, by="dir")
    assert [(g.key, g.runs) for g in groups] == [("/w/a", 2), ("/w/b", 1)]

    # A job whose first attempt ended before the window and second after: only the second counts,
    # and the preemption (at the end of the first) is outside the window too.
    groups = history.summarize([("done", preempted_then_resumed())], since=T0 + 2 * HOUR, by="dir")
    assert [(g.runs, g.done, g.preempted, round(g.gpu_hours, 6)) for g in groups] == [(1, 1, 0, 2.0)]
    assert history.summarize(sample_jobs(), since=T0 + 100 * HOUR, by="dir") == []


def test_unknown_grouping_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="--by 'user': choose one of dir, script, day, sweep"):
        history.summarize([], by="user")


def test_to_json() -> None:
    data = history.to_json(history.summarize(sample_jobs() + [("done", preempted_then_resumed(8))], by="sweep"))
    assert json.loads(json.dumps(data)) == data
    last = data[-1]
    assert last["key"] is None and last["runs"] == 4 and last["preempted"] == 1
    assert datetime.fromisoformat(last["first"]).timestamp() == pytest.approx(T0)
    assert datetime.fromisoformat(last["last"]).timestamp() == pytest.approx(T0 + 26 * HOUR)  # job 2 ended last
    assert last["gpu_hours"] == 6.0 and last["median_seconds"] == pytest.approx(1.5 * HOUR)


def test_parse_since() -> None:
    now = 1_700_000_000.0
    assert history.parse_since("7d", now) == now - 7 * 86400
    assert history.parse_since("12h", now) == now - 12 * 3600
    assert history.parse_since("1.5w", now) == now - 1.5 * 7 * 86400
    assert history.parse_since("2024-05-01", now) == datetime(2024, 5, 1).timestamp()
    assert history.parse_since("2024-05-01T09:00+00:00", now) == 1714554000.0
    with pytest.raises(ValueError, match="^--since 'yesterday': give a duration"):
        history.parse_since("yesterday", now)


@pytest.mark.parametrize(
    ("cmd", "script"),
    [
        (["python", "train.py", "--config", "cfg.py"], "train.py"),
        (["accelerate", "launch", "--config_file", "a.yaml", "scripts/finetune.py"], "finetune.py"),
        (["python", "-m", "pkg.train", "--x"], "pkg.train"),
        (["bash", "run_all.sh"], "run_all.sh"),
        (["/usr/bin/make", "train"], "make"),
        ("python train.py", "train.py"),
        ([], "?"),
    ],
)
def test_script_of(cmd: Any, script: str) -> None:
    assert history.script_of(cmd) == script


# -- the picture --


def lanes_runs(runs: list[PastRun]) -> int:
    return sum(len(run.lanes) for run in runs)


def timeline_jobs() -> list[tuple[str, dict]]:
    return [
        ("done", preempted_then_resumed(1)),
        ("done", job(2, [attempt(0.5, 2, "done")], gpus=[1, 2])),
        ("failed", job(3, [attempt(2, 0.01, "failed")], slot="1")),
        ("cancelled", job(4, [attempt(3, 1, "cancelled")], gpu_request=0)),
        ("done", job(5, [attempt(1, 1, "done")], adopted=True)),
        # recovered after an interruption: the requeue reset `attempts`, so both entries say 1
        ("done", job(6, [attempt(4, 0.5, "interrupted", 1), attempt(5, 0.5, "done", 1)], slot="2")),
    ]


def svg_ids(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return [el.get("id", "") for el in root.iter()]


def test_plot_svg_has_one_bar_per_run_and_lane(tmp_path: Path) -> None:
    plot = pytest.importorskip("gpuq.cli.plot", reason="needs matplotlib (the plot extra)")
    pytest.importorskip("matplotlib", reason="needs matplotlib (the plot extra)")
    runs = history.runs(timeline_jobs())
    assert plot.lane_order(runs) == ["0", "1", "2", "machine", "cpu"]
    path = tmp_path / "timeline.svg"
    plot.plot(runs, str(path))
    ids = svg_ids(path)
    bars = sorted(i for i in ids if i.startswith(plot.BAR_GID + "-"))
    assert len(bars) == lanes_runs(runs) == 9  # the 2-GPU run is drawn in two lanes
    assert "gpuq-run-2-1-1" in bars and "gpuq-run-2-1-2" in bars and "gpuq-run-4-1-cpu" in bars
    assert "gpuq-run-1-1-0" in bars and "gpuq-run-1-2-0" in bars  # the preempted job's two runs
    assert "gpuq-run-6-1-2" in bars and "gpuq-run-6-2-2" in bars  # both numbered attempt 1 in the file
    named = [i for i in ids if i]
    assert len(named) == len(set(named))  # SVG ids are unique
    assert "gpuq-preempt" in ids and "gpuq-resume" in ids


def test_plot_png_is_a_real_png(tmp_path: Path) -> None:
    plot = pytest.importorskip("gpuq.cli.plot", reason="needs matplotlib (the plot extra)")
    image = pytest.importorskip("matplotlib.image", reason="needs matplotlib (the plot extra)")
    runs = history.runs(timeline_jobs())
    path = tmp_path / "timeline.PNG"  # the suffix is case-insensitive
    plot.plot(runs, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = image.imread(str(path)).shape[:2]
    assert (width, height) == (1200, round(100 * (1.6 + 0.45 * 5)))


def test_plot_with_no_runs_is_a_valid_picture(tmp_path: Path) -> None:
    plot = pytest.importorskip("gpuq.cli.plot", reason="needs matplotlib (the plot extra)")
    image = pytest.importorskip("matplotlib.image", reason="needs matplotlib (the plot extra)")
    plot.plot([], str(tmp_path / "empty.png"))
    assert image.imread(str(tmp_path / "empty.png")).shape[:2] == (205, 1200)
    plot.plot([], str(tmp_path / "empty.svg"))
    assert not [i for i in svg_ids(tmp_path / "empty.svg") if i.startswith(plot.BAR_GID)]
    assert "no finished runs in this period" in (tmp_path / "empty.svg").read_text()


def test_plot_thousands_of_runs(tmp_path: Path) -> None:
    plot = pytest.importorskip("gpuq.cli.plot", reason="needs matplotlib (the plot extra)")
    pytest.importorskip("matplotlib", reason="needs matplotlib (the plot extra)")
    jobs = [
        (
            "done",
            job(i, [attempt(i * 0.05, 0.04 + (i % 7) * 0.01, ["done", "failed", "preempted"][i % 3])], slot=str(i % 4)),
        )
        for i in range(2000)
    ]
    runs = history.runs(jobs)
    plot.plot(runs, str(tmp_path / "many.svg"))
    assert len([i for i in svg_ids(tmp_path / "many.svg") if i.startswith(plot.BAR_GID + "-")]) == 2000


def test_plot_refuses_other_formats(tmp_path: Path) -> None:
    from gpuq.cli import plot  # importing it must not need matplotlib

    with pytest.raises(ValueError, match=r"must end in \.png or \.svg"):
        plot.plot([], str(tmp_path / "timeline.pdf"))
    assert list(tmp_path.iterdir()) == []


def child_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_missing_matplotlib_names_the_extra(tmp_path: Path) -> None:
    out = tmp_path / "timeline.png"
    code = (
        "import sys\n"
        "sys.modules['matplotlib'] = None  # as if it were not installed\n"
        "from gpuq.cli.plot import plot, PlotUnavailable\n"
        "from gpuq.core.errors import GpuqError\n"
        "try:\n"
        f"    plot([], {str(out)!r})\n"
        "except PlotUnavailable as exc:\n"
        "    assert isinstance(exc, ImportError) and isinstance(exc, GpuqError)\n"
        "    print(exc)\n"
        "    sys.exit(3)\n"
    )
    proc = child_python(code)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        3,
        f"history --plot needs matplotlib: {install_command('plot')}\n",
        "",
    )
    assert not out.exists()


def test_history_modules_do_not_import_matplotlib() -> None:
    code = (
        "import sys\n"
        "import gpuq.engine.views.history, gpuq.cli.plot\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'numpy')))\n"
    )
    proc = child_python(code)
    assert (proc.returncode, proc.stdout.strip()) == (0, "[]"), proc.stderr


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("engine/views/history.py", {"gpuq.core", "gpuq.spool.cache.runs"}),  # the rules the finished rows are made by
        ("cli/plot.py", {"gpuq.core", "gpuq.engine.views.history", "gpuq.system.extras"}),  # extras: what to install
    ],
)
def test_imports_only_core_and_history(module: str, allowed: set) -> None:
    tree = ast.parse((REPO / "gpuq" / module).read_text())
    names = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    gpuq_names = {n for n in names if n and n.startswith("gpuq")}
    assert {n for n in gpuq_names if n != "gpuq.core" and not n.startswith("gpuq.core.")} <= allowed, gpuq_names


def test_day_grouping_uses_local_days() -> None:
    # 23:00-23:30 local ends on the first day; 23:30-00:30 ends on the next.
    jobs = [("done", job(1, [attempt(11, 0.5, "done")])), ("done", job(2, [attempt(11.5, 1, "done")]))]
    assert [g.key for g in history.summarize(jobs, by="day")] == ["2024-05-01", "2024-05-02"]


def test_history_of_attempts_that_held_no_gpu_names_none(gq: Any) -> None:
    """On a machine without GPUs (simulated: none listed) a CPU job's attempt, and a default job's,
    held no GPU (`gpus` null in the entry): `history ID` says no GPU, as `show` says none (it said
    `had a whole GPU`). An attempt on Ray records no `gpus`: its share is what it had."""
    (gq.work / "no-gpus.json").write_text('{"gpus": []}')
    gq.env["GPUQ_FAKE_GPUS"] = str(gq.work / "no-gpus.json")
    gq.script("p.py", "print('ran')\n")
    cpu, default = gq.add("--gpus", "0", "p.py"), gq.add("p.py")
    gq.gpuq("run")  # until the queue is empty
    for job_id in (cpu, default):
        assert [entry["gpus"] for entry in gq.job(job_id)["history"]] == [None]
        said = gq.gpuq("history", str(job_id)).stdout
        assert "attempt 1  done after " in said and "GPU" not in said, said
    assert "  GPUs       none (a CPU job)\n" in gq.gpuq("show", str(cpu)).stdout
    assert attempts.had({"outcome": "done", "gpu_mem_mib": None}) == "a whole GPU"


def test_the_table_counts_a_cjk_directory_in_the_columns_it_takes(gq: Any) -> None:
    """Its widths were counted in characters: a row whose directory held CJK characters (two
    columns each) had its counts pushed right of the others'."""
    for where in ("训练模型", "plain"):
        gq.script("p.py", "print('ran')\n", where=gq.work / where)
        gq.add("p.py", cwd=gq.work / where)
    gq.gpuq("run")  # until the queue is empty
    lines = gq.gpuq("history").stdout.splitlines()
    assert any("训练模型" in line for line in lines) and len({render.width(line) for line in lines[:4]}) == 1, lines


def test_json_groups_name_each_failed_run_and_its_reason(gq: Any) -> None:
    """`history --json` says why each failed run failed (docs/progress.md): a retried attempt and
    the last one, each with its reason read from the log; and so it does once `gpuq clear` removed
    the job, from what clear kept."""
    gq.script("boom.py", "raise ValueError('lr too high')\n")
    gq.script("fine.py", "print('ok')\n")
    bad, good = gq.add("--retries", "1", "boom.py"), gq.add("fine.py")
    gq.gpuq("run")  # until the queue is empty
    assert gq.job(bad)["state"] == "failed" and gq.job(good)["state"] == "done"
    for _look in ("files", "kept"):
        [group] = json.loads(gq.gpuq("history", "--json").stdout)
        assert group["failed"] == 2 and len(group["failures"]) == 2, group
        assert [(f["id"], f["attempt"]) for f in group["failures"]] == [(bad, 1), (bad, 2)]
        assert all("ValueError: lr too high" in f["reason"] for f in group["failures"]), group["failures"]
        gq.gpuq("clear", "-y")


def test_history_of_a_job_preempted_twice_numbers_its_runs_and_says_where_each_resumed(gq: Any) -> None:
    """A preempted and resumed job's runs are attempts 1, 2, 3 in `history ID` (the job file's own
    count starts again at each resume: each entry says `attempt: 1`), each resumed one saying its
    checkpoint and the steps lost; `--json` gives the same attempts as JSON."""
    shutil.copy(FAKE, gq.work / "fake_trainer.py")
    run = ("-p", sys.executable, "fake_trainer.py", "--output_dir", "out", "--max_steps", "100000", "--save_steps", "5")
    jid = gq.add(*run)
    gq.start_worker("--watch")
    for _round in range(2):
        base = gq.job(jid)["resumed_from_step"] or 0
        wait_for(lambda b=base: last_step(gq, jid) >= b + 7, 20, what="progress past the next save")
        gq.gpuq("preempt", str(jid))
        gq.wait_state(jid, "preempted")
        gq.gpuq("resume", str(jid))
        wait_for(lambda: gq.state_of(jid) == "running", 20, what="running again")
    gq.gpuq("kill", str(jid))
    entries = gq.job(jid)["history"]
    assert [e["attempt"] for e in entries] == [1, 1, 1]  # why the lines cannot use the entry's number
    said = gq.gpuq("history", str(jid)).stdout
    for number, entry in enumerate(entries, 1):
        assert f"  attempt {number}  {entry['outcome']}" in said, said
    for entry in entries[1:]:
        where = os.path.basename(entry["resumed_from"])
        assert f"; from {where}, lost {entry['lost_steps']} step" in said, said
    data = json.loads(gq.gpuq("history", "--json", str(jid)).stdout)
    assert data["id"] == jid and [a["attempt"] for a in data["attempts"]] == [1, 2, 3]
    assert [a["resumed_from"] for a in data["attempts"]] == [e["resumed_from"] for e in entries]


def test_history_of_one_job_plots_that_jobs_runs(gq: Any) -> None:
    """`history ID --plot FILE` draws the job's runs, and no other job's (it printed `history ID`'s
    text and wrote no file); an unknown id is refused as `history ID` refuses it, with no file."""
    pytest.importorskip("matplotlib", reason="needs matplotlib (the plot extra)")
    gq.script("boom.py", "raise ValueError('lr too high')\n")
    gq.script("fine.py", "print('ok')\n")
    bad, good = gq.add("--retries", "1", "boom.py"), gq.add("fine.py")
    gq.gpuq("run")  # until the queue is empty
    out = gq.work / "one.svg"
    assert gq.gpuq("history", str(bad), "--plot", str(out)).stdout == f"wrote {out}: 2 runs\n"
    bars = [i for i in svg_ids(out) if i.startswith("gpuq-run-")]
    assert len(bars) == 2 and all(b.startswith(f"gpuq-run-{bad}-") for b in bars), bars
    assert gq.gpuq("history", str(good), "--plot", str(out)).stdout == f"wrote {out}: 1 run\n"
    missing = gq.gpuq("history", "99", "--plot", str(gq.work / "none.svg"), check=False)
    assert (missing.returncode, missing.stderr) == (1, "gpuq: no such job #99\n")
    assert not (gq.work / "none.svg").exists()


def test_attempt_lines_number_by_place_and_say_where_each_resumed() -> None:
    entries = [
        attempt(0, 1, "preempted", 1),
        dict(attempt(1, 1, "preempted", 1), resumed_from="/w/out/checkpoint-5/", lost_steps=2),
        dict(attempt(2, 1, "done", 1), resumed_from=None, lost_steps=7),  # no checkpoint: from scratch
    ]
    lines = attempts.attempt_lines(job(1, entries))
    assert [label for label, _text in lines] == ["attempt 1", "attempt 2", "attempt 3"]
    assert "from" not in lines[0][1]
    assert lines[1][1].endswith("; from checkpoint-5, lost 2 steps")
    assert lines[2][1].endswith("; from the start, lost 7 steps")


def test_a_gpu_mem_share_counts_its_part_of_its_gpu(gq: Any, own_lease_dir: Path) -> None:
    """Two --gpu-mem 20G jobs share one 80 GiB GPU: each counts a quarter of its time, in history's
    GPU-hours and in the recent use that orders turns between users, not the whole GPU's."""
    fake = gq.work / "gpus.json"
    gpu = {"index": 0, "name": "Fake H100", "uuid": "GPU-fake-0", "memory_total_mib": 81920, "memory_used_mib": 0}
    fake.write_text(json.dumps({"gpus": [dict(gpu, processes=[])]}))
    gq.env["GPUQ_FAKE_GPUS"] = str(fake)
    ids = [gq.add("--gpu-mem", "20G", "--", sys.executable, "-c", "import time; time.sleep(1)") for _ in range(2)]
    gq.start_worker()
    done = [Job(gq.wait_state(job_id, "done", timeout=60)) for job_id in ids]
    assert [j.history[-1].get("gpu_share") for j in done] == [0.25, 0.25]
    runs = history.runs([("done", j) for j in done])
    whole = sum(run.seconds for run in runs) / HOUR
    assert sum(run.gpu_hours for run in runs) == pytest.approx(whole / 4)
    wait_for(lambda: all(p.poll() is not None for p in gq.workers), 30, what="the worker to exit")
    used = LeaseDir.open(str(own_lease_dir)).usage([os.geteuid()])[os.geteuid()]
    assert whole / 5 < used < whole / 2, (used, whole)
