"""The report's part for issue 27's scenarios (bench/variants.py, bench/researcher.py): their
sections of RESULTS.md and their rows of the targets table, judged on this run's medians."""

from __future__ import annotations

from typing import Any

from common import md_table, median, median_of, ms, p95

RESEARCHER_PEERS = {"status": ("tsp -l", "fq -nq"), "add": ("tsp add", "nq add")}
COMMANDS = ("status", "status --json", "add", "eta", "history")
SMALL = 2000  # the first size; above it, the looser limits of 10,000 finished jobs


def researcher_limit(finished: int, command: str) -> tuple[float, int]:
    """The limit (ms above the baseline) of `command` with `finished` jobs, and whose it is: issue
    40's budgets; `history` at 2,000 finished, which issue 40 does not bound, keeps issue 27's."""
    if command == "history":
        return (60.0, 27) if finished <= SMALL else (150.0, 40)
    return (40.0 if finished <= SMALL else 60.0), 40


def targets(results: dict[str, Any], compared: str = "") -> list[dict[str, Any]]:
    """Rows of the targets table, as keyword arguments of report.targets' `add`; `other`: the figure
    of the compared gpuq named `compared` ("": none)."""
    rows: list[dict[str, Any]] = []
    if "dispatch_git" in results:
        d = results["dispatch_git"]
        rows.append(
            dict(
                what="`add` launched -> job's first instruction, in a git repository (dirty tree), idle worker",
                value=median_of(d, "gpuq", key="submitted"),
                limit=80,
                unit="ms",
                issue=40,
                peers=(median_of(d, "tsp", key="submitted"), median_of(d, "nq", key="submitted")),
                other=median_of(d, compared, key="submitted"),
            )
        )
    if "back_to_back_gpus" in results:
        b = results["back_to_back_gpus"]
        tsp = median_of(b, "tsp")
        limit = 3 * tsp if tsp is not None else 50.0
        text = f"<= 3x tsp = {limit:.1f} ms" if tsp is not None else "<= 50 ms (no tsp in this run)"
        rows.append(
            dict(
                what="back-to-back gap, 2 simulated GPUs, one job per GPU (tsp: 2 slots)",
                value=median_of(b, "gpuq"),
                limit=limit,
                unit="ms",
                issue=27,
                peers=(tsp, None),
                limit_text=text,
            )
        )
    for finished, commands in sorted((int(k), v) for k, v in results.get("researcher", {}).get("finished", {}).items()):
        bare = median(commands["python -c pass"])
        above = {label: (median(v) - bare) * 1000 for label, v in commands.items()}
        for command in COMMANDS:
            limit, issue = researcher_limit(finished, command)
            peers = tuple(
                median(commands[c]) * 1000 if c in commands else None for c in RESEARCHER_PEERS.get(command, ())
            )
            rows.append(
                dict(
                    what=f"researcher's spool, {finished:,} finished: `gpuq {command}` above the baseline",
                    value=above[f"gpuq {command}"],
                    limit=limit,
                    unit="ms",
                    issue=issue,
                    peers=(peers + (None, None))[:2],
                    other=above.get(f"{compared} {command}"),
                )
            )
    return rows


def dispatch_git_section(data: dict[str, dict[str, list[float]]], sizes: dict[str, Any]) -> list[str]:
    rows = []
    for name, d in data.items():
        s, q = d["submitted"], d["queued"]
        rows.append([name, ms(median(s)), ms(p95(s)), ms(median(q)), str(len(s))])
    return [
        "## 8. Dispatch inside a git repository (issue 27)",
        "",
        f"As section 1, every queue's commands run from inside one git repository ({sizes['git_files']} tracked "
        "files, one changed since the last commit), where `gpuq add` records the code's commit and state. Each "
        f"round of samples follows {sizes['dispatch_idle']:g} s in which no queue had anything to do (after 5 s of "
        "that, gpuq's worker has a full look due, as when a user's job comes).",
        "",
        *md_table(["system", "median add invoked->start (ms)", "p95 (ms)", "median queued->start (ms)", "jobs"], rows),
    ]


def gap_gpus_section(data: dict[str, list[float]]) -> list[str]:
    rows = [[name, ms(median(v)), ms(p95(v)), str(len(v))] for name, v in data.items()]
    return [
        "## 9. Back-to-back gap with two simulated GPUs (issue 27)",
        "",
        "As section 2 on a machine of two GPUs: gpuq with two simulated GPUs (`GPUQ_FAKE_GPUS`), each job taking "
        "one; task-spooler with two slots. A long job holds the other GPU (slot) throughout, so B waits for A's. "
        "nq runs one job at a time and has no part here.",
        "",
        *md_table(["system", "median gap (ms)", "p95 (ms)", "pairs"], rows),
    ]


def researcher_section(data: dict[str, Any], sizes: dict[str, Any]) -> list[str]:
    rows = []
    failed = ", ".join(f"{n:,} of {int(k):,}" for k, n in data.get("failed", {}).items())
    for finished, commands in sorted((int(k), v) for k, v in data["finished"].items()):
        bare = median(commands["python -c pass"])
        for label, values in commands.items():
            above = ms(median(values) - bare) if label.startswith("gpuq") else ""
            rows.append([f"{finished:,}", f"`{label}`", ms(median(values)), ms(p95(values)), above, str(len(values))])
    return [
        "## 10. A researcher's spool (issue 27)",
        "",
        f"Every command runs from inside a git repository ({data.get('tracked files', '?')} tracked files, one "
        f"changed). gpuq: finished jobs from a few commands and sweeps of 12 (failed: {failed}; the others "
        f"done), written through its library from job files of real `gpuq add`s; two simulated GPUs, each "
        f"running a real long job; {sizes['researcher_pending']} jobs pending behind them (real `gpuq add`s). "
        "`gpuq add` queues a training script of the repository (its job is removed again after each sample). "
        f"The peers, with {min(sizes['researcher_finished'][0], sizes['researcher_peer_max']):,} finished jobs "
        "(real runs of `true`) and jobs waiting behind long ones (tsp: two slots, two running; nq: one running, "
        "it runs one at a time), list their queue (`tsp -l`, `fq -nq`) and queue the same command (`tsp CMD`, "
        "`nq CMD`; taken out again after each sample); they have no `--json`, ETA or history, and are not "
        "filled further: they get finished jobs only by running them.",
        "",
        *md_table(["finished jobs", "command", "median (ms)", "p95 (ms)", "gpuq above bare python (ms)", "runs"], rows),
    ]


__all__ = ["targets", "dispatch_git_section", "gap_gpus_section", "researcher_section"]
