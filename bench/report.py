"""Turning raw samples into bench/RESULTS.md: one Markdown table per measurement and a table of
the issue's targets, each marked met or missed from the numbers of this very run."""

from __future__ import annotations

from typing import Any, Optional

import report_situations
import report_week
from common import md_table as _table
from common import median, ms, p95
from common import median_of as of

ORIGINAL_GPUQ_FACTS = (
    "The original single-file gpuq (SQLite) was **not measured here**: it is a script on GitHub and "
    "this benchmark installs only from the system's package manager (the machine that produced this "
    "file had no network access to fetch it). Reported facts, *not measured by this benchmark* "
    "(from the project's field notes, reproduced on its newest commit): it sleeps a fixed 3 s after "
    "each job before starting the next one, polls every 5 s while blocked, and a job added after its "
    "queue drained is never started because `run --daemon` exits when the queue is empty."
)


def dispatch_section(data: dict[str, dict[str, list[float]]]) -> list[str]:
    rows = []
    for name, d in data.items():
        q, s = d["queued"], d["submitted"]
        rows.append([name, ms(median(q)), ms(p95(q)), ms(median(s)), ms(p95(s)), str(len(q))])
    return [
        "## 1. Dispatch latency (idle resident worker; job writes `$EPOCHREALTIME` as its first instruction)",
        "",
        "*queued -> start*: from the moment the add command returned (the job is in the queue) to the job's "
        "first instruction. *add invoked -> start* also counts the add command's own start-up. "
        "nq has no resident process: `nq` forks the job itself, so its job may start before `nq` returns."
        " gpuq's worker, with a supervisor already waiting, can also start the job before `gpuq add` has"
        " exited (the job is queued, fsynced, before the command finishes): single samples can be negative.",
        "",
        *_table(
            ["system", "median queued->start (ms)", "p95 (ms)", "median add invoked->start (ms)", "p95 (ms)", "jobs"],
            rows,
        ),
    ]


def gap_section(data: dict[str, list[float]]) -> list[str]:
    rows = [[name, ms(median(v)), ms(p95(v)), str(len(v))] for name, v in data.items()]
    return [
        "## 2. Back-to-back gap (job A's last instruction -> job B, queued while A ran, starts)",
        "",
        *_table(["system", "median gap (ms)", "p95 (ms)", "pairs"], rows),
    ]


def throughput_section(data: dict[str, list[float]], jobs: int) -> list[str]:
    rows = [[name, f"{median(v):.1f}", ", ".join(f"{x:.1f}" for x in v)] for name, v in data.items()]
    return [
        f"## 3. Throughput ({jobs} `true` jobs queued behind a blocker, clock from its release to the last end)",
        "",
        "gpuq's jobs are queued through its library (`gpuq.enqueue.enqueue`, what `gpuq add` calls) to keep "
        "the run short; the peers' with their add command. Only the run is timed.",
        "",
        *_table(["system", "median jobs/s", "each run (jobs/s)"], rows),
    ]


def cli_section(data: dict[int, dict[str, list[float]]]) -> list[str]:
    rows = []
    for size, commands in data.items():
        bare = median(commands["python -c pass"])
        for label, values in commands.items():
            m = median(values)
            above = "" if label == "python -c pass" or not label.startswith("gpuq") else ms(m - bare)
            rows.append([f"{size:,}", f"`{label}`", ms(m), above, str(len(values))])
    return [
        "## 4. CLI latency (wall time of one command, N finished jobs in the queue)",
        "",
        "`python -c pass` is the same interpreter gpuq runs on (see `baseline` above), so *above bare python* "
        "is what gpuq itself costs. gpuq's finished jobs are written as valid job files through its library "
        "(`jobs.new_job` + `spool.jobs.publish` into done/); the peers' finished jobs are real runs of `true`, "
        "so the peers are measured with 0 and 1,000 finished jobs only. nq has no list command: `fq -nq` prints "
        "the queue.",
        "",
        *_table(["finished jobs", "command", "median (ms)", "gpuq above bare python (ms)", "runs"], rows),
    ]


