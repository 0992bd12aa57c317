"""gpuq.system.gitinfo against real git repositories made in temporary directories."""

from __future__ import annotations

import ast
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuq.system import gitinfo, gitsnapshot

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git binary")


@pytest.fixture(autouse=True)
def own_git_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of our own: the user's and the system's git config cannot change what we test."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG_GLOBAL"):
        monkeypatch.delenv(name, raising=False)
    return home


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def new_repo(path: Path, commit: bool = True) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    git(path, "config", "user.name", "gpuq test")
    git(path, "config", "user.email", "test@example.invalid")
    git(path, "config", "commit.gpgsign", "false")
    if commit:
        (path / "train.py").write_text("print('v1')\n")
        (path / "src").mkdir()
        (path / "src" / "model.py").write_text("LAYERS = 2\n")
        git(path, "add", ".")
        git(path, "commit", "-q", "-m", "first")
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return new_repo(tmp_path / "repo")


def test_clean_repo(repo: Path) -> None:
    info = gitinfo.provenance(str(repo / "src"))
    assert info == {
        "repo": os.path.realpath(repo),
        "commit": git(repo, "rev-parse", "HEAD"),
        "branch": git(repo, "symbolic-ref", "--short", "HEAD"),
        "dirty": False,
        "diff_hash": None,
    }


def test_dirty_repo_hash_follows_the_change_not_the_staging(repo: Path) -> None:
    (repo / "train.py").write_text("print('v2')\n")
    first = gitinfo.provenance(str(repo))
    assert first is not None and first["dirty"] is True
    size, crc = first["diff_hash"].split("-")
    assert int(size) > 0 and len(crc) == 8 and int(crc, 16) >= 0
    git(repo, "add", "train.py")  # staged or not, the code is the same
    assert gitinfo.provenance(str(repo))["diff_hash"] == first["diff_hash"]
    (repo / "train.py").write_text("print('v3')\n")
    assert gitinfo.provenance(str(repo))["diff_hash"] != first["diff_hash"]
    (repo / "train.py").write_text("print('v2')\n")
    assert gitinfo.provenance(str(repo))["diff_hash"] == first["diff_hash"]


def test_deleting_a_tracked_file_is_dirty(repo: Path) -> None:
    (repo / "src" / "model.py").unlink()
    info = gitinfo.provenance(str(repo))
    assert info["dirty"] is True and info["diff_hash"]


def test_user_diff_config_does_not_change_the_hash(repo: Path, own_git_config: Path) -> None:
    (repo / "train.py").write_text("print('v2')\n")
    before = gitinfo.provenance(str(repo))["diff_hash"]
    (own_git_config / ".gitconfig").write_text(
        "[diff]\n\tnoprefix = true\n\tcontext = 9\n\talgorithm = histogram\n\trelative = true\n"
        "[color]\n\tdiff = always\n"
    )
    assert git(repo, "config", "diff.noprefix") == "true"  # the config is really read
    assert gitinfo.provenance(str(repo))["diff_hash"] == before
    # asked from a subdirectory, with diff.relative: the change outside it still counts, the same
    assert gitinfo.provenance(str(repo / "src"))["diff_hash"] == before


def test_untracked_files_alone_are_not_dirty(repo: Path) -> None:
    (repo / "outputs.log").write_text("epoch 1\n")
    (repo / "new_module.py").write_text("x = 1\n")
    info = gitinfo.provenance(str(repo))
    assert info["dirty"] is False and info["diff_hash"] is None


def test_repo_without_commits(tmp_path: Path) -> None:
    empty = new_repo(tmp_path / "empty", commit=False)
    info = gitinfo.provenance(str(empty))
    assert info["commit"] is None and info["dirty"] is False and info["diff_hash"] is None
    assert info["branch"]  # the unborn branch still has a name
    (empty / "a.py").write_text("print(1)\n")
    git(empty, "add", "a.py")
    staged = gitinfo.provenance(str(empty))
    assert staged["commit"] is None and staged["dirty"] is True
    assert re.fullmatch(r"\d+-[0-9a-f]{8}", staged["diff_hash"])
    (empty / "a.py").write_text("print(2)\n")
    assert gitinfo.provenance(str(empty))["diff_hash"] != staged["diff_hash"]


def test_detached_head(repo: Path) -> None:
    git(repo, "checkout", "-q", "--detach")
    info = gitinfo.provenance(str(repo))
    assert info["branch"] is None and info["commit"] == git(repo, "rev-parse", "HEAD")


def test_not_a_repository(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    inside = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=plain, capture_output=True)
    if inside.returncode == 0:
        pytest.skip("the temporary directory is itself inside a git work tree")
    assert gitinfo.provenance(str(plain)) is None
    assert gitinfo.provenance(str(tmp_path / "does-not-exist")) is None


