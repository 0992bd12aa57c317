"""core/jsontext.py and the pattern-free name checks stand in for `json` and `re` on the start-up
path (issue 15): each must give exactly what the module it replaces gives, compared here with
that module on generated and hostile input."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.core import jsontext, lazyre, schema
from gpuq.spool.layout import is_job_name, job_names

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)
JOB_HOOKS = {
    "object_pairs_hook": schema._reject_duplicate_keys,
    "parse_constant": schema._no_constant,
    "parse_float": schema._finite_float,
}


def outcome(parse: Any, text: Any, **hooks: Any) -> tuple:
    """What a parse gives: the value, or the error with everything it reports."""
    try:
        return ("value", repr(parse(text, **hooks)))
    except json.JSONDecodeError as exc:
        return ("JSONDecodeError", exc.msg, exc.pos, exc.lineno, exc.colno)
    except Exception as exc:  # noqa: BLE001 - any other error must match too
        return (type(exc).__name__, str(exc))


@settings(max_examples=150, deadline=None)
@given(VALUES, st.sampled_from([None, 0, 2, 4]), st.booleans(), st.sampled_from([None, (",", ":"), (" ,", " = ")]))
def test_dumps_writes_what_json_writes(value: Any, indent: Any, ensure_ascii: bool, separators: Any) -> None:
    assert jsontext.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators) == json.dumps(
        value, indent=indent, ensure_ascii=ensure_ascii, separators=separators
    )


@settings(max_examples=150, deadline=None)
@given(VALUES)
def test_loads_reads_what_json_reads(value: Any) -> None:
    text = json.dumps(value, indent=2)
    assert outcome(jsontext.loads, text) == outcome(json.loads, text)
    assert outcome(jsontext.loads, text.encode()) == outcome(json.loads, text.encode())


HOSTILE = [
    "",
    "  ",
    "{",
    '{"a": 1}x',
    '{"a": 1} \n',
    ' \n {"a": [1, 2.5, null]}\n ',
    "\ufeff{}",
    "[1,]",
    '{"a" 1}',
    '"\x01"',
    "NaN",
    "[-Infinity]",
    "1e999",
    '{"a": 1, "a": 2}',
    "01",
    "nul",
    "[" * 100_000,
    "9" * 5000,
    b'{"a": "\xc3\xa9"}',
    b"\xef\xbb\xbf{}",
    b"\xff\xfe{\x00}\x00",
    b"\xc3(",
    b'{"a": 1}\x00',
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("hooks", [{}, JOB_HOOKS], ids=["plain", "job"])
def test_bad_text_fails_as_json_fails(text: Any, hooks: dict) -> None:
    assert outcome(jsontext.loads, text, **hooks) == outcome(json.loads, text, **hooks)


def test_values_json_converts_go_to_json() -> None:
    """Keys that are not strings, int and str subclasses, cycles: json's own result or error."""
    assert jsontext.dumps({1: 2, None: 3, 1.5: 4}) == json.dumps({1: 2, None: 3, 1.5: 4})
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular reference"):
        jsontext.dumps(cycle)
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsontext.dumps({"a": object()})


JOB_NAME_RE = re.compile(r"^(\d{6,})-[A-Za-z0-9._-]*\.json$")  # the rule spool_layout.md states


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="0123456789٣-.jsonabZ_ \n/é", max_size=16))
def test_is_job_name_is_the_pattern(name: str) -> None:
    assert is_job_name(name) == bool(JOB_NAME_RE.match(name))


@pytest.mark.parametrize(
    "name",
    ["000001-a.json", "000001-.json", "1234567-x.y-z.json", "000001-a.json\n", "00001-a.json", "000001a.json",
     "000001-a b.json", "000001-a.jsonx", ".000001-a.json", "000001-é.json", "٠٠٠٠٠١-a.json", "000001-a.json\n\n"],
)  # fmt: skip
def test_is_job_name_on_edges(name: str) -> None:
    assert is_job_name(name) == bool(JOB_NAME_RE.match(name))


_VALID = st.builds(
    lambda i, rest: f"{i:06d}-{rest}.json", st.integers(0, 10**8), st.text(alphabet="ab.-_Z9", max_size=6)
)
_ODD = st.text(alphabet="0123456789٣-.jsonabZ_ \n/é", max_size=16)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(_VALID, _VALID, _VALID, _ODD), max_size=12))
def test_job_names_of_a_listing_are_is_job_names(entries: list[str]) -> None:
    """The bulk test of a whole listing (valid names nearly always) keeps what is_job_name keeps."""
    assert job_names(list(entries)) == [n for n in entries if JOB_NAME_RE.match(n)]


def test_job_names_falls_back_for_one_odd_name() -> None:
    valid = [f"{i:06d}-x.json" for i in range(50)]
    odds = ("00001-a.json", "000001-a.json\n", "٠٠٠٠٠١-a.json", "000001a.json", "000001-a b.json")
    for odd in (*odds, ".t", "1.json-1.json", "000001-é.json"):
        assert job_names([*valid, odd]) == valid + ([odd] if JOB_NAME_RE.match(odd) else [])
    assert job_names(valid) == valid and job_names([]) == []


def test_lazy_patterns_take_re_flags_without_importing_re() -> None:
    """core/lazyre.py spells re.IGNORECASE itself (the progress parser's patterns use it)."""
    assert lazyre.IGNORECASE == re.IGNORECASE
    assert lazyre.lazy(r"steps? (\d+)", lazyre.IGNORECASE).search("STEP 3").group(1) == "3"


SLUG_RE = re.compile(r"[^A-Za-z0-9._-]+")


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="ab.-_ /é\x00\n9Z", max_size=80))
def test_slug_replaces_runs_as_the_pattern_did(name: str) -> None:
    expected = SLUG_RE.sub("-", name).strip("-.")[:60] or "job"
    assert schema.slug(name) == expected


def test_errors_in_an_interpreter_that_has_not_imported_json(tmp_path: Any) -> None:
    """The start-up path never imports json: a bad file must still fail with json's error (the C
    scanner looks for it in an imported json.decoder), and the good ones must not import json."""
    probe = (
        "import sys\n"
        "from gpuq.core import jsontext\n"
        "assert jsontext.loads('{\"a\": [1]}') == {'a': [1]}\n"
        "assert jsontext.dumps({'a': [1]}, indent=2) == '{\\n  \"a\": [\\n    1\\n  ]\\n}'\n"
        "assert 'json' not in sys.modules and 're' not in sys.modules, 'imported on the good path'\n"
        "for text in ('{\"a\" 1}', '[1,]', '\"\\x01\"', '', '{} x'):\n"
        "    try:\n"
        "        jsontext.loads(text)\n"
        "    except ValueError as exc:\n"
        "        print(type(exc).__name__, exc.msg, exc.pos)\n"
    )
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        env={**os.environ, "PYTHONPATH": repo},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    expected = []
    for text in ('{"a" 1}', "[1,]", '"\x01"', "", "{} x"):
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            expected.append(f"JSONDecodeError {exc.msg} {exc.pos}")
    assert proc.stdout.splitlines() == expected
