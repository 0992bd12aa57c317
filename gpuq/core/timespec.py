"""Durations, start times, sizes and job id ranges as people type them on a command line, read into numbers; errors
are one-line ValueErrors naming the option and the forms it takes. Durations follow Slurm's `--time`,
since many who share a workstation also use a cluster."""

from __future__ import annotations

import math
import re
from datetime import date, datetime, time, timedelta, timezone
from typing import Optional

from gpuq.core.times import duration

MAX_DURATION = 365 * 86400.0

_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_NUMBER = r"\d+(?:\.\d*)?|\.\d+"
# Patterns as text, compiled by `re` at first use (start-up: see core/sweep.py).
_UNIT_PART = rf"({_NUMBER})\s*([dhms])"
_UNITS_WHOLE = rf"(?:(?:{_NUMBER})\s*[dhms]\s*)+"  # `1h 30m`, when quoted
_BARE = rf"(?:{_NUMBER})"
_COLONS = r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?"

DURATION_FORMS = "45s, 90m, 4h, 2d, 1h30m, 90 (minutes), 90:00 (mm:ss), 1:30:00 (h:mm:ss) or 2-12:00:00 (d-hh:mm:ss)"


def parse_duration(text: str, flag: str = "--time") -> float:
    """Seconds in a duration such as `4h`, `90m`, `1h30m`, `1:30:00` or `90` (minutes, as Slurm)."""
    try:
        seconds = _duration_or_none(text.strip().lower())
    except OverflowError:  # more digits than a float holds
        seconds = math.inf
    if seconds is None:
        raise ValueError(f"{flag}: cannot read {text!r} as a duration; use {DURATION_FORMS}")
    if not math.isfinite(seconds) or seconds > MAX_DURATION:  # a typo rather than a plan
        raise ValueError(f"{flag}: {text!r} is longer than 365 days")
    if seconds <= 0:
        raise ValueError(f"{flag}: {text!r} is not a positive duration (leave {flag} out for no limit)")
    return seconds


def _duration_or_none(text: str) -> Optional[float]:
    if re.fullmatch(_BARE, text):
        return float(text) * 60.0  # Slurm: a bare number is minutes
    if re.fullmatch(_UNITS_WHOLE, text):
        return _units_seconds(text)
    match = re.fullmatch(_COLONS, text)
    if match and (match.group(1) is not None or match.group(3) is not None):
        return _colon_seconds(*match.groups())
    return None


