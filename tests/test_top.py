"""`gpuq top` without a terminal (issue 29): the snapshot read from a real spool (model.py) and the
frames drawn from it (draw.py, pure), which must fit 80x24; `--once` and the refusal without a
terminal through the real command. tests/test_top_tmux.py drives it in a real terminal."""

from __future__ import annotations

from pathlib import Path

from conftest import Env

from gpuq.cli import render
from gpuq.cli.top import draw, model
from gpuq.core.job import Job
from gpuq.core.states import CANCELLED, DONE, FAILED, HELD, PENDING, RUNNING
from gpuq.spool import Spool


def view(at: float, utils: list[int]) -> dict:
    """A GPU view as engine/schedule/gpuview.py makes it, GPU 0 held by job 1."""
    gpus = [
        {
            "index": i,
            "name": "Fake H100",
            "memory_total_mib": 81920,
            "memory_used_mib": 40960 if i == 0 else 0,
            "utilization_gpu": util,
            "jobs": [1] if i == 0 else [],
            "foreign": [],
            "leases": [],
        }
        for i, util in enumerate(utils)
    ]
    return {"at": at, "source": "fake", "problem": None, "gpus": gpus}


def snapshot(waiting: int = 2) -> model.Snapshot:
    ring = model.Ring()
    for n in range(40):
        ring.add(view(1000.0 + n, [n * 5 % 101, 0]))
    shown = view(1040.0, [87, 0])
    snap = model.Snapshot(1040.0, "worker: running, pid 4242 since 2026-12-04 10:00:00 (gpus: all, watching)")
    snap.gpu_title = "GPUs (fake, seen 0s ago by worker 4242)"
    snap.gpus = [model.GpuLine(g, model.holders(g, {1: "train-a"}, "/spool"), ring) for g in shown["gpus"]]
    run = model.JobLine(1, RUNNING, "train-a", "45% ETA 4m10s", "pid=77  gpu=0")
    run.fraction, run.util = 0.45, 87
    snap.running = [run]
    reason = "waiting for a free GPU (1 in use by gpuq jobs: #1)"
    snap.waiting = [model.JobLine(2 + n, PENDING, f"train-{n}", "starts ~4m10s", reason) for n in range(waiting)]
    snap.finished = [model.JobLine(9, FAILED, "oom", "ran 12s", "exit=1  CUDA out of memory")]
    return snap


def test_a_frame_fits_80x24_with_the_gpu_panel_and_every_section() -> None:
    lines = draw.frame(snapshot(), draw.Screen(80, 24, selected=1))
    assert len(lines) == 24 and all(len(text) < 80 for text, _attr in lines)
    text = "\n".join(t for t, _a in lines)
    assert "GPUs (fake" in text and "#1 train-a" in text and "87%" in text  # the GPU panel, who holds GPU 0
    assert ">   #1 train-a" in text and "45% ETA 4m10s" in text  # the selected row, marked
    assert "#2 pending" in text and "waiting for a free GPU" in text and "exit=1  CUDA out of memory" in text
    assert lines[-1][0].startswith("? help  q quit")
    assert [a for t, a in lines if "#9 failed" in t] == [draw.BAD]


def test_a_long_queue_scrolls_to_keep_the_selected_row_in_view() -> None:
    snap = snapshot(waiting=60)
    lines = draw.frame(snap, draw.Screen(80, 24, selected=50))
    assert len(lines) == 24 and any(t.startswith(">  #50 pending") for t, _a in lines)
    assert not any("#1 train-a  " in t for t, _a in lines)  # scrolled past
    assert any(">   #1 train-a" in t for t, _a in draw.frame(snap, draw.Screen(80, 24, selected=1)))


def test_the_ring_keeps_one_sample_per_look_and_the_sparkline_the_newest() -> None:
    ring = model.Ring(size=4)
    for at, util in ((1.0, 0), (1.0, 0), (2.0, 50), (3.0, 100), (4.0, None), (5.0, 100)):
        ring.add(view(at, [util]))  # the same look (at) twice counts once
    utils, mems = ring.series(0)
    assert utils == [50, 100, None, 100] and mems == [50] * 4
    assert draw.sparkline(utils, 6) == "  ▄█ █" and draw.sparkline(utils, 6, unicode=False) == "  =% %"
    assert draw.sparkline([0, 100], 1) == "█" and draw.sparkline([0, 3, 100], 3) == "▁▁█"  # idle is seen


def test_the_question_and_the_log_view_fit() -> None:
    screen = draw.Screen(80, 24)
    screen.bottom = ("kill #1 train-a? [y/N]", draw.WARN)
    assert draw.frame(snapshot(), screen)[-1] == ("kill #1 train-a? [y/N]", draw.WARN)
    lines = draw.log_frame("log of #1 train-a (running, following)", [f"step {n}" for n in range(100)], screen)
    assert len(lines) == 24 and lines[1][0] == "step 78" and lines[-2][0] == "step 99"


