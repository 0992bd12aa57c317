"""The report's part for issue 42's week (bench/week.py, the `week` step of bench/run.py): its rows
of the targets table and its section of RESULTS.md, from the figures week.py computed."""

from __future__ import annotations

from typing import Any

import week

TITLE = "## 11. A researcher's week, replayed (bench/week.py)"


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 42's three targets for gpuq, as keyword arguments of report.targets' `add`, with
    task-spooler's figure of the same run beside them where it ran."""
    if "week" not in results or "gpuq" not in results["week"]["systems"]:
        return []
    systems = results["week"]["systems"]
    mine, tsp = systems["gpuq"], systems.get("tsp")

    def ratio(f: dict[str, float]) -> float:
        return f["makespan"] / f["bound"]

    def beside(value: Any) -> tuple[Any, None]:
        return (value if tsp is not None else None, None)

    return [
        dict(
            what="a researcher's week: makespan / its lower bound",
            value=ratio(mine),
            limit=1.15,
            unit="x",
            issue=42,
            peers=beside(tsp and ratio(tsp)),
        ),
        dict(
            what="a researcher's week: GPU idle while work waits",
            value=mine["idle_share"] * 100,
            limit=2.0,
            unit="%",
            issue=42,
            peers=beside(tsp and tsp["idle_share"] * 100),
            limit_text="< 2 %",
            strict=True,
        ),
        dict(
            what="a researcher's week: work done twice, of the trace's GPU-seconds",
            value=mine["twice_share"] * 100,
            limit=2.0,
            unit="%",
            issue=42,
            peers=beside(tsp and tsp["twice_share"] * 100),
            limit_text="< 2 %",
            strict=True,
        ),
    ]


def section(data: dict[str, Any]) -> list[str]:
    """The trace, how each system ran it, and week.py's table of both."""
    first = data.get("first")
    part = f"; only its first {first} jobs: the wiring is tested, the figures mean nothing" if first else ""
    tsp = (
        "task-spooler: one slot per GPU, each job a whole GPU, its queue lost with its server at the crash; the "
        "two systems run one after the other on the same trace"
        if "tsp" in data["systems"]
        else "task-spooler: not in this run"
    )
    return [
        TITLE,
        "",
        f"- trace: {data['trace']} (seed {data['seed']}, durations times {data['scale']:g}{part})",
        f"- gpuq: a compiled copy of this checkout's package (`python -m gpuq` of the bench's interpreter); {tsp}. "
        "What each figure counts, and where the waste goes: bench/WEEK.md.",
        "",
        *week.table(data["systems"]),
        "",
    ]
