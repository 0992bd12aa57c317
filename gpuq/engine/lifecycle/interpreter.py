"""Which interpreter and environment a queued command runs with: `--python`, `--conda NAME`, the
nearest `.venv` above the job's directory, the active conda environment (unless it is the base
one), the python on PATH, in this order.
"""

# Real annotations, no future import: see test_the_everyday_commands_compile_no_source.
import errno
import os
import shlex
from typing import Iterator, Mapping, NamedTuple, Optional, Union

from gpuq.core.errors import Refused, UsageError
from gpuq.system import procs

StrPath = Union[str, os.PathLike[str]]  # a directory, as a string or a Path

# How the interpreter was chosen: the job's `interpreter_from` (spool_layout.md).
FROM_PYTHON, FROM_CONDA, FROM_VENV, FROM_ACTIVE_CONDA, FROM_PATH = "--python", "--conda", ".venv", "conda env", "PATH"
UV_TOOLS = ("uv", "uvx")  # commands that make a uv project's .venv themselves
MAX_PYPROJECT_BYTES = 1 << 20


class EnqueueError(UsageError):
    """What was asked for cannot become a job (no such script, directory, interpreter)."""


class Resolved(NamedTuple):
    """A command as it will run, its environment (a `.venv` or a conda prefix, at most one)."""

    cmd: list[str]
    venv: Optional[str]
    conda: Optional[str]
    found_by: Optional[str]  # None: a command run as written, nothing found for it


def upward(start: StrPath) -> Iterator[str]:
    directory = os.path.abspath(start)
    while True:
        yield directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return
        directory = parent


def exists(path: str) -> bool:
    """False for a missing path, OSError for one that cannot be looked at (no permission), which
    intake reports as the file's problem."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP, errno.ENAMETOOLONG):
            return False
        raise
    return True


def refuse_too_long(what: str, path: str) -> None:
    """EnqueueError if `path` is too long to look at (os.path.isfile and isdir say it is missing)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise EnqueueError(f"{what}: path too long: {path}") from None


def find_venv(start: StrPath) -> Optional[str]:
    for directory in upward(start):
        candidate = os.path.join(directory, ".venv")
        if exists(os.path.join(candidate, "bin", "python")):
            return candidate
    return None


