"""`git blame` over the sandbox's history: which commit last changed each line of a file.

Commits are visited oldest first (parents are always older). A commit's lines start as its
own; every line git's diff keeps from a parent takes that parent's origin instead, the
first parent first, as `git blame` passes blame on. So a merge commit owns only the lines
that neither parent had, and a push of unrelated files leaves every line where it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.sandbox.gitdiff import kept_lines, split_lines
from bot.sandbox.state import Commit, RepoState


@dataclass(frozen=True)
class BlameRange:
    """Lines `start`..`end` (1-based, inclusive) last changed by `commit`."""

    start: int
    end: int
    commit: Commit


def blame(repo: RepoState, sha: str, path: str) -> list[BlameRange] | None:
    """The blame of `path` at commit `sha`; None when the file is not there."""
    origins = line_origins(repo, sha, path)
    if origins is None:
        return None
    ranges: list[BlameRange] = []
    for number, origin in enumerate(origins, start=1):
        if ranges and ranges[-1].commit.sha == origin and ranges[-1].end == number - 1:
            ranges[-1] = BlameRange(ranges[-1].start, number, ranges[-1].commit)
        else:
            ranges.append(BlameRange(number, number, repo.commits[origin]))
    return ranges


def line_origins(repo: RepoState, sha: str, path: str) -> list[str] | None:
    """For each line of `path` at `sha`, the sha of the commit that made it so."""
    history = sorted(repo.ancestors(sha), key=lambda s: repo.commits[s].seq)
    origins: dict[str, list[str] | None] = {}
    for commit in (repo.commits[s] for s in history):
        origins[commit.sha] = commit_origins(repo, commit, path, origins)
    return origins.get(sha)


def commit_origins(repo: RepoState, commit: Commit, path: str,
                   known: dict[str, list[str] | None]) -> list[str] | None:
    text = commit.tree.get(path)
    if text is None:
        return None
    owners = [commit.sha] * len(split_lines(text))
    for parent in commit.parents:
        inherited = known.get(parent)
        if inherited is None:
            continue
        before = repo.commits[parent].tree[path]
        if before == text:
            return list(inherited)
        for old, new in kept_lines(before, text):
            if owners[new] == commit.sha:
                owners[new] = inherited[old]
    return owners