def test_wide_and_combining_characters_are_counted_as_the_terminal_draws_them() -> None:
    """Widths were counted in characters: a CJK name (two columns each) pushed the rest of its row
    right and past the screen's edge, a combining accent (none) pulled it left."""
    snap = snapshot(waiting=0)
    names = ["训练模型", "e\u0301xyz", "训练模型数据集实验一二三四五六七八九十", "plain-name"]
    snap.waiting = [model.JobLine(2 + n, PENDING, name, "starts ~4m10s", "after #1") for n, name in enumerate(names)]
    snap.finished = []
    for unicode in (True, False):  # the C locale's frame: a `?` per column
        screen = draw.Screen(80, 24, selected=1, unicode=unicode)
        lines = [text if unicode else draw.ascii_text(text) for text, _attr in draw.frame(snap, screen)]
        rows = [text for text in lines if "starts ~4m10s" in text]
        assert len(rows) == 4 and max(map(render.width, lines)) <= 79, lines
        assert {render.width(row.split("starts")[0]) for row in rows} == {len("    #2 pending   ") + 16 + 1}, rows
    assert "训练模型数据集…" in "\n".join(t for t, _a in draw.frame(snap, draw.Screen(80, 24)))  # 15 of 16 columns
    assert render.cut("训练模型", 8) == "训练模型" and render.cut("训练模型", 7) == "训练模…"
    assert render.cut("训练模型", 6) == "训练…"  # not half of 模: the row would be a column too wide
    assert render.cut("e\u0301e\u0301e\u0301", 2) == "e\u0301…" and draw.ascii_text("训e\u0301…") == "??e?"
    log = draw.log_frame("log of #2 训练模型", ["训练" * 60], draw.Screen(80, 24))
    assert max(render.width(text) for text, _attr in log) == 79


def test_the_snapshot_reads_the_queue_as_status_does_sweeps_folded(gq: Env) -> None:
    gq.script("train.py", "print('hi')\n")
    first = gq.add("--name", "first", "train.py")
    gq.add("--after", str(first), "train.py")
    gq.gpuq("add", "-q", "--sweep", "lr=1,2,3", "train.py", "{lr}")
    gq.gpuq("hold", str(first))
    snap = model.take(Spool(gq.home), model.Ring())
    assert [(line.job_id, line.state) for line in snap.waiting][:2] == [(first, HELD), (2, PENDING)]
    assert "after #1" in snap.waiting[1].info
    (sweep,) = [line for line in snap.waiting if line.job_id is None]  # three jobs, one row
    assert sweep.name.startswith("sweep #") and "sweep of 3 over lr" in sweep.info
    assert snap.running == [] and snap.finished == []


def test_once_prints_a_frame_and_without_a_terminal_top_says_so(gq: Env) -> None:
    gq.script("train.py", "print('hi')\n")
    gq.add("--name", "first", "train.py")
    out = gq.gpuq("top", "--once", env=dict(gq.env, COLUMNS="80", LINES="24")).stdout
    assert out.startswith("gpuq top  worker: none running") and ">   #1 pending   first" in out
    assert max(map(len, out.splitlines())) < 80 and "q quit" not in out  # it takes no keys
    proc = gq.gpuq("top", check=False)  # stdin and stdout are not a terminal here
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "gpuq top: needs a terminal (stdin and stdout); `gpuq top --once` prints one frame\n"
    bad = gq.gpuq("top", "--interval", "0", check=False)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1


def test_a_damaged_job_file_is_a_row_as_in_status(gq: Env) -> None:
    """`top` left it out silently, where `status` and the web list it."""
    first, second = gq.add("--hold", "--name", "h1", "--", "true"), gq.add("--hold", "--name", "h2", "--", "true")
    next(gq.home.glob(f"held/{first:06d}-*.json")).write_text('{"id": 99, "name": ')
    snap = model.take(Spool(gq.home), model.Ring())
    assert [(line.job_id, line.state) for line in snap.waiting] == [(first, HELD), (second, HELD)]
    assert snap.waiting[0].info.startswith("unreadable job file: not valid JSON")
    out = gq.gpuq("top", "--once", env=dict(gq.env, COLUMNS="150", LINES="100")).stdout
    assert f"#{first} held" in out and "unreadable job file" in out


def test_the_log_view_keeps_a_character_split_across_two_writes(gq: Env) -> None:
    """Each chunk was decoded on its own: the two halves of `é` became two replacement marks."""
    from gpuq.cli.top.app import LogFollow

    spool, job = Spool(gq.home), Job(id=7)
    log = Path(spool.layout.log_path(job.id))
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"")
    follow = LogFollow(spool, job, DONE)
    for part in (b"caf\xc3", b"\xa9 au lait\n"):
        with log.open("ab") as fh:
            fh.write(part)
        follow.poll()
    assert follow.shown()[-1] == "caf\u00e9 au lait"


