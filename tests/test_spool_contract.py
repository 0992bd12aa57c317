"""spool_layout.md is a tested contract (issue 10): its field table is the schema in the code, its
tree table is what the spool creates, and its states are gpuq's states."""

from __future__ import annotations

import os
import re
from pathlib import Path

from conftest import REPO

from gpuq.core import schema, states
from gpuq.core.job import FIELDS
from gpuq.spool import Spool

DOC = (REPO / "spool_layout.md").read_text()


def _table_after(heading: str) -> list[list[str]]:
    """The rows (cells) of the first Markdown table after `heading`."""
    body = DOC.split(heading, 1)[1]
    rows = []
    for line in body.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif rows:
            break
    return rows[1:]  # without the header


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_field_table_is_the_job_record() -> None:
    """Every field of core/job.py in the table and no other; required, nullable and a default that
    is not the type's own (`gpu_request`: 1) said as the record says them; the schema derived from it."""
    rows = _table_after("### Fields")
    documented = {name for row in rows for name in _names(row[0])}
    required = {name for row in rows if row[1] == "yes" for name in _names(row[0])}
    assert documented == set(FIELDS) == set(schema.KNOWN_FIELDS)
    assert required == {f.name for f in FIELDS.values() if f.required}
    for row in rows:
        for name in _names(row[0]):
            field = FIELDS[name]
            assert ("null" in row[2]) == field.check(None), (
                f"{name}: the table says {row[2]!r}, the record {field.what!r}"
            )
            if not field.required and field.default not in (None, False, 0, "", []):
                assert f"absent means {field.default}" in row[3], f"{name}: its default {field.default!r} is not said"


def test_a_new_job_holds_only_documented_fields() -> None:
    job = schema.new_job(job_id=1, name="x", cmd=["true"], cwd="/", log="")
    assert set(job) <= set(schema.KNOWN_FIELDS)
    schema.validate(job)


def test_tree_table_is_what_the_spool_creates(tmp_path: Path) -> None:
    rows = _table_after("## 1. The tree")
    directories = {row[0].strip("`").rstrip("/") for row in rows if row[1] in ("state", "dir")}
    files = {row[0].strip("`") for row in rows if row[1] == "file"}
    assert {row[0].strip("`").rstrip("/") for row in rows if row[1] == "state"} == set(states.STATES)

    spool = Spool(tmp_path / "spool").ensure()
    assert set(os.listdir(spool.home)) == directories | {"reserve"}  # the emergency room comes with the tree
    spool.ids.allocate()
    with spool.dropbox.turn():
        pass
    with spool.adopt_lock():
        pass
    with spool.import_lock():
        pass
    spool.files.keep_emergency_room()
    spool.kept.append([(1, "done", "x", "key", None, "[]", None, None)])  # what `gpuq clear` keeps
    spool.web_token.get()  # what `gpuq web` asks of every request
    spool.lease_id.get()  # what a lease or ticket names its queue by
    created = {n for n in os.listdir(spool.home) if os.path.isfile(os.path.join(spool.home, n))}
    assert created == files
