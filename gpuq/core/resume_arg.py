"""How a checkpoint is handed to a job's command: its resume form (`--resume_from_checkpoint {ckpt}`
by default, `--resume-arg` for other frameworks), put in place of any earlier one."""

from __future__ import annotations

import shlex
from typing import Optional

DEFAULT_RESUME_ARG = "--resume_from_checkpoint {ckpt}"


def check_resume_arg(template: str) -> Optional[str]:
    """The problem with a --resume-arg template, or None if it is usable."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        return f"--resume-arg cannot be split like a shell line: {exc}"
    if not words or "{ckpt}" not in template:
        return "--resume-arg must contain {ckpt}, e.g. '--resume_from_checkpoint {ckpt}' or 'ckpt_path={ckpt}'"
    if len(words) > 2 or "{ckpt}" in words[0] and len(words) == 2:
        return "--resume-arg must be one word (NAME={ckpt}) or a flag and its value (--flag {ckpt})"
    return None


def resume_argv(cmd: list[str], template: Optional[str], ckpt: Optional[str]) -> list[str]:
    """`cmd` without any earlier form of the resume argument (`--flag X`, `--flag=X`), plus the
    template filled with `ckpt` (nothing added when `ckpt` is None)."""
    words = shlex.split(template or DEFAULT_RESUME_ARG)
    key = words[0].split("=", 1)[0] if len(words) == 1 else words[0]
    out, i = [cmd[0]], 1
    while i < len(cmd):
        if cmd[i] == key:
            i += 2  # `--flag X`
            continue
        if not cmd[i].startswith(key + "="):
            out.append(cmd[i])
        i += 1
    return out + ([w.replace("{ckpt}", ckpt) for w in words] if ckpt is not None else [])