def followed(gq: Env, opened: bytes, parts: tuple[bytes, ...]) -> list[str]:
    """What the log view shows of a running job's log that held `opened` when the view opened and
    gained `parts`, each written and then read on its own."""
    from gpuq.cli.top.app import LogFollow

    spool, job = Spool(gq.home), Job(id=7)
    log = Path(spool.layout.log_path(job.id))
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(opened)
    follow = LogFollow(spool, job, RUNNING)
    for part in parts:
        with log.open("ab") as fh:
            fh.write(part)
        follow.poll()
    return follow.shown()


def test_the_log_view_takes_a_crlf_split_across_two_reads_as_one_line_end(gq: Env) -> None:
    """A read that ended with the \\r of a \\r\\n and the next that began with its \\n showed a blank
    line between (so did the log's tail read when the view opened and the first read after it).
    A lone \\r, a progress bar drawn again, still ends its line."""
    parts = (b"\nfirst\r", b"\nsecond\r", b"10%\r", b"20%\r\n", b"third\r\n")
    assert followed(gq, b"opened\r", parts) == ["opened", "first", "second", "10%", "20%", "third"]


def test_the_log_view_goes_on_with_the_line_the_log_ended_in_when_it_opened(gq: Env) -> None:
    """A log that ended mid-line when the view opened (a tqdm bar: drawn after a \\r, not ended) had
    that line shown as ended: its rest became a line of its own, and the bar's next \\r a blank one."""
    parts = (b"##    |", b"\r 20%|###   |")
    assert followed(gq, b"start\n 10%|#", parts) == ["start", " 10%|###    |", " 20%|###   |"]


def test_in_the_c_locale_the_frame_is_ascii(gq: Env) -> None:
    """Python's UTF-8 mode makes stdout UTF-8 in the C locale, where curses cannot draw block
    characters: bars and sparklines were drawn blank. The locale decides, as it does for curses."""
    gq.add("--name", "first", "--", "true")  # the worker line says why it waits, with a dash
    frame = {
        lang: gq.gpuq("top", "--once", env=dict(gq.env, LC_ALL=lang, COLUMNS="100", LINES="30")).stdout
        for lang in ("C", "C.UTF-8")
    }
    assert frame["C"].isascii() and not frame["C.UTF-8"].isascii()


def test_keys_act_through_the_library_and_the_destructive_ones_ask(gq: Env) -> None:
    """The keys' dispatch without a terminal (app.App is curses-free until run): hold, release,
    cancel only after `y`, retry, and a key that does not apply to the job's state refused."""
    from gpuq.cli.top.app import App

    gq.script("train.py", "print('hi')\n")
    first, second = gq.add("--name", "first", "train.py"), gq.add("train.py")
    app = App(Spool(gq.home), 2.0, unicode=True)

    def press(key: str) -> str:
        assert app.press(key)
        if app.busy is not None:
            app.busy.join(15)
        app.tick()
        return app.bottom[0] if app.bottom else ""

    assert app.selected == first
    assert press("h") == f"#{first} first held (u puts it back in line)" and gq.state_of(first) == HELD
    assert press("u") == f"#{first} first back in line" and gq.state_of(first) == PENDING
    assert press("c") == "" and app.asking is not None  # asked: the bottom line shows the question
    assert app._bottom_line() == (f"cancel #{first} first? [y/N]", draw.WARN)
    assert press("n") == f"not done: #{first} left as it was" and gq.state_of(first) == PENDING
    press("c")
    assert press("y") == f"#{first} first cancelled" and gq.state_of(first) == CANCELLED
    assert press("x") == f"#{first} is cancelled: kill applies to running jobs" and app.asking is None
    assert press("r").startswith(f"#{first} first back in the queue") and gq.state_of(first) == PENDING
    assert press("j") == "" and app.selected == second
    assert not app.press("q")


def test_who_holds_a_gpu_jobs_other_users_leases_and_other_processes() -> None:
    gpu = {
        "jobs": [1],
        "leases": [
            {"spool": "/spool", "job": 1, "who": "me (job 1)"},  # our job's own lease: the job says it
            {"spool": "/home/bob/.gpuq", "job": 3, "who": "bob (job 3)"},
        ],
        "foreign": [
            {"pid": 99, "who": "alice", "used_memory_mib": 2048, "lease": None},
            {"pid": 98, "who": "bob", "used_memory_mib": 512, "lease": "bob-3.lease"},  # under bob's lease
        ],
    }
    assert model.holders(gpu, {1: "train-a"}, "/spool") == ["#1 train-a", "lease bob (job 3)", "pid 99 (alice) 2.0G"]
