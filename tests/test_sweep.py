"""gpuq.core.sweep: --sweep values, placeholder expansion, job names; gpuq.core.timespec: --after id ranges."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq.core.sweep import (
    HARD_LIMIT,
    Combination,
    expand,
    fill,
    parse_sweep,
    placeholders,
    sweep_name,
)
from gpuq.core.timespec import parse_id_ranges

# -- parse_sweep --


@pytest.mark.parametrize(
    "text,name,values",
    [
        ("lr=1e-4,3e-4,1e-3", "lr", ["1e-4", "3e-4", "1e-3"]),
        ("seed=0", "seed", ["0"]),
        ("seed = 0, 1", "seed", ["0", "1"]),  # spaces around values dropped
        ("opt=adam,sgd", "opt", ["adam", "sgd"]),
        (r"betas=0.9\,0.99,0.8\,0.9", "betas", ["0.9,0.99", "0.8,0.9"]),  # \, is a literal comma
        (r"path=a\\,b", "path", ["a\\", "b"]),  # \\ is a literal backslash
        (r"re=a\d+,b", "re", [r"a\d+", "b"]),  # any other backslash is kept
        ("arg=--flag=1,x=y", "arg", ["--flag=1", "x=y"]),  # only the first = splits
        ("_x2=a", "_x2", ["a"]),
    ],
)
def test_parse_sweep(text, name, values):
    assert parse_sweep(text) == (name, values)


@pytest.mark.parametrize(
    "text,message",
    [
        ("lr", r"expected NAME=V1,V2"),
        ("=1,2", r"'' is not a name"),
        ("2lr=1,2", r"'2lr' is not a name"),
        ("learning-rate=1", r"is not a name"),
        ("lr=", r"--sweep lr: no values"),
        ("lr=  ", r"--sweep lr: no values"),
        ("lr=1,,2", r"empty value"),
        ("lr=1,2,", r"empty value"),
        ("seed=0,1,0", r"value '0' given twice"),
        ("msg=a\nb", r"control character"),
    ],
)
def test_parse_sweep_refusals(text, message):
    with pytest.raises(ValueError, match=message) as caught:
        parse_sweep(text)
    assert "\n" not in str(caught.value)


# -- expand --

WORDS = ["train.py", "--lr", "{lr}", "--seed", "{seed}"]
LR = ("lr", ["1e-4", "3e-4", "1e-3"])
SEED = ("seed", ["0", "1"])


def test_expand_is_the_product_with_the_first_sweep_slowest():
    combos = expand([LR, SEED], WORDS)
    assert [c.values for c in combos] == [
        {"lr": lr, "seed": seed} for lr in ["1e-4", "3e-4", "1e-3"] for seed in ["0", "1"]
    ]
    assert combos[0] == Combination({"lr": "1e-4", "seed": "0"}, ["train.py", "--lr", "1e-4", "--seed", "0"])
    assert combos[-1].words == ["train.py", "--lr", "1e-3", "--seed", "1"]
    assert list(combos[3].values) == ["lr", "seed"]  # values keep the --sweep order, for names


def test_swapping_the_sweeps_swaps_which_varies_slowest():
    combos = expand([SEED, LR], WORDS)
    assert [(c.values["seed"], c.values["lr"]) for c in combos][:3] == [("0", "1e-4"), ("0", "3e-4"), ("0", "1e-3")]


def test_a_word_may_hold_several_placeholders_and_other_text_and_the_script_too():
    combos = expand(
        [("model", ["small"]), LR, SEED], ["{model}/train.py", "--out=runs/{lr}-{seed}", "--tag", "{lr}{lr}"]
    )
    assert combos[1].words == ["small/train.py", "--out=runs/1e-4-1", "--tag", "1e-41e-4"]


def test_braces_that_are_not_placeholders_pass_through():
    words = [
        "run.sh",
        '{"lr": {lr}, "opt": {"name": "adam"}}',  # JSON around a placeholder, nested braces kept
        "find",
        ".",
        "-exec",
        "rm",
        "{}",
        ";",
        "{0}",
        "{ lr }",
        "{lr-2}",
        "}}{{",
    ]
    (combo,) = expand([("lr", ["0.1"])], words)
    assert combo.words[1] == '{"lr": 0.1, "opt": {"name": "adam"}}'
    assert combo.words[2:] == words[2:]


def test_doubled_braces_around_a_name_are_a_literal_placeholder():
    (combo,) = expand([("lr", ["0.1"])], ["--lr", "{lr}", "--template", "{{lr}}", "{{{lr}}}"])
    assert combo.words == ["--lr", "0.1", "--template", "{lr}", "{{lr}}"]
    assert placeholders("{{lr}}-{seed}") == ["seed"]


def test_values_are_inserted_verbatim_not_read_again():
    (combo,) = expand([("a", ["{b}"]), ("b", ["x"])], ["{a}", "{b}"])
    assert combo.words == ["{b}", "x"]


def test_without_sweeps_the_command_is_not_touched():
    words = ["train.py", "{lr}", "{{x}}"]
    assert expand([], words) == [Combination({}, words)]


def test_unknown_placeholder_is_refused_naming_it_and_the_sweeps():
    with pytest.raises(ValueError) as caught:
        expand([LR, SEED], ["train.py", "--lr", "{lr2}", "--seed", "{seed}"])
    message = str(caught.value)
    assert message.startswith("unknown placeholder {lr2} in 'train.py --lr {lr2} --seed {seed}'; sweeps: lr, seed")
    assert "{{lr2}}" in message  # how to write it literally


def test_several_unknown_placeholders_are_all_named():
    with pytest.raises(ValueError, match=r"unknown placeholders \{a\}, \{b\} in"):
        expand([LR], ["x.py", "{lr}", "{a}", "{b}", "{a}"])


def test_a_long_command_is_shortened_to_the_offending_word():
    words = ["train.py", *[f"--opt{i}=value{i}" for i in range(30)], "--out={typo}", "{lr}"]
    with pytest.raises(ValueError, match=r"in '--out=\{typo\}'; sweeps: lr"):
        expand([LR], words)


def test_a_sweep_not_used_in_the_command_is_refused():
    with pytest.raises(ValueError, match=r"--sweep seed is not used in the command \(no \{seed\}\)"):
        expand([LR, SEED], ["train.py", "--lr", "{lr}"])


def test_an_escaped_name_does_not_count_as_using_the_sweep():
    with pytest.raises(ValueError, match="--sweep lr is not used"):
        expand([LR], ["train.py", "{{lr}}"])


def test_a_sweep_given_twice_is_refused():
    with pytest.raises(ValueError, match=r"--sweep lr given twice"):
        expand([LR, SEED, ("lr", ["1"])], WORDS)


def test_an_empty_sweep_is_refused():
    with pytest.raises(ValueError, match=r"--sweep seed: no values"):
        expand([LR, ("seed", [])], WORDS)


def test_more_than_the_limit_needs_yes():
    sweeps = [("a", [str(i) for i in range(60)]), ("b", [str(i) for i in range(100)])]
    words = ["x.py", "{a}", "{b}"]
    with pytest.raises(ValueError) as caught:
        expand(sweeps, words)
    assert str(caught.value) == "6,000 jobs; pass --yes to queue more than 1,000"
    assert len(expand(sweeps, words, allow_more=True)) == 6000
    assert len(expand(sweeps[:1], words[:2])) == 60
    with pytest.raises(ValueError, match="pass --yes to queue more than 50"):
        expand(sweeps[:1], words[:2], limit=50)


def test_exactly_the_limit_is_allowed():
    assert len(expand([("a", [str(i) for i in range(1000)])], ["{a}"])) == 1000


def test_the_hard_limit_holds_even_with_yes_and_is_checked_before_building_anything():
    # 1000**3 combinations: if expand built them before counting, this test would run out of memory.
    thousand = [str(i) for i in range(1000)]
    expected = rf"1,000,000,000 jobs; one add queues at most {HARD_LIMIT:,}, even with --yes"
    with pytest.raises(ValueError, match=expected):
        expand([("a", thousand), ("b", thousand), ("c", thousand)], ["{a}{b}{c}"], allow_more=True)


def test_fill_alone():
    assert fill("runs/{lr}/{{lr}}/{}", {"lr": "3"}) == "runs/3/{lr}/{}"
    with pytest.raises(KeyError):
        fill("{nope}", {})


_value = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=8).map(str.strip).filter(bool)


@given(st.lists(_value, min_size=1, max_size=6, unique=True))
def test_escaped_values_read_back(values):
    """Any list of values, written with `\\` and `,` escaped, reads back as the same list."""
    written = ",".join(value.replace("\\", "\\\\").replace(",", "\\,") for value in values)
    assert parse_sweep(f"v={written}") == ("v", values)


# -- sweep_name --


def test_sweep_name():
    assert sweep_name("exp02/train", {"lr": "1e-4", "seed": "0"}) == "exp02/train lr=1e-4 seed=0"
    assert sweep_name("exp02/train", {"msg": "hello world"}) == "exp02/train msg='hello world'"
    assert sweep_name("exp02/train", {}) == "exp02/train"
    assert sweep_name("", {"lr": "1"}) == "lr=1"


def test_every_combination_of_a_sweep_gets_a_different_name():
    combos = expand([LR, SEED], WORDS)
    names = {sweep_name("exp02/train", c.values) for c in combos}
    assert len(names) == len(combos) == 6


# -- parse_id_ranges --


@pytest.mark.parametrize(
    "text,ids",
    [
        ("12", [12]),
        ("12-17", [12, 13, 14, 15, 16, 17]),
        ("3,5,9-11", [3, 5, 9, 10, 11]),
        (" 3 , 5 , 9 - 11 ", [3, 5, 9, 10, 11]),
        ("#12-#14", [12, 13, 14]),
        ("7-7", [7]),
        ("5,1-3,2", [5, 1, 2, 3]),  # order given, each id once
        ("3,,5,", [3, 5]),  # stray commas ignored, as --after ID,ID was
        ("1-100000", list(range(1, 100001))),
    ],
)
def test_id_ranges(text, ids):
    assert parse_id_ranges(text) == ids


@pytest.mark.parametrize(
    "text,message",
    [
        ("", "no job id"),
        (" , ", "no job id"),
        ("17-12", r"'17-12' runs backwards; write 12-17"),
        ("0", "job ids start at 1"),
        ("0-3", "job ids start at 1"),
        ("-3", "cannot read '-3'"),
        ("12-", "cannot read '12-'"),
        ("1-2-3", "cannot read"),
        ("a-b", "cannot read"),
        ("1.5", "cannot read"),
        ("1-100001", "names more than 100,000 jobs"),
        ("1-60000,70000-130000", "names more than 100,000 jobs"),
    ],
)
def test_bad_id_ranges_are_refused(text, message):
    with pytest.raises(ValueError, match=message) as caught:
        parse_id_ranges(text)
    assert not str(caught.value).startswith("-")  # argparse names the option; the message does not guess it


def test_the_flag_named_in_id_messages_is_the_callers():
    with pytest.raises(ValueError, match=r"^--after-any: "):
        parse_id_ranges("x", flag="--after-any")


def test_the_folded_sweep_line_counts_every_job_of_the_sweep(gq):
    """`gpuq status` folds a sweep into one line whose counts add up to its size: cancelled jobs are
    counted too (named only when there are some), not left out of done, running, waiting, failed."""
    gq.script("job.py", "print('ran')\n")
    gq.gpuq("add", "--hold", "--sweep", "lr=1,2,3", "--sweep", "seed=1,2", "job.py", "--lr", "{lr}", "--seed", "{seed}")
    before = gq.gpuq("status").stdout
    assert "sweep of 6 over lr, seed: 0 done, 0 running, 6 waiting, 0 failed (" in before, before
    gq.gpuq("cancel", "2", "3")
    said = gq.gpuq("status").stdout
    assert "sweep of 6 over lr, seed: 0 done, 0 running, 4 waiting, 0 failed, 2 cancelled (" in said, said


def test_the_folded_sweep_line_counts_its_finished_jobs_that_status_hides(gq):
    """Once newer jobs push some of a sweep's finished jobs out of `gpuq status`, its line still
    counts them (from the finished index), as `gpuq show` does."""
    gq.script("job.py", "print('ran')\n")
    gq.gpuq("add", "-q", "--sweep", "x=1,2,3,4,5,6", "job.py", "--x", "{x}")
    gq.gpuq("hold", "5,6")
    gq.gpuq("run")
    assert "sweep of 6 over x: 4 done, 0 running, 2 waiting, 0 failed (" in gq.gpuq("status").stdout
    for _ in range(9):
        gq.gpuq("add", "-q", "job.py")
    gq.gpuq("run")
    said = gq.gpuq("status").stdout
    assert "3 older finished jobs hidden" in said, said  # sweep jobs 1-3 are not rows
    assert "sweep of 6 over x: 4 done, 0 running, 2 waiting, 0 failed (" in said, said