def _units_seconds(text: str) -> Optional[float]:
    parts = re.findall(_UNIT_PART, text)
    units = [unit for _, unit in parts]
    # Largest unit first, each at most once: `30m1h` or `1h1h` is more likely a slip than a plan.
    if units != sorted(set(units), key="dhms".index):
        return None
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def _colon_seconds(days: Optional[str], first: str, second: Optional[str], third: Optional[str]) -> Optional[float]:
    numbers = [int(n) for n in (first, second, third) if n is not None]
    if days is None and len(numbers) == 2:  # MM:SS (Slurm); the minutes may exceed 59
        numbers = [numbers[0] // 60, numbers[0] % 60, numbers[1]]
    numbers += [0] * (3 - len(numbers))  # D-HH[:MM[:SS]]: the hours are bounded like a clock's
    if numbers[1] > 59 or numbers[2] > 59 or (days is not None and numbers[0] > 23):
        return None
    return int(days or 0) * 86400.0 + numbers[0] * 3600.0 + numbers[1] * 60.0 + numbers[2]


def format_duration(seconds: float) -> str:
    """`45s`, `1m30s`, `4h00m`, `2d03h`: two units at most, the smaller rounded down (a limit never
    reads longer than it is); `parse_duration` reads it back."""
    sign = "-" if seconds < 0 else ""
    days, rest = divmod(int(abs(seconds)), 86400)
    return f"{sign}{days}d{rest // 3600:02d}h" if days else sign + duration(rest)  # duration: within a day


# -- start times (--begin) --

BEGIN_FORMS = "02:00 (the next 2 am), +2h, +1h30m, 2026-12-03T02:00 (local unless an offset is given) or now"
_CLOCK = r"(\d{1,2}):(\d{2})(?::(\d{2}))?"
_ISO = (
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[T ](\d{1,2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?)?"
    r"\s*(Z|[+-]\d{2}(?::?\d{2})?)?"
)


def parse_begin(text: str, now: float, flag: str = "--begin") -> float:
    """Epoch seconds at which a job may start: `now`; `+2h` or `now+1h30m` (a bare `+90` is refused:
    Slurm reads it as minutes for `--time` but seconds for `--begin`); `02:00`, the next time the
    local clock shows it; a date-time, local without an offset. A time past is returned as it is."""
    cleaned = text.strip()
    lowered = cleaned.lower()
    if lowered == "now":
        return now
    if lowered.startswith(("+", "now+")):
        return now + _relative(cleaned[cleaned.index("+") + 1 :], text, flag)
    when = _clock_time(cleaned, now)
    if when is None:
        when = _iso_time(cleaned, text, flag)
    if when is None:
        raise ValueError(f"{flag}: cannot read {text!r} as a start time; use {BEGIN_FORMS}")
    return when


def _relative(offset: str, text: str, flag: str) -> float:
    number = offset.strip()
    if re.fullmatch(_BARE, number):
        raise ValueError(f"{flag}: {text!r} needs a unit (+{number}m or +{number}s?); use {BEGIN_FORMS}")
    try:
        return parse_duration(offset, flag)
    except ValueError:
        raise ValueError(f"{flag}: cannot read {text!r} as a start time; use {BEGIN_FORMS}") from None


def _clock_time(text: str, now: float) -> Optional[float]:
    match = re.fullmatch(_CLOCK, text)
    if not match:
        return None
    hour, minute, second = int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)
    if hour > 23 or minute > 59 or second > 59:
        return None
    wanted = time(hour, minute, second)
    today = datetime.fromtimestamp(now).date()
    when = datetime.combine(today, wanted).timestamp()  # naive: local time, via mktime
    if when < math.floor(now):
        when = datetime.combine(today + timedelta(days=1), wanted).timestamp()
    return when


def _iso_time(text: str, original: str, flag: str) -> Optional[float]:
    match = re.fullmatch(_ISO, text)
    if not match:
        return None
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    try:
        day_part = date(int(year), int(month), int(day))
        clock = time(int(hour or 0), int(minute or 0), int(second or 0), int((fraction or "0").ljust(6, "0")))
        zone = _zone(offset)
        return datetime.combine(day_part, clock, tzinfo=zone).timestamp()
    except (ValueError, OverflowError, OSError):  # month 13, hour 25, or a year mktime cannot place
        raise ValueError(f"{flag}: {original!r} is not a valid date and time; use {BEGIN_FORMS}") from None


def _zone(offset: Optional[str]) -> Optional[timezone]:
    if offset is None:
        return None  # naive: local time
    if offset == "Z":
        return timezone.utc
    digits = offset[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:] or 0)
    if hours > 23 or minutes > 59:
        raise ValueError("offset out of range")
    delta = timedelta(hours=hours, minutes=minutes)
    return timezone(-delta if offset[0] == "-" else delta)


# -- sizes --

_SIZE = rf"({_NUMBER})\s*([kmgt]?)(i?b?)"
_SIZE_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}


def parse_size_mib(text: str, flag: str = "size") -> int:
    """MiB in a GPU memory size: `20G`, `20GiB`, `1.5G`, `512M`, `1T`, or a bare number of MiB (as
    nvidia-smi reports it). Units are binary (G is GiB, as GPU memory is quoted); a fraction of a
    MiB rounds up, so a requirement is never understated."""
    return _size_mib(text, flag, "20G, 20GiB, 1.5G, 512M or 81559 (MiB)")[0]


def parse_memory_mib(text: str, flag: str = "size") -> int:
    """MiB in a size typed on the command line (`--gpu-mem`, `--mem`): as parse_size_mib, but a bare
    number is refused (`--gpu-mem 20` meant 20G, not 20 MiB); a job file's bare numbers stay MiB."""
    mib, unit = _size_mib(text, flag, "20G, 20GiB, 1.5G or 512M")
    if unit == "":
        shown = text.strip()
        raise ValueError(f"{flag}: {shown!r} has no unit: did you mean {shown}G? (write {shown}M for MiB)")
    return mib


