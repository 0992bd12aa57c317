"""The request of `gpuq add` (enqueue.py turns it into jobs)."""

from typing import Literal, Mapping, NamedTuple, Optional, Sequence, Union


class Request(NamedTuple):
    """`cmd` and each of add's options by its dest in cli/options.py (`umask`, `shell_env`: default
    this process's). A NamedTuple, so that `gpuq add` does not import `dataclasses`; apart, without
    the future import, because NamedTuple compiles string annotations (bench/PROFILE.md, section 12)."""

    cmd: Sequence[str]
    dir: Optional[str] = None
    python: Optional[str] = None
    conda: Optional[str] = None
    name: Optional[str] = None
    after: Sequence[int] = ()
    after_any: Sequence[int] = ()
    retries: int = 0
    retry_oom: int = 0
    sweep: Sequence[str] = ()
    yes: bool = False
    hold: bool = False
    time: Optional[str] = None
    begin: Optional[str] = None
    snapshot: bool = False
    gpus: int = 1
    notify: bool = False
    notify_url: Sequence[str] = ()
    max_log_size: Optional[str] = None
    on_finish: Optional[str] = None
    gpu_mem: Optional[str] = None
    mem: Optional[str] = None
    cpus: Optional[int] = None
    priority: int = 0
    urgent: Union[bool, Literal["force"]] = False
    preemptible: bool = False
    ckpt_glob: Optional[str] = None
    no_resume: bool = False
    keep_checkpoints: Optional[Union[int, str]] = None
    min_free: Optional[str] = None
    resume_arg: Optional[str] = None
    env: Optional[Mapping[str, str]] = None
    umask: Optional[int] = None
    shell_env: Optional[Mapping[str, str]] = None
