"""Sandbox blame against real `git blame` on the same history."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.sandbox import Sandbox
from bot.sandbox.blame import line_origins
from tests.sandbox.test_sandbox_support import small_scenario

T0 = datetime(2026, 1, 1, tzinfo=UTC)
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="no git on this machine to compare blame with")


def _git(cwd: Path, *args: str, stdin: str | None = None, at: datetime | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@x", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd)}
    if at is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = at.isoformat()
    return subprocess.run(["git", *args], cwd=cwd, env=env, input=stdin, text=True,
                          capture_output=True, check=True).stdout


def compare(tmp_path: Path, commits: list[tuple[str, tuple[int, ...], dict[str, str]]], path: str
            ) -> tuple[list[str], list[str]]:
    """(sandbox, git): the message of the commit each line of `path` at the last commit is blamed on."""
    repo = Sandbox(small_scenario()).world.repo("acme/bench")
    _git(tmp_path, "init", "-q")
    sandbox_shas: list[str] = []
    git_shas: list[str] = []
    for n, (message, parents, tree) in enumerate(commits):
        at = T0 + timedelta(days=n)
        sandbox_shas.append(repo.commit(dict(tree), tuple(sandbox_shas[p] for p in parents), message, "alice", at).sha)
        _git(tmp_path, "read-tree", "--empty")
        for name, text in tree.items():
            blob = _git(tmp_path, "hash-object", "-w", "--stdin", stdin=text).strip()
            _git(tmp_path, "update-index", "--add", "--cacheinfo", f"100644,{blob},{name}")
        tree_id = _git(tmp_path, "write-tree").strip()
        parent_args = [arg for p in parents for arg in ("-p", git_shas[p])]
        git_shas.append(_git(tmp_path, "commit-tree", tree_id, *parent_args, "-m", message, at=at).strip())
    messages = {c.sha: c.message for c in repo.commits.values()}
    mine = [messages[o] for o in line_origins(repo, sandbox_shas[-1], path) or []]
    subjects = {sha: commits[i][0] for i, sha in enumerate(git_shas)}
    porcelain = _git(tmp_path, "blame", "--line-porcelain", git_shas[-1], "--", path)
    theirs = [subjects[line.split()[0]] for line in porcelain.splitlines()
              if len(line) > 40 and line[:40] in subjects and not line.startswith("\t")]
    return mine, theirs


def _blocks(tag: str, count: int = 6) -> str:
    return "".join(f"{tag}-{i}:\n  image: repo/{tag}:{i}\n" for i in range(count))


A, B, C = _blocks("a"), _blocks("b"), _blocks("c")


def test_of_two_deleted_files_equally_like_the_new_one_blame_follows_the_one_git_does(tmp_path: Path) -> None:
    # p.yaml and q.yaml are each two thirds of r.yaml: git takes the first by path.
    mine, theirs = compare(tmp_path, [
        ("add p", (), {"p.yaml": A + B}),
        ("add q", (0,), {"p.yaml": A + B, "q.yaml": A + C}),
        ("merge them", (1,), {"r.yaml": A + B + C}),
    ], "r.yaml")
    assert theirs == ["add p"] * 24 + ["merge them"] * 12
    assert mine == theirs


def test_of_two_identical_deleted_files_blame_follows_the_one_of_the_same_name(tmp_path: Path) -> None:
    # git's exact rename prefers the source with the destination's base name.
    mine, theirs = compare(tmp_path, [
        ("add amd", (), {"configs/amd-master.yaml": A}),
        ("add old nv", (0,), {"configs/amd-master.yaml": A, "old/nv-master.yaml": A}),
        ("move", (1,), {"configs/nv-master.yaml": A}),
    ], "configs/nv-master.yaml")
    assert theirs == ["add old nv"] * 12
    assert mine == theirs


def test_a_config_renamed_with_its_blocks_reordered_is_followed_as_git_does(tmp_path: Path) -> None:
    # git scores a rename by the lines the two files share, wherever they are (every one
    # here): the renamed file's kept block keeps its origin.
    mine, theirs = compare(tmp_path, [
        ("add", (), {"configs/old-master.yaml": A + B + C}),
        ("rename and reorder", (0,), {"configs/new-master.yaml": C + B + A}),
    ], "configs/new-master.yaml")
    assert theirs.count("add") == 12
    assert mine == theirs


def test_a_deleted_file_of_the_same_base_name_is_followed_before_a_more_similar_one_as_git_does(tmp_path: Path) -> None:
    # git (2.33+) pairs a source and a destination whose base name no other source shares
    # once they are 75 % alike, before scoring any other: old/nv-master.yaml (77 %) is
    # followed, not x/other.yaml (92 %).
    e, d = _blocks("e", 2), _blocks("d")
    mine, theirs = compare(tmp_path, [
        ("add", (), {"old/nv-master.yaml": A + B + C + e, "x/other.yaml": A + B + C + d}),
        ("move", (0,), {"configs/nv-master.yaml": A + B + C + d + e}),
    ], "configs/nv-master.yaml")
    assert theirs == ["add"] * 36 + ["move"] * 12 + ["add"] * 4
    assert mine == theirs
