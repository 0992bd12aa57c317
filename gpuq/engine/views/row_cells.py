"""How the CLI turns a finished job into its row, handed to engine/views/status.py and
engine/views/finished_rows.py. A module of its own so that a plain `gpuq status`, which needs it only
for a damaged file's row, does not import the finished-row cache (bench/PROFILE.md, section 1)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing only for annotations: importing it costs every start-up (bench/PROFILE.md)
if TYPE_CHECKING:
    from typing import Any, Callable

Cells = tuple  # a row's cells after its id and state: name, script, time, info (strings)


class RowCells:
    """How a finished job becomes its row (the CLI's render functions): `fields` is every field
    `cells(job, state)` reads; `damaged(file_name, reason)` is the row of a file that is not a job;
    `block(view)` is (the column widths, the text) of a FinishedView's rows as a table's lines."""

    __slots__ = ("fields", "cells", "damaged", "block")

    def __init__(
        self,
        fields: tuple[str, ...],
        cells: Callable[[dict[str, Any], str], Cells],
        damaged: Callable[[str, str], Cells],
        block: Callable[[Any], tuple[tuple[int, ...], str]],
    ) -> None:
        self.fields, self.cells, self.damaged, self.block = fields, cells, damaged, block
