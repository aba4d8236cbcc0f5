"""`git blame` over the sandbox's history: which commit last changed each line of a file.

A commit's lines start as its own; every line git's diff keeps from a parent takes that
parent's origin instead, the first parent first, as `git blame` passes blame on. So a
merge commit owns only the lines that neither parent had, and a push of unrelated files
leaves every line where it was. A file renamed whole is followed to its old path, as git
and GitHub do.
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
    """For each line of `path` at `sha`, the sha of the commit that made it so.

    Walked from `sha` back (with a stack, not recursion: histories are long), through
    each parent at the path the file had there: its own, or the one it was renamed from.
    """
    known: dict[tuple[str, str], list[str] | None] = {}
    stack = [(sha, path)]
    while stack:
        at = stack[-1]
        if at in known:
            stack.pop()
            continue
        commit = repo.commits[at[0]]
        sources = [(parent, source_path(repo, commit, parent, at[1])) for parent in commit.parents
                   if parent in repo.commits]
        waiting = [(parent, source) for parent, source in sources
                   if source is not None and (parent, source) not in known]
        if waiting and at[1] in commit.tree:
            stack.extend(waiting)
            continue
        stack.pop()
        known[at] = commit_origins(repo, commit, at[1], sources, known)
    return known[(sha, path)]


# git's rename detection: a file at least this similar to one the commit deleted was moved.
RENAME_SIMILARITY = 0.5
# git 2.33+: a deleted file whose base name no other deleted file has is paired with the
# destination of that name first, at this similarity (halfway from RENAME_SIMILARITY to 1).
BASENAME_SIMILARITY = 0.75


def source_path(repo: RepoState, commit: Commit, parent: str, path: str) -> str | None:
    """Where `path`'s lines were in `parent`: the same path, else the file the commit
    renamed to it (git blame follows whole-file renames, and so does GitHub's); None when
    the commit made it new. As git's rename detection: an identical file first, then the
    one deleted file of the same base name when 75 % alike, then the most similar; among
    equals, one of the same base name, then the first by path."""
    before = repo.commits[parent].tree
    text = commit.tree.get(path)
    if text is None or path in before:
        return path if text is not None and path in before else None
    deleted = [old for old in sorted(before) if old not in commit.tree]
    name = path.rsplit("/", 1)[-1]
    exact = [old for old in deleted if before[old] == text]
    if exact:
        return min(exact, key=lambda old: old.rsplit("/", 1)[-1] != name)
    named = [old for old in deleted if old.rsplit("/", 1)[-1] == name]
    if len(named) == 1 and similarity(before[named[0]], text) >= BASENAME_SIMILARITY:
        return named[0]
    best, rank = None, None
    for old in deleted:
        score = similarity(before[old], text)
        key = (-score, old.rsplit("/", 1)[-1] != name)
        if score >= RENAME_SIMILARITY and (rank is None or key < rank):
            best, rank = old, key
    return best


def similarity(old: str, new: str) -> float:
    """git's rename score (diffcore-delta): the bytes of `old` found again in `new`, counted
    by chunks (a line, or 64 bytes of one), over the larger file's size."""
    source, target = old.encode("utf-8"), new.encode("utf-8")
    largest = max(len(source), len(target))
    if not largest:
        return 1.0
    kept = _chunks(target)
    copied = sum(min(count, kept.get(chunk, 0)) for chunk, count in _chunks(source).items())
    return copied / largest


def _chunks(data: bytes) -> dict[bytes, int]:
    counts: dict[bytes, int] = {}
    start = 0
    for at, byte in enumerate(data):
        if byte == 0x0A or at + 1 - start == 64:
            chunk = data[start : at + 1]
            counts[chunk] = counts.get(chunk, 0) + len(chunk)
            start = at + 1
    if start < len(data):
        counts[data[start:]] = counts.get(data[start:], 0) + len(data) - start
    return counts


def commit_origins(repo: RepoState, commit: Commit, path: str, sources: list[tuple[str, str | None]],
                   known: dict[tuple[str, str], list[str] | None]) -> list[str] | None:
    text = commit.tree.get(path)
    if text is None:
        return None
    for parent, source in sources:
        # A parent with the very same text takes the blame of every line, as in git.
        if source is not None and repo.commits[parent].tree[source] == text and known[(parent, source)] is not None:
            return known[(parent, source)]
    owners = [commit.sha] * len(split_lines(text))
    for parent, source in sources:
        inherited = known.get((parent, source)) if source is not None else None
        if source is None or inherited is None:
            continue
        for old, new in kept_lines(repo.commits[parent].tree[source], text):
            if owners[new] == commit.sha:
                owners[new] = inherited[old]
    return owners