def idle_section(data: dict[str, dict[str, dict[str, float]]], seconds: float, pending: int) -> list[str]:
    rows = []
    labels = {"empty": "empty queue", "blocked": "jobs pending behind a running job"}
    for phase, systems in data.items():
        for name, d in systems.items():
            rows.append(
                [
                    labels[phase],
                    name,
                    f"{d['queued']:,}",
                    f"{d['cpu_s']:.3f}",
                    f"{d['cpu_s_per_min']:.3f}",
                    f"{d['rss_mb']:.1f}",
                    str(d["processes"]),
                ]
            )
    return [
        f"## 5. Idle cost (one {seconds:.0f} s window in which every queue below is measured at once)",
        "",
        "CPU = user + system time from /proc; RSS = peak of the summed resident sets. gpuq: its worker "
        "(`gpuq run --watch`); the running job's supervisor is listed apart. tsp: its server plus one "
        "waiting client per queued job (its server takes about 1,000 clients at most, so it holds "
        "fewer). nq: waiting processes for each queued job, and no resident process at all. Summed RSS "
        "counts pages shared between processes once per process.",
        "",
        *_table(
            ["queue", "system", "jobs queued", "CPU s in window", "CPU s / min", "peak RSS (MB)", "processes"], rows
        ),
    ]


def log_section(data: dict[str, list[float]]) -> list[str]:
    small, big = data["sizes"]
    rows = [
        [f"{small / 1024:.1f} KB", ms(median(data["1 KB"])), str(len(data["1 KB"]))],
        [_size(big), ms(median(data["big"])), str(len(data["big"]))],
    ]
    delta = median(data["big"]) - median(data["1 KB"])
    return [
        "## 6. Log size (`gpuq status` with one running job)",
        "",
        "The big log is sparse up to its last lines (tqdm-style progress), which is what a reader of its "
        "tail sees; a reader of the whole file would read all of it.",
        "",
        *_table(["running job's log", "median `gpuq status` (ms)", "runs"], rows),
        f"Difference: {ms(delta)} ms.",
        "",
    ]


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GB" if n >= 2**30 else f"{n / 2**20:.1f} MB"


def scale_section(data: dict[str, list[float]], total: int) -> list[str]:
    rows = [[f"`{label}`", ms(median(v)), ms(p95(v)), str(len(v))] for label, v in data.items()]
    return [
        f"## 7. Scale ({total:,} finished jobs)",
        "",
        *_table(["command", "median (ms)", "p95 (ms)", "runs"], rows),
    ]