def _size_mib(text: str, flag: str, forms: str) -> tuple[int, str]:
    """MiB in a size, and its unit's letter ('' for a bare number)."""
    number, unit = _size_parts(text, flag, forms)
    if unit == "" and text.strip()[-1:].isalpha():  # `20B`: bytes, not MiB
        raise ValueError(f"{flag}: cannot read {text!r} as a size; use {forms}")
    if unit == "k":
        raise ValueError(f"{flag}: {text!r} is below a MiB; use {forms}")
    mib = math.ceil(number * 2 ** (_SIZE_SHIFT[unit or "m"] - 20))
    return _positive(mib, text, flag), unit


def parse_size_bytes(text: str, flag: str = "size") -> int:
    """Bytes in a size such as a log cap: `1G`, `500M`, `64K`, `2GiB`, or a bare number of bytes
    (binary units; a fraction rounds up)."""
    number, unit = _size_parts(text, flag, "1G, 500M, 64K or 4096 (bytes)")
    return _positive(math.ceil(number * 2 ** _SIZE_SHIFT[unit]), text, flag)


def parse_typed_bytes(text: str, flag: str = "size") -> int:
    """Bytes in a size typed on the command line (`--min-free`, `--max-log-size`): as
    parse_size_bytes, but a bare number is refused as parse_memory_mib refuses it (`4096B` is bytes)."""
    shown = text.strip()
    # -5G and 0G are refused too: a unit to add would not help
    if shown.startswith("-") or (shown[-1:].isdigit() and _size_parts(text, flag, "1G, 500M or 64K")[0] == 0):
        raise ValueError(f"{flag}: {shown!r} is not a positive size")
    if shown[-1:].isdigit():
        raise ValueError(f"{flag}: {shown!r} has no unit: did you mean {shown}G? (write {shown}B for bytes)")
    return parse_size_bytes(text, flag)


def _size_parts(text: str, flag: str, forms: str) -> tuple[float, str]:
    if text.strip().startswith("-"):
        raise ValueError(f"{flag}: {text!r} is negative; use {forms}")
    match = re.fullmatch(_SIZE, text.strip().lower())
    # `20i` or `20ib` alone is not a unit; `20b` is bytes, which only parse_size_bytes takes as is.
    if not match or (match.group(3).startswith("i") and not match.group(2)):
        raise ValueError(f"{flag}: cannot read {text!r} as a size; use {forms}")
    number = float(match.group(1))
    if not math.isfinite(number):
        raise ValueError(f"{flag}: cannot read {text!r} as a size; use {forms}")
    return number, match.group(2)


def _positive(value: int, text: str, flag: str) -> int:
    if value <= 0:
        raise ValueError(f"{flag}: {text!r} is not a positive size")
    return value


# -- job id ranges (--after 12-17, `gpuq cancel 3,5 9-11`): here, not in sweep.py, so that the command
# line's converters do not import the sweeps (and their named tuple) into every command --

MAX_ID_SPAN = 100_000
_ID = r"#?\s*(\d+)"
_RANGE = rf"{_ID}(?:\s*-\s*{_ID})?"


def parse_id_ranges(text: str, flag: str = "") -> list[int]:
    """`12-17`, `3,5,9-11`, `#12-#17` -> job ids in the order given, each once. `flag` starts each
    error message (argparse names the option itself)."""
    said = f"{flag}: " if flag else ""
    ids: dict[int, None] = {}
    items = [item.strip() for item in text.split(",") if item.strip()]  # stray commas: as --after 3,5, was
    if not items:
        raise ValueError(f"{said}no job id in {text!r}; use 12, 3,5 or 12-17")
    for item in items:
        match = re.fullmatch(_RANGE, item)
        if not match:
            raise ValueError(f"{said}cannot read {item!r} as a job id or range; use 12, 3,5 or 12-17")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if first <= 0:
            raise ValueError(f"{said}job ids start at 1, got {item!r}")
        if last < first:
            raise ValueError(f"{said}{item!r} runs backwards; write {last}-{first}")
        if last - first + 1 + len(ids) > MAX_ID_SPAN:
            raise ValueError(f"{said}{text!r} names more than {MAX_ID_SPAN:,} jobs")
        ids.update(dict.fromkeys(range(first, last + 1)))
    return list(ids)
