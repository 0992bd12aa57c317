"""gpuq.core.timespec: durations (Slurm's conventions), start times, sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq.core.timespec import (
    format_duration,
    parse_begin,
    parse_duration,
    parse_size_bytes,
    parse_size_mib,
)

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("45s", 45),
        ("90m", 5400),
        ("4h", 14400),
        ("2d", 172800),
        ("1h30m", 5400),
        ("2d4h", 2 * 86400 + 4 * 3600),
        ("1h30m15s", 5415),
        ("1.5h", 5400),
        ("4H", 14400),
        (" 1h 30m ", 5400),
        ("90", 5400),  # a bare number is minutes, as Slurm's --time
        ("0.5", 30),
        ("90:00", 5400),  # MM:SS, as Slurm: minutes may exceed 59
        ("1:30", 90),
        ("1:30:00", 5400),  # H:MM:SS
        ("100:00:00", 360000),
        ("2-12", 2 * 86400 + 12 * 3600),  # D-HH
        ("2-12:30", 2 * 86400 + 12 * 3600 + 30 * 60),  # D-HH:MM
        ("2-12:30:15", 2 * 86400 + 12 * 3600 + 30 * 60 + 15),
        ("4h00m", 14400),  # what format_duration writes reads back
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "abc", "4x", "-1h", "1h-", "30m1h", "1h1h", "1:75:00", "1:30:75", "90:60", "2-24", "1 30", "h", "1e5", "+2h"],
)
def test_unreadable_durations_are_refused_with_the_accepted_forms(text):
    with pytest.raises(ValueError) as caught:
        parse_duration(text)
    message = str(caught.value)
    assert message.startswith("--time: cannot read")
    assert "1h30m" in message and "1:30:00" in message and "\n" not in message


@pytest.mark.parametrize("text", ["0", "0s", "0:00", "0h0m", "0-0"])
def test_zero_is_refused(text):
    with pytest.raises(ValueError, match=r"^--time: .* is not a positive duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["366d", "9000h", "9" * 400, "99999999:00"])
def test_absurd_lengths_are_refused(text):
    with pytest.raises(ValueError, match="longer than 365 days"):
        parse_duration(text)


def test_the_flag_named_in_messages_is_the_callers():
    with pytest.raises(ValueError, match=r"^--default-time: "):
        parse_duration("soon", flag="--default-time")


@pytest.mark.parametrize(
    "seconds,text",
    [(0, "0s"), (0.9, "0s"), (45, "45s"), (90, "1m30s"), (3599, "59m59s"), (14400, "4h00m"), (5400, "1h30m")]
    + [(86400 + 3 * 3600 + 59, "1d03h"), (-90, "-1m30s")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@given(st.floats(min_value=1, max_value=365 * 86400, allow_nan=False))
def test_format_duration_reads_back_never_longer_and_within_its_smallest_unit(seconds):
    shown = format_duration(seconds)
    back = parse_duration(shown)
    unit = 1 if seconds < 3600 else 60 if seconds < 86400 else 3600
    assert back <= seconds < back + unit


# -- parse_begin --


def local(*fields: int) -> float:
    return datetime(*fields).timestamp()  # naive: this process's local time, as parse_begin reads it


NOW = local(2026, 12, 3, 1, 15, 0)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("now", NOW),
        ("NOW", NOW),
        ("+2h", NOW + 7200),
        ("+90m", NOW + 5400),
        ("+1h30m", NOW + 5400),
        ("now+45s", NOW + 45),
        ("+1:30:00", NOW + 5400),
        ("02:00", local(2026, 12, 3, 2, 0)),  # later today
        ("2:00", local(2026, 12, 3, 2, 0)),
        ("14:30:15", local(2026, 12, 3, 14, 30, 15)),
        ("01:15", NOW),  # this very second: today, at once
        ("01:14", local(2026, 12, 4, 1, 14)),  # already past today: tomorrow
        ("00:00", local(2026, 12, 4, 0, 0)),
        ("2026-12-05T02:00", local(2026, 12, 5, 2, 0)),
        ("2026-12-05 02:00", local(2026, 12, 5, 2, 0)),
        ("2026-12-05T02:00:30", local(2026, 12, 5, 2, 0, 30)),
        ("2026-12-05", local(2026, 12, 5)),
        ("2026-12-05T02:00Z", datetime(2026, 12, 5, 2, 0, tzinfo=timezone.utc).timestamp()),
        ("2026-12-05T02:00+01:00", datetime(2026, 12, 5, 1, 0, tzinfo=timezone.utc).timestamp()),
        ("2026-12-05T02:00-0530", datetime(2026, 12, 5, 7, 30, tzinfo=timezone.utc).timestamp()),
    ],
)
def test_begin_forms(text, expected):
    assert parse_begin(text, NOW) == pytest.approx(expected, abs=1e-6)


def test_a_clock_time_just_past_is_tomorrow_not_now():
    now = local(2026, 12, 3, 2, 0, 1)
    assert parse_begin("02:00", now) == local(2026, 12, 4, 2, 0)


def test_a_past_iso_time_is_returned_as_is_so_the_job_starts_at_once():
    when = parse_begin("2026-12-01T08:00", NOW)
    assert when == local(2026, 12, 1, 8, 0) and when < NOW


def test_the_clock_time_is_read_in_the_local_time_zone():
    """A real process with TZ set: 02:00 in New York is 07:00 UTC in December (EST, UTC-5)."""
    now = datetime(2026, 12, 3, 6, 0, tzinfo=timezone.utc).timestamp()  # 01:00 in New York
    script = (
        "import json, sys, time; from gpuq.core.timespec import parse_begin; "
        f"print(json.dumps([time.tzname, parse_begin('02:00', {now}), parse_begin('2026-12-05T02:00', {now})]))"
    )
    env = {"TZ": "America/New_York", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    tznames, clock, iso = json.loads(out.stdout)
    if tznames[0] != "EST":
        pytest.skip(f"no time zone data for America/New_York here (tzname {tznames})")
    assert clock == now + 3600
    assert iso == datetime(2026, 12, 5, 7, 0, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize(
    "text,message",
    [
        ("+90", r"needs a unit \(\+90m or \+90s\?\)"),
        ("+soon", "cannot read"),
        ("+0m", "cannot read"),
        ("tomorrow", "cannot read"),
        ("25:00", "cannot read"),
        ("12:60", "cannot read"),
        ("2026-13-01T02:00", "not a valid date and time"),
        ("2026-02-30", "not a valid date and time"),
        ("2026-12-05T02:00+25:00", "not a valid date and time"),
        ("", "cannot read"),
    ],
)
def test_unreadable_begin_times_are_refused(text, message):
    with pytest.raises(ValueError, match=message) as caught:
        parse_begin(text, NOW)
    assert str(caught.value).startswith("--begin: ")
    assert "+2h" in str(caught.value) and "\n" not in str(caught.value)


def test_relative_begin_is_relative_to_the_given_now_not_the_clock():
    long_ago = local(2001, 1, 1, 12, 0)
    assert parse_begin("+2h", long_ago) == long_ago + 7200
    assert parse_begin("13:00", long_ago) - long_ago == timedelta(hours=1).total_seconds()


# -- sizes --


@pytest.mark.parametrize(
    "text,mib",
    [
        ("20G", 20480),
        ("20GB", 20480),
        ("20GiB", 20480),
        ("20g", 20480),
        ("20 GiB", 20480),
        ("1.5G", 1536),
        ("512M", 512),
        ("512MiB", 512),
        ("81559", 81559),  # a bare number is MiB, as nvidia-smi prints
        ("1T", 1048576),
        ("0.1G", 103),  # 102.4 rounds up: a requirement is never understated
    ],
)
def test_size_mib(text, mib):
    assert parse_size_mib(text) == mib


@pytest.mark.parametrize("text", ["", "G", "20X", "20B", "20iB", "twenty", "1e3G"])
def test_unreadable_mib_sizes_are_refused(text):
    with pytest.raises(ValueError, match=r"^--mem: cannot read .* as a size; use 20G"):
        parse_size_mib(text, flag="--mem")


@pytest.mark.parametrize(
    "text,message", [("0", "not a positive size"), ("0G", "not a positive"), ("64K", "below"), ("-1G", "is negative")]
)
def test_zero_and_kib_mib_sizes_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_size_mib(text)


@pytest.mark.parametrize(
    "text,count",
    [("1G", 2**30), ("500M", 500 * 2**20), ("64K", 65536), ("64KB", 65536), ("2GiB", 2 * 2**30)]
    + [("1.5k", 1536), ("4096", 4096), ("20B", 20), ("1T", 2**40)],
)
def test_size_bytes(text, count):
    assert parse_size_bytes(text) == count


@pytest.mark.parametrize("text", ["", "1X", "lots", "1.2.3M", "0", "0K"])
def test_unreadable_or_zero_byte_sizes_are_refused(text):
    with pytest.raises(ValueError, match=r"^--log-cap: "):
        parse_size_bytes(text, flag="--log-cap")