def targets(results: dict[str, Any], sizes: dict[str, int], compared: Optional[str] = None) -> list[str]:
    """The budgets of issue 40 and, where it sets none, the targets of issues 27, 15 and 4, judged on
    this run's medians (each limit names its issue), with the figure of the compared gpuq (`--compare`)
    and of task-spooler and nq of the same run where they have one."""
    rows: list[list[str]] = []
    c = compared or ""  # "" is in no result: its column stays empty

    def add(
        what: str,
        value: Optional[float],
        limit: float,
        unit: str,
        issue: int,
        lower_is_better: bool = True,
        peers: tuple[Optional[float], Optional[float]] = (None, None),
        limit_text: str = "",
        other: Optional[float] = None,
        strict: bool = False,
    ) -> None:
        def shown(v: Optional[float]) -> str:
            digits = 3 if unit in ("CPU s/min", "x") else 2 if unit == "%" else 1
            return "" if v is None else f"{v:.{digits}f} {unit}"

        bound = (limit_text or f"{'<=' if lower_is_better else '>='} {limit:g} {unit}") + f" (issue {issue})"
        beside = [shown(other)] if compared else []
        if value is None:
            rows.append([what, "not measured", *beside, "", "", bound, "n/a"])
            return
        if strict:
            ok = value < limit if lower_is_better else value > limit
        else:
            ok = value <= limit if lower_is_better else value >= limit
        rows.append([what, shown(value), *beside, shown(peers[0]), shown(peers[1]), bound, _mark(ok)])

    g = "gpuq"
    if "dispatch" in results:
        d = results["dispatch"]
        both = (of(d, "tsp", key="submitted"), of(d, "nq", key="submitted"))
        add(
            "`add` launched -> job's first instruction, idle worker",
            of(d, g, key="submitted"),
            80,
            "ms",
            40,
            peers=both,
            other=of(d, c, key="submitted"),
        )
        both = (of(d, "tsp", key="queued"), of(d, "nq", key="queued"))
        add(
            "job queued -> its first instruction, idle worker",
            of(d, g, key="queued"),
            50,
            "ms",
            4,
            peers=both,
            other=of(d, c, key="queued"),
        )
    if "back_to_back" in results:
        b = results["back_to_back"]
        tsp = of(b, "tsp")
        limit = 2.5 * tsp if tsp is not None else 50.0
        text = f"<= 2.5x tsp = {limit:.1f} ms" if tsp is not None else "<= 50 ms (no tsp in this run)"
        whose = 40 if tsp is not None else 4
        add(
            "back-to-back gap, no GPUs",
            of(b, g),
            limit,
            "ms",
            whose,
            peers=(tsp, of(b, "nq")),
            limit_text=text,
            other=of(b, c),
        )
    if "throughput" in results:
        tp = results["throughput"]
        both = (of(tp, "tsp", 1.0), of(tp, "nq", 1.0))
        add("throughput, trivial jobs", of(tp, g, 1.0), 100, "jobs/s", 40, False, peers=both, other=of(tp, c, 1.0))
    if "cli" in results:
        for size in sorted(results["cli"]):
            limit = 40.0 if size <= 1000 else 60.0
            cmds = results["cli"][size]
            bare = median(cmds["python -c pass"])
            peer_cmds = {"status": ("tsp -l", "fq -nq"), "add": ("tsp add", "nq add")}
            for command in ("status", "add"):
                peers = tuple(median(cmds[p]) * 1000 if p in cmds else None for p in peer_cmds[command])
                above = {n: (median(cmds[f"{n} {command}"]) - bare) * 1000 for n in (g, c) if f"{n} {command}" in cmds}
                what = f"`gpuq {command}` above the baseline, {size:,} finished"
                add(what, above[g], limit, "ms", 40, peers=peers, other=above.get(c))  # type: ignore[arg-type]
    if "scale" in results:
        s, n = results["scale"], sizes["scale"]
        first = next((k for k in s if k.startswith("gpuq status -a, first run (")), "")
        what = f"`gpuq status -a`, {n:,} finished, first call (jobs ended by gpuq: their rows in the index's journal)"
        add(what, of(s, first), 2000, "ms", 15)
        bare = next((k for k in s if k.startswith("gpuq status -a, first run without")), "")
        if bare:  # the cold rebuild: cache/ removed, or an index format that changed with an upgrade
            what = f"`gpuq status -a`, {n:,} finished, first call with no index and no journal (every file read)"
            add(what, of(s, bare), 2000, "ms", 15)
        add(f"`gpuq status -a`, {n:,} finished, later calls", of(s, "gpuq status -a"), 500, "ms", 15)
        add(f"`gpuq status`, {n:,} finished", of(s, "gpuq status"), 1000, "ms", 4)
    if "idle" in results:
        for phase, text in (("empty", "empty queue"), ("blocked", f"{sizes['pending']:,} pending")):
            worker = results["idle"][phase][g]
            add(f"idle worker CPU, {text}", worker["cpu_s_per_min"], 0.1, "CPU s/min", 4)
            add(f"idle worker RSS, {text}", worker["rss_mb"], 60, "MB", 4)
    if "log" in results:
        log = results["log"]
        add("status, big log minus 1 KB log", (median(log["big"]) - median(log["1 KB"])) * 1000, 10, "ms", 4)
    for row in report_situations.targets(results, c):
        add(**row)
    for row in report_week.targets(results):
        add(**row)
    header = ["target", "gpuq", *([compared] if compared else []), "tsp", "nq", "limit (whose)", "met by gpuq"]
    lines = [
        "## Targets (issue 40's budgets; where it sets none, the targets of issues 27, 15 and 4 still stand; "
        "issue 42's for the week; each limit names its issue; judged on this run, every figure from the same run)",
        "",
        "*Above the baseline*: the command's median minus the baseline's median (see `baseline` above). The "
        "peers' columns hold their own command's whole time (`tsp -l`, `fq -nq`; `tsp`, `nq`), for scale; "
        "in the week's rows, task-spooler's own figures on the same trace."
        + (
            f" `{compared}`: gpuq of that git revision (`--compare`), measured as gpuq is (its own venv, spool "
            "and worker) in the same rounds; its figures are judged by no one, they are there to compare."
            if compared
            else ""
        ),
        "",
        *_table(header, rows),
    ]
    lines += [
        "Where the remaining time goes (measured in `bench/PROFILE.md`, section 11): a command's start-up is "
        "mostly imports on top of the interpreter's own start: some 45 gpuq modules and the standard library's "
        "`typing`, `re`, `json`, `argparse` and `datetime` (with running or waiting jobs also the ETA's), and "
        "`add`'s fsyncs and git; between jobs (on a machine without GPUs the ended job's supervisor starts the "
        "next one the worker named to it), the claim, the next job's move to `running/` (two fsyncs), its "
        "fork and exec, then the ended job's end record (three fsyncs), with the worker following every file "
        "on the other CPU; the first `status -a` over 100,000 jobs takes the rows gpuq's ending left in the "
        "index's journal (section 14: reading it, listing the directories, writing the index), and without "
        "any journal reads every file once into the index.",
        "",
    ]
    if any(row[-1] == "**no**" for row in rows):
        lines += [
            "Targets marked **no** are missed on this run; `bench/PROFILE.md` says where the time goes and what "
            "meeting each would take (for the week's, `bench/WEEK.md`).",
            "",
        ]
    return lines