def test_inside_the_git_directory_is_not_a_work_tree(repo: Path) -> None:
    assert gitinfo.provenance(str(repo / ".git")) is None


def test_git_missing(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    assert gitinfo.provenance(str(repo)) is None


def test_repo_of_another_user_is_refused_quietly(repo: Path, capfd: pytest.CaptureFixture) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the repository to another user")
    for root, dirs, files in os.walk(repo):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(root, name), 65534, 65534)
    os.chown(repo, 65534, 65534)
    refused = subprocess.run(["git", "status"], cwd=repo, capture_output=True, text=True)
    assert refused.returncode != 0 and "dubious ownership" in refused.stderr  # git really refuses
    capfd.readouterr()
    assert gitinfo.provenance(str(repo)) is None
    assert capfd.readouterr() == ("", "")


def test_submodule(tmp_path: Path) -> None:
    lib = new_repo(tmp_path / "lib")
    main = new_repo(tmp_path / "main")
    git(main, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib")
    git(main, "commit", "-q", "-m", "add lib")
    top = gitinfo.provenance(str(main))
    assert top["dirty"] is False
    inner = gitinfo.provenance(str(main / "vendor" / "lib"))
    assert inner["repo"] == os.path.realpath(main / "vendor" / "lib")
    assert inner["commit"] == git(lib, "rev-parse", "HEAD")
    (main / "vendor" / "lib" / "train.py").write_text("print('patched')\n")
    assert gitinfo.provenance(str(main))["dirty"] is True  # the superproject sees its submodule changed
    snap = gitsnapshot.snapshot(str(main), str(tmp_path / "snap"))
    assert (tmp_path / "snap" / "vendor" / "lib" / "train.py").read_text() == "print('patched')\n"
    assert snap["files"] == 5  # .gitmodules, train.py, src/model.py, and the submodule's two files


# -- changed() --


def test_changed_descriptions(repo: Path) -> None:
    queued = gitinfo.provenance(str(repo))
    assert gitinfo.changed(queued, gitinfo.provenance(str(repo))) is None
    git(repo, "checkout", "-q", "-b", "other")  # same commit on another branch: same code
    assert gitinfo.changed(queued, gitinfo.provenance(str(repo))) is None

    (repo / "train.py").write_text("print('v2')\n")
    dirty = gitinfo.provenance(str(repo))
    assert gitinfo.changed(queued, dirty) == "code changed since it was queued: uncommitted changes made since"
    (repo / "train.py").write_text("print('v3')\n")
    assert gitinfo.changed(dirty, gitinfo.provenance(str(repo))) == (
        "code changed since it was queued: uncommitted changes differ"
    )
    (repo / "train.py").write_text("print('v1')\n")
    assert gitinfo.changed(dirty, gitinfo.provenance(str(repo))) == (
        "code changed since it was queued: uncommitted changes discarded"
    )

    (repo / "train.py").write_text("print('v4')\n")
    git(repo, "commit", "-q", "-am", "second")
    now = gitinfo.provenance(str(repo))
    expected = f"code changed since it was queued: commit {queued['commit'][:7]} -> {now['commit'][:7]}"
    assert gitinfo.changed(queued, now) == expected


def test_changed_without_repository() -> None:
    info = {"repo": "/r", "commit": "a" * 40, "branch": "main", "dirty": False, "diff_hash": None}
    assert gitinfo.changed(None, info) is None
    assert gitinfo.changed(info, None) == "cannot tell whether the code changed: no git work tree when the job started"


def test_a_fingerprint_queued_by_0_1_0_is_not_called_a_change(repo: Path) -> None:
    (repo / "train.py").write_text("print('v2')\n")
    now = gitinfo.provenance(str(repo))
    queued = dict(now, diff_hash="ab" * 32)  # the sha256 that gpuq 0.1.0 wrote
    assert gitinfo.changed(queued, now) is None
    assert gitinfo.changed(dict(now, diff_hash="12-0badf00d"), now) == (
        "code changed since it was queued: uncommitted changes differ"
    )


# -- snapshot() --


def tree(root: Path) -> dict[str, str]:
    """Relative path -> content (or `-> target` for links) of every file under root."""
    result = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            result[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            result[rel] = path.read_text()
    return result


def test_snapshot_copies_the_working_tree_of_tracked_files(repo: Path, tmp_path: Path) -> None:
    (repo / "train.py").write_text("print('uncommitted')\n")  # modified, not staged
    (repo / "staged.py").write_text("print('staged')\n")
    git(repo, "add", "staged.py")
    (repo / "src" / "model.py").unlink()  # tracked but deleted: skipped
    (repo / "notes.txt").write_text("untracked\n")  # untracked: not copied
    dest = tmp_path / "spool" / "snapshots" / "000001"
    info = gitsnapshot.snapshot(str(repo), str(dest))
    assert tree(dest) == {"staged.py": "print('staged')\n", "train.py": "print('uncommitted')\n"}
    assert info == {
        "path": str(dest),
        "files": 2,
        "bytes": len("print('staged')\n") + len("print('uncommitted')\n"),
        "commit": git(repo, "rev-parse", "HEAD"),
        "skipped": 1,
        "untracked": 1,
    }
    (repo / "train.py").write_text("print('edited after the snapshot')\n")
    assert (dest / "train.py").read_text() == "print('uncommitted')\n"
    assert [p.name for p in dest.parent.iterdir()] == ["000001"]  # no temporary sibling left


def test_snapshot_keeps_modes_and_symlinks(repo: Path, tmp_path: Path) -> None:
    run = repo / "run.sh"
    run.write_text("#!/bin/sh\necho hi\n")
    run.chmod(0o755)
    os.symlink("src/model.py", repo / "model_link.py")
    os.symlink("/nonexistent/outside", repo / "dangling")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "script and links")
    dest = tmp_path / "snap"
    gitsnapshot.snapshot(str(repo), str(dest))
    assert stat.S_IMODE(os.lstat(dest / "run.sh").st_mode) == 0o755
    assert stat.S_IMODE(os.lstat(dest / "train.py").st_mode) == stat.S_IMODE(os.lstat(repo / "train.py").st_mode)
    assert os.path.islink(dest / "model_link.py") and os.readlink(dest / "model_link.py") == "src/model.py"
    assert (dest / "model_link.py").read_text() == "LAYERS = 2\n"  # resolves inside the snapshot
    assert os.path.islink(dest / "dangling") and os.readlink(dest / "dangling") == "/nonexistent/outside"
    (repo / "train.py").chmod(0o666)  # a group/other-writable file is not copied writable by others
    gitsnapshot.snapshot(str(repo), str(tmp_path / "snap2"))
    assert stat.S_IMODE(os.lstat(tmp_path / "snap2" / "train.py").st_mode) == 0o644
    out = subprocess.run([str(dest / "run.sh")], capture_output=True, text=True, check=True)
    assert out.stdout == "hi\n"


def test_snapshot_size_cap_refuses_and_leaves_nothing(repo: Path, tmp_path: Path) -> None:
    (repo / "weights.bin").write_bytes(b"\0" * 50_000)
    git(repo, "add", "weights.bin")
    dest = tmp_path / "out" / "snap"
    with pytest.raises(ValueError, match=r"^refusing to snapshot .*over the 0 MiB limit") as caught:
        gitsnapshot.snapshot(str(repo), str(dest), max_bytes=40_000)
    assert "\n" not in str(caught.value)
    assert not dest.exists()
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []
    assert gitsnapshot.snapshot(str(repo), str(dest), max_bytes=60_000)["bytes"] > 50_000


def test_snapshot_refusals(repo: Path, tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    with pytest.raises(ValueError, match="already exists"):
        gitsnapshot.snapshot(str(repo), str(taken))
    plain = tmp_path / "plain"
    plain.mkdir()
    if subprocess.run(["git", "rev-parse"], cwd=plain, capture_output=True).returncode != 0:
        with pytest.raises(ValueError, match="not a git work tree"):
            gitsnapshot.snapshot(str(plain), str(tmp_path / "snap"))
        assert not (tmp_path / "snap").exists()


def test_snapshot_cwd(repo: Path, tmp_path: Path) -> None:
    snap = str(tmp_path / "snap")
    assert gitsnapshot.snapshot_cwd(str(repo / "src"), str(repo), snap) == os.path.join(snap, "src")
    assert gitsnapshot.snapshot_cwd(str(repo), str(repo), snap) == snap
    link = tmp_path / "link-to-repo"
    os.symlink(repo, link)  # a cwd reached through a symlink still maps into the snapshot
    assert gitsnapshot.snapshot_cwd(str(link / "src"), str(repo), snap) == os.path.join(snap, "src")
    with pytest.raises(ValueError, match="not inside the repository"):
        gitsnapshot.snapshot_cwd(str(tmp_path), str(repo), snap)


def test_imports_only_core() -> None:
    source = Path(gitinfo.__file__).read_text()
    modules = [
        f"{node.module}.{alias.name}" if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    gpuq_modules = [m for m in modules if m and m.startswith("gpuq")]
    assert all(m.startswith("gpuq.core") for m in gpuq_modules), gpuq_modules


# -- every change of the work tree is seen by the next look --


def look(cwd: Path) -> Optional[dict[str, Any]]:
    return gitinfo.provenance(str(cwd))


def test_every_change_is_seen_by_the_next_look(repo: Path) -> None:
    clean = look(repo)
    seen = [clean]

    def step(expect_dirty: bool) -> dict[str, Any]:
        answer = look(repo)
        assert answer is not None and answer["dirty"] is expect_dirty and answer not in seen[-1:]
        seen.append(answer)
        return answer

    (repo / "train.py").write_text("print('v2')\n")  # within the same second as the look before
    step(True)
    (repo / "train.py").write_text("print('v3')\n")  # same size again
    step(True)
    (repo / "train.py").write_text("print('v1')\n")  # back as committed
    assert look(repo) == clean
    (repo / "src" / "model.py").write_text("LAYERS = 3\n")
    unstaged = step(True)
    git(repo, "add", "src/model.py")  # staged: the same change
    assert look(repo) == unstaged
    git(repo, "commit", "-qm", "three layers")
    step(False)
    os.chmod(repo / "train.py", 0o755)
    step(True)
    os.chmod(repo / "train.py", 0o644)
    (repo / "src" / "model.py").unlink()
    step(True)
    os.symlink("train.py", repo / "src" / "model.py")
    step(True)
    (repo / "src" / "model.py").unlink()
    git(repo, "checkout", "-q", "src/model.py")
    git(repo, "checkout", "-q", "-b", "other")
    assert step(False)["branch"] == "other"
    (repo / "train.py").write_text("print('other')\n")
    git(repo, "commit", "-qam", "other")
    step(False)
    git(repo, "checkout", "-q", "-")
    step(False)
    git(repo, "pack-refs", "--all")  # the branches now only in packed-refs
    assert not (repo / ".git" / "refs" / "heads" / "other").exists()
    git(repo, "checkout", "-q", "other")
    assert step(False)["commit"] == git(repo, "rev-parse", "other")
    git(repo, "checkout", "-q", "--detach", "HEAD~1")
    assert step(False)["branch"] is None
    git(repo, "update-index", "--index-version", "4")  # prefix-compressed paths
    (repo / "src" / "model.py").write_text("LAYERS = 4\n")
    step(True)


def test_a_linked_worktree(repo: Path, tmp_path: Path) -> None:
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(linked))
    here = look(linked)
    assert here is not None and here["branch"] == "feature" and here["repo"] == os.path.realpath(linked)
    (linked / "train.py").write_text("print('feature')\n")
    assert look(linked)["dirty"] is True
    git(linked, "commit", "-qam", "feature")  # moves refs/heads/feature in the main repository
    assert look(linked)["commit"] == git(linked, "rev-parse", "HEAD") != here["commit"]
    assert look(repo)["branch"] == git(repo, "symbolic-ref", "--short", "HEAD")


def test_a_corrupt_index_gives_what_git_gives(repo: Path) -> None:
    (repo / "train.py").write_text("print('v2')\n")
    assert look(repo)["dirty"] is True
    index = repo / ".git" / "index"
    good = index.read_bytes()
    index.write_bytes(b"DIRX" + good[4:])  # not an index: git refuses it
    assert look(repo) is None
    index.write_bytes(good[:30])  # cut short
    assert look(repo) is None


def test_add_records_gits_answer_and_keeps_nothing_of_it(gq: Any) -> None:
    """`add` asks git each time: the job's `code` is git's answer now, and nothing of it is kept in
    the spool's cache (a change made between two adds is seen by the second)."""
    repo = new_repo(gq.work / "repo")
    (repo / "train.py").write_text("print('v2')\n")
    ids = [gq.add("-q", "--hold", "-d", str(repo), "true") for _ in range(3)]
    today = gitinfo.provenance(str(repo))
    assert [gq.job(i)["code"] for i in ids] == [today] * 3
    assert not [p for p in (gq.home / "cache").iterdir() if p.name.startswith("git-")]
    (repo / "train.py").write_text("print('v3')\n")
    changed = gq.job(gq.add("-q", "--hold", "-d", str(repo), "true"))["code"]
    assert changed == gitinfo.provenance(str(repo)) and changed["diff_hash"] != today["diff_hash"]


def test_a_directory_replaced_by_a_link(repo: Path) -> None:
    assert look(repo)["dirty"] is False
    os.rename(repo / "src", repo / "moved")
    os.symlink("moved", repo / "src")  # the same files, reached through a link: deleted, for git
    assert look(repo)["dirty"] is True


def test_show_of_a_job_queued_in_a_repository_without_commits_says_so_whole(gq: Any) -> None:
    """`show` cut the words `no commit yet` to a hash's 12 characters: `no commit ye on master`."""
    empty = new_repo(gq.work / "empty", commit=False)
    job_id = gq.add("-d", str(empty), "true")
    branch = git(empty, "symbolic-ref", "--short", "HEAD")
    (line,) = [line for line in gq.gpuq("show", str(job_id)).stdout.splitlines() if line.split()[:1] == ["code"]]
    assert line.split(None, 1)[1] == f"no commit yet on {branch} ({empty})", line
