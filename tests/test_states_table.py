"""One table of states (issue 25): core/states.py spells every state once, with what the displays
look up per state; no other module of gpuq spells a state as a bare string, so adding a state is
one constant and one row of states.TABLE, and a display that forgets it reads the table anyway.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from conftest import REPO

from gpuq.core import states
from gpuq.spool.layout import INTERNAL, Layout

PACKAGE = REPO / "gpuq"
STATES_MODULE = PACKAGE / "core" / "states.py"
# Words spelled like a state that are also something else, allowed only where they are that thing:
# the job fields `slurm` and `ray` (its Slurm or Ray job id and state) are read as job["slurm"],
# job.get("slurm"), written as a dict key, or listed among other field names.
ALSO_FIELDS = {states.SLURM, states.RAY}
KEY_METHODS = ("get", "pop", "setdefault")
# `gpuq slurm`: a subcommand named after Slurm, not the state (argparse's add_parser, cli/commands.py's Command)
COMMAND_METHODS = ("add_parser", "Command")


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _is_slots(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """An element of `__slots__ = (...)`: an attribute's name."""
    holder = parents.get(parents.get(node))
    targets = holder.targets if isinstance(holder, ast.Assign) else []
    return any(isinstance(target, ast.Name) and target.id == "__slots__" for target in targets)


def _is_call_arg(node: ast.AST, parent: ast.AST, methods: tuple[str, ...]) -> bool:
    func = parent.func if isinstance(parent, ast.Call) else None
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name in methods and bool(parent.args) and parent.args[0] is node


def _is_field(node: ast.Constant, parent: ast.AST) -> bool:
    """`node` names the job field of the same spelling (ALSO_FIELDS) by where it stands."""
    if node.value not in ALSO_FIELDS:
        return False
    if isinstance(parent, ast.Subscript) or _is_call_arg(node, parent, KEY_METHODS):
        return True
    if isinstance(parent, ast.Dict):
        return any(key is node for key in parent.keys)
    if isinstance(parent, (ast.Tuple, ast.List)):  # a list of field names: another name in it is no state
        words = [e.value for e in parent.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return any(word not in states.STATES for word in words)
    return False


def bare_states(path: Path) -> list[tuple[int, str]]:
    """(line, state) of each string constant of `path` equal to a state name that is not allowed
    for another reason (above)."""
    tree = ast.parse(path.read_text(), str(path))
    parents = _parents(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in states.STATES):
            continue
        parent = parents[node]
        if _is_field(node, parent) or _is_slots(node, parents) or _is_call_arg(node, parent, COMMAND_METHODS):
            continue
        found.append((node.lineno, node.value))
    return sorted(found)


def test_no_state_is_spelled_outside_the_table() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {word!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != STATES_MODULE
        for line, word in bare_states(path)
    ]
    assert found == [], "use the constants of gpuq/core/states.py:\n" + "\n".join(found)


def test_the_scan_finds_a_state_and_lets_a_field_be(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "if state == 'done': pass\n"  # a state: found
        "ids = job['slurm'], job.get('slurm'), {'slurm': None}, ('name', 'slurm')\n"  # the field
        "glyphs = {'slurm': 1}\n"  # a dict key: taken for the field (the one word that is both)
        "class Row:\n    __slots__ = ('pending', 'running')\n"
        "sub.add_parser('slurm')\n"
        "on = ('slurm', 'held')\n"  # states alone in a tuple: found, both
    )
    assert bare_states(sample) == [(1, "done"), (7, "held"), (7, "slurm")]


def test_the_table_covers_every_state_directory(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "spool")
    layout.ensure()
    made = set(os.listdir(layout.home)) - set(INTERNAL) - {states.REJECTED}
    assert made == {state.name for state in states.TABLE}
    assert all(os.path.isdir(layout.state_dir(state.name)) for state in states.TABLE)


def test_each_row_is_told_apart() -> None:
    """Glyphs distinct (the St column is all that tells states apart), ranks an order, and each
    state an attempt ends in has a label, a colour and a place in the legend."""
    rows = states.TABLE
    assert len({row.name for row in rows}) == len({row.glyph for row in rows}) == len(rows)
    assert sorted(row.rank for row in rows) == list(range(len(rows)))
    outcomes = [row for row in rows if row.label is not None]
    assert all(row.colour and row.legend is not None for row in outcomes)
    assert sorted(row.legend for row in outcomes) == list(range(len(outcomes)))
    assert states.FINISHED == (states.DONE, states.FAILED, states.CANCELLED)
    assert states.BY_NAME[states.HELD].glyph == "⏸️"