def _mark(ok: bool) -> str:
    return "yes" if ok else "**no**"


def render(results: dict[str, Any], meta: dict[str, Any], sizes: dict[str, int]) -> str:
    lines = [f"# gpuq benchmark results{' (smoke run: tiny sizes, not comparable)' if meta['smoke'] else ''}", ""]
    lines += [f"- {key}: {value}" for key, value in meta["facts"].items()]
    lines += [""]
    for peer, why in meta["skipped"].items():
        lines += [f"- **{peer} skipped**: {why}"]
    lines += ["", ORIGINAL_GPUQ_FACTS, ""]
    lines += targets(results, sizes, meta.get("compared"))
    if "dispatch" in results:
        lines += dispatch_section(results["dispatch"])
    if "back_to_back" in results:
        lines += gap_section(results["back_to_back"])
    if "throughput" in results:
        lines += throughput_section(results["throughput"], sizes["jobs"])
    if "cli" in results:
        lines += cli_section(results["cli"])
    if "idle" in results:
        lines += idle_section(results["idle"], sizes["idle_seconds"], sizes["pending"])
    if "log" in results:
        lines += log_section(results["log"])
    if "scale" in results:
        lines += scale_section(results["scale"], sizes["scale"])
    if "dispatch_git" in results:
        lines += report_situations.dispatch_git_section(results["dispatch_git"], sizes)
    if "back_to_back_gpus" in results:
        lines += report_situations.gap_gpus_section(results["back_to_back_gpus"])
    if "researcher" in results:
        lines += report_situations.researcher_section(results["researcher"], sizes)
    if "week" in results:
        lines += report_week.section(results["week"])
    for name, why in meta.get("errors", {}).items():
        lines += [f"- **{name} failed**: {why}"]
    return "\n".join(lines).rstrip() + "\n"