def resolve_command(
    script: str,
    args: list[str],
    cwd: StrPath,
    python: Optional[str] = None,
    conda: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Resolved:
    """SCRIPT ARGS as they will run in `cwd` for a user whose environment is `env`. Anything but a
    *.py SCRIPT is a command, found on PATH with its environment's bin/ first."""
    env = os.environ if env is None else env
    is_py = script.endswith(".py")
    path = os.path.join(cwd, script)
    if any(c.isspace() for c in script) and script.strip() and not exists(path):
        raise EnqueueError(quoted_whole(script, args))
    if is_py and not os.path.isfile(path):
        refuse_too_long("script", path)
        raise EnqueueError(f"script not found: {path}")
    venv, conda, found_by = find_environment(cwd, conda, env, need_python=is_py)
    home = venv or conda
    search = f"{home}/bin{os.pathsep}" if home else ""
    search += env.get("PATH", "")
    if not is_py:
        if "/" in script:
            if not exists(path):
                refuse_too_long("script", path)
                raise EnqueueError(f"script not found: {path}")
            if os.path.isdir(path):
                raise EnqueueError(f"a directory, not a program: {path}")
            if not os.access(path, os.X_OK):  # it would only fail to start (exit 126)
                raise EnqueueError(f"not executable: {path} (`chmod +x {script}`, or queue `bash {script}`)")
        elif procs.which(script, path=search) is None:
            raise EnqueueError(f"command not found: {script}")
        return Resolved([script, *args], venv, conda, found_by)
    if python:
        interpreter = python if "/" not in python else os.path.abspath(python)
        if procs.which(interpreter, path=search) is None:
            raise EnqueueError(f"python not found: {python}")
        return Resolved([interpreter, script, *args], venv, conda, FROM_PYTHON)
    if home:
        interpreter = os.path.join(home, "bin", "python")
        if not exists(interpreter):  # only --conda gets here: the others were found by their python
            raise EnqueueError(f"--conda: no bin/python in {home}: install python there, or give --python")
        return Resolved([interpreter, script, *args], venv, conda, found_by)
    interpreter = procs.which("python3", path=search) or procs.which("python", path=search) or ""
    if not interpreter:
        raise EnqueueError("no python found on PATH; give one with --python")
    base = env.get("CONDA_PREFIX")  # an active base environment is used when nothing else was found
    if base and os.path.dirname(interpreter) == os.path.join(base, "bin") and is_base(base, env):
        return Resolved([interpreter, script, *args], None, base, FROM_ACTIVE_CONDA)
    return Resolved([interpreter, script, *args], None, None, FROM_PATH)


def find_environment(
    cwd: StrPath, conda: Optional[str], env: Mapping[str, str], need_python: bool = True
) -> tuple[Optional[str], Optional[str], Optional[str]]:
    """The `.venv` and conda prefix a command in `cwd` runs with (at most one), and how they were
    found (None: neither; FROM_PATH is only for a python gpuq puts in front of a script)."""
    venv = None if conda else find_venv(cwd)
    if conda or venv:
        return venv, conda, FROM_CONDA if conda else FROM_VENV
    conda = active_conda(env, need_python=need_python)
    return None, conda, FROM_ACTIVE_CONDA if conda else None


def resolve_dropped(
    cmd: list[str], cwd: str, conda: Optional[str], env: Mapping[str, str], python: Optional[str] = None
) -> Resolved:
    """A command from a dropped file or `gpuq edit` as `gpuq add` would run it with `env`: a *.py
    first word gets its interpreter; any other command runs as written (not refused if it is not
    on PATH: it fails as it runs)."""
    if not cmd[0].endswith(".py"):
        return Resolved(list(cmd), *find_environment(cwd, conda, env, need_python=False))
    if conda and not python and not exists(os.path.join(conda, "bin", "python")):
        raise EnqueueError(f"conda: no bin/python in {conda} to run {cmd[0]} with")
    return resolve_command(cmd[0], cmd[1:], cwd, python, conda, env)


def interpreter_in_front(cmd: list[str], found_by: Optional[str], home: Optional[str]) -> Optional[str]:
    """The interpreter gpuq put in front of a job's *.py script (its `--python`, `home`'s
    `bin/python`, or a python found on PATH, as an older job's may be); None for one the user
    wrote (`/usr/bin/python3 train.py`)."""
    if len(cmd) < 2 or not cmd[1].endswith(".py") or found_by is None:
        return None
    if found_by == FROM_PYTHON or (found_by == FROM_PATH and os.path.isabs(cmd[0])):
        return cmd[0]
    return cmd[0] if home is not None and cmd[0] == os.path.join(home, "bin", "python") else None


def is_conda_prefix(path: str) -> bool:
    # conda, mamba and micromamba all keep `conda-meta/` in an environment
    return os.path.isdir(os.path.join(path, "conda-meta"))


def active_conda(env: Mapping[str, str], need_python: bool = True) -> Optional[str]:
    """`CONDA_PREFIX`, unless it is the base one (which `conda init` activates in every shell)."""
    prefix = env.get("CONDA_PREFIX")
    if not prefix or not os.path.isabs(prefix) or not is_conda_prefix(prefix) or is_base(prefix, env):
        return None
    if need_python and not exists(os.path.join(prefix, "bin", "python")):
        return None
    return prefix


def conda_roots(env: Mapping[str, str]) -> list[str]:
    """Where conda (CONDA_EXE is ROOT/bin/conda) and micromamba are installed: their base environments."""
    roots = []
    if env.get("CONDA_EXE"):  # a relative one ("conda") gives "": the current directory, as before
        roots.append(os.path.dirname(os.path.dirname(env["CONDA_EXE"])))
    if env.get("MAMBA_ROOT_PREFIX"):
        roots.append(env["MAMBA_ROOT_PREFIX"])
    return [os.path.abspath(root) for root in roots]


def is_base(prefix: str, env: Mapping[str, str]) -> bool:
    if env.get("CONDA_DEFAULT_ENV") == "base" and env.get("CONDA_PREFIX") == prefix:
        return True
    return any(os.path.realpath(root) == os.path.realpath(prefix) for root in conda_roots(env))


def quoted_whole(script: str, args: list[str]) -> str:
    """Why `gpuq add 'python train.py --steps 2'` is refused, and what to write instead. Refused
    rather than split: a split guesses at quoting inside it, and a shell line needs a shell."""
    try:
        words = shlex.split(script)
    except ValueError:  # an unclosed quote: its words as they stand
        words = script.split()
    if any(word in SHELL_WORDS or any(c in word for c in "|<>;$`") for word in words):
        fix = shlex.join(["gpuq", "add", "bash", "-c", script, *args])
        how = "it is a shell line: give it to a shell"
    else:
        fix = shlex.join(["gpuq", "add", *words, *args])
        how = "write its words apart, not quoted as one"
    return f"no file or command is named {script!r}, one word with spaces: {how}: {fix}"


SHELL_WORDS = ("&&", "||", "&", "|", ";", ">", ">>", "<", "2>&1")


def find_conda(name: str, env: Mapping[str, str]) -> str:
    """The prefix `--conda NAME` names: a path, "base", or a name in an envs dir or in
    ~/.conda/environments.txt (`conda env list` would say the same in about a second)."""
    if "/" in name or name in (".", ".."):
        path = os.path.abspath(os.path.expanduser(name))
        if not is_conda_prefix(path):
            raise Refused(f"--conda: not a conda environment (no conda-meta/ in it): {path}")
        return path
    if name == "base":
        roots = [r for r in conda_roots(env) if is_conda_prefix(r)]
        active = env.get("CONDA_PREFIX")
        if active and is_base(active, env) and is_conda_prefix(active):
            roots.insert(0, active)
        if roots:
            return roots[0]
        raise Refused("--conda base: no conda installation found (CONDA_EXE and MAMBA_ROOT_PREFIX are unset)")
    dirs = [
        d for variable in ("CONDA_ENVS_DIRS", "CONDA_ENVS_PATH") for d in env.get(variable, "").split(os.pathsep) if d
    ]
    active = env.get("CONDA_PREFIX")  # conda's order: the variables, the active one's, the roots', ~/.conda's
    if active:
        parent = os.path.dirname(os.path.normpath(active))
        dirs.append(os.path.join(active, "envs") if is_base(active, env) else parent)
    dirs += [os.path.join(root, "envs") for root in conda_roots(env)]
    if env.get("HOME"):
        dirs.append(os.path.join(env["HOME"], ".conda", "envs"))
    dirs = list(dict.fromkeys(os.path.abspath(os.path.expanduser(d)) for d in dirs))
    for directory in dirs:
        candidate = os.path.join(directory, name)
        if is_conda_prefix(candidate):
            return candidate
    for prefix in _listed_environments(env):
        if os.path.basename(prefix) == name and is_conda_prefix(prefix):
            return prefix
    looked = ", ".join(dirs) or "no envs directory: CONDA_EXE, MAMBA_ROOT_PREFIX and HOME are unset"
    raise Refused(f"--conda: no conda environment named {name!r} (looked in {looked}); give its path")


def _listed_environments(env: Mapping[str, str]) -> list[str]:
    if not env.get("HOME"):
        return []
    try:
        with open(os.path.join(env["HOME"], ".conda", "environments.txt"), encoding="utf-8") as fh:
            return [line.strip() for line in fh if line.strip().startswith("/")]
    except (OSError, UnicodeDecodeError):
        return []


def uv_hint(cwd: str, resolved: Resolved) -> str:
    """A line for the user when the job's directory is a uv project whose `.venv` is not made yet."""
    if resolved.venv or resolved.found_by in (FROM_PYTHON, FROM_CONDA) or resolved.cmd[0] in UV_TOOLS:
        return ""
    project = uv_project(cwd)
    if project is None:
        return ""
    runs = resolved.cmd[0] if resolved.cmd[0].startswith("/") else f"{resolved.cmd[0]} from PATH"
    return (
        f"gpuq: {project} is a uv project with no .venv yet: this job runs {runs}, which may lack its "
        f"packages (`uv sync` in {project} creates the .venv; jobs added after that use it)"
    )


def uv_project(cwd: str) -> Optional[str]:
    """The directory of the nearest pyproject.toml above `cwd` if uv manages it (not poetry's)."""
    for directory in upward(cwd):
        pyproject = os.path.join(directory, "pyproject.toml")
        if not os.path.isfile(pyproject):
            continue
        if os.path.isfile(os.path.join(directory, "uv.lock")):
            return directory
        try:
            with open(pyproject, "rb") as fh:
                text = fh.read(MAX_PYPROJECT_BYTES).decode("utf-8", "replace")
        except OSError:
            return None
        # a table header, not a TOML parse: tomllib is a module to import for one word
        tables = (line.strip().replace(" ", "") for line in text.splitlines())
        return directory if any(line.startswith(("[tool.uv]", "[tool.uv.", "[[tool.uv.")) for line in tables) else None
    return None
