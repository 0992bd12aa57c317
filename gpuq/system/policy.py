"""The machine's sharing policy (lease_layout.md section 9, with the file's form): caps and turn
weights an admin sets for every user's gpuq in one root-owned file. A file anyone but root could have
written is no admin's word: it is ignored, said once in one line, and gpuq decides as without one."""

from __future__ import annotations

import math
import os
import stat
import sys
from typing import Any, Callable, NamedTuple, Optional

from gpuq.system.leases import HALF_LIFE_SECONDS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9 and 3.10: the tomli dependency
    import tomli as tomllib
from gpuq.system.security import display

POLICY_ENV = "GPUQ_POLICY"
DEFAULT_PATH = "/etc/gpuq/policy.toml"
MAX_POLICY_BYTES = 1 << 20


class Limits(NamedTuple):
    max_gpus: Optional[int] = None  # None: no cap
    weight: float = 1.0


class Policy(NamedTuple):
    default: Limits = Limits()
    users: dict[str, Limits] = {}
    half_life: float = HALF_LIFE_SECONDS  # seconds

    def of(self, user: Optional[str]) -> Limits:
        return self.users.get(user, self.default) if user is not None else self.default


NONE = Policy()
# path -> (its stat key, the policy). The key holds the owner and mode, which the trust check reads:
# a `chmod 666` or `chown` changes neither mtime nor size, and the policy must stop counting at once.
_kept: dict[str, tuple[tuple[int, ...], Policy]] = {}


def load(say: Callable[[str], None]) -> Policy:
    """The policy in force: the file's, read again only when it changed; NONE without a sound one
    (`say` is told why, and a caller says each line once)."""
    where = os.environ.get(POLICY_ENV) or DEFAULT_PATH
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return NONE
    except OSError as exc:
        say(f"policy file {display(where)} cannot be opened ({exc.strerror}): ignored, no caps or weights apply")
        return NONE
    try:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode, st.st_uid)
        if where in _kept and _kept[where][0] == key:
            return _kept[where][1]
        problem = _untrusted(st)
        if problem:
            say(f"policy file {display(where)} {problem}: ignored, no caps or weights apply")
            return NONE
        data = os.read(fd, MAX_POLICY_BYTES)
    finally:
        os.close(fd)
    try:
        policy = parse(data)
    except ValueError as exc:
        say(f"policy file {display(where)}: {exc}: ignored, no caps or weights apply")
        return NONE
    _kept[where] = (key, policy)
    return policy


def _untrusted(st: os.stat_result) -> Optional[str]:
    """Why a policy file is not the admin's: not a regular file, not root's, or writable by others."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != 0:
        return f"is owned by uid {st.st_uid}, not root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by others than root (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def parse(data: bytes) -> Policy:
    """The policy a TOML text says; ValueError naming the first thing wrong."""
    try:
        table = tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"not TOML ({exc})") from None
    unknown = set(table) - {"half_life_days", "default", "users"}
    if unknown:
        raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
    days = table.get("half_life_days", HALF_LIFE_SECONDS / 86400)
    if not _positive(days):
        raise ValueError("half_life_days must be a finite number of days above 0")
    default = _limits(table.get("default", {}), "default", Limits())
    users = table.get("users", {})
    if not isinstance(users, dict):
        raise ValueError("users must be a table of tables ([users.alice])")
    return Policy(default, {name: _limits(t, f"users.{name}", default) for name, t in users.items()}, days * 86400.0)


def _limits(table: Any, where: str, base: Limits) -> Limits:
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table")
    unknown = set(table) - {"max_gpus", "weight"}
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    cap = table.get("max_gpus", base.max_gpus)
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
        raise ValueError(f"{where}.max_gpus must be a whole number >= 0")
    weight = table.get("weight", base.weight)
    if not _positive(weight):
        raise ValueError(f"{where}.weight must be a finite number above 0")
    return Limits(cap, float(weight))


def _positive(value: Any) -> bool:
    """A number above 0 and finite (TOML also spells nan and inf, which no comparison refuses)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0
