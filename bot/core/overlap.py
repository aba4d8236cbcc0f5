"""The overlap index: which open pull requests touch which families (DESIGN §4).

Pure and in memory. Handlers turn each PR's files into `FileChange`s once per head SHA
(`file_change_from_patch`), then `OverlapIndex.upsert` maps them onto live families; the
planner asks `overlaps(family, now, idle_days)`. When the catalog or the policy changes,
`retouch` recomputes every PR's touches from the stored changes without an API call.

Which family a changed line belongs to comes from the patch alone: the hunk header's
context (git's funcname, the nearest line above the hunk starting with a letter) names the
enclosing top-level key, and top-level key lines inside the hunk move it. The old and the
new side keep their own current key, because a hunk can remove lines of one block and add
lines of another. git cuts that context to 80 bytes: a longer key's line arrives without
its `:`, and the file's family keys complete it.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from bot.core import events
from bot.core.catalog import (
    Catalog,
    family_file_patterns,
    glob_literal_prefix,
    glob_pattern,
)
from bot.core.domain import (
    OWN_BRANCH_RE,
    Family,
    FileChange,
    Overlap,
    PullRequest,
    TouchKind,
)

_HUNK_HEADER_RE = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@ ?(.*)$")
# git's default funcname rule: only a line starting with one of these heads a hunk.
_FUNCNAME_START_RE = re.compile(r"[A-Za-z_$]")
# A top-level mapping key: column 0, plain or quoted, followed by `:` and space or nothing.
# A plain key is matched greedily with its trailing blanks (callers strip them): a lazy
# `[^:]*?\s*:` backtracks quadratically on a long blank-padded line, and any PR author
# could stall the event loop for seconds with four of them.
_TOP_LEVEL_KEY_RE = re.compile(
    r"""^(?:"(?P<dq>[^"]*)"\s*|'(?P<sq>[^']*)'\s*|(?P<plain>[^\s#'"\-?:,\[\]{}&*!|>%@`][^:]*))"""
    r""":(?:\s|$)"""
)
_INDENTED_KEY_RE = re.compile(r"^(?P<indent>[ ]+)(?P<key>[^\s#:][^:]*):(?:\s|$)")
# YAML's usual indentation; used until a hunk shows a key's first child line.
_DEFAULT_INDENT = 2

# The most top-level keys one FileChange keeps; the real master configs have about 150
# families. A diff that changes more (a file appended with a million keys: found by a
# hostile-input review, which kept them all, +600 MB) is kept as unavailable instead: the
# PR overlaps every family of the file with reason `patch-unavailable`.
MAX_CHANGED_KEYS = 5_000

# Among several reasons a PR touches a family, the one reported: certain facts first.
_KIND_RANK: dict[str, int] = {"image": 3, "flags": 2, "patch-unavailable": 1}


# ---------------------------------------------------------------------------
# Patches -> keys
# ---------------------------------------------------------------------------


def file_change_from_patch(
    filename: str,
    patch: str | None,
    previous_filename: str | None = None,
    status: str = "modified",
    *,
    known_keys: Mapping[str, int] | None = None,
    headed: bool = True,
) -> FileChange:
    """What a master config's patch touches: top-level key -> "image" or "flags".

    Call it for master configs only; any other file is `FileChange(filename)`.
    A None patch means GitHub left it out, and a patch cannot say whose lines it changes
    when its cut hunk-header key no single one of `known_keys` (the file's family keys, each
    with the indentation of its block's keys: `family_indents`) completes, or when its hunk
    headers do not name the blocks (`headed` False, from `hunk_headers_name`): for all three, try `file_change_from_contents` first, and keep
    this `unavailable` answer only when the contents cannot be had either.
    `previous_filename` is kept for renames only: a copy leaves its source untouched.
    """
    previous = previous_filename if status == "renamed" else None
    keys = touched_keys(patch, known_keys) if patch is not None and headed else None
    if keys is None:
        return FileChange(filename, previous, unavailable=True)
    if len(keys) > MAX_CHANGED_KEYS:
        return FileChange(filename, previous, unavailable=True, oversized=True)
    return FileChange(filename, previous, keys=keys)


def file_change_from_contents(
    filename: str,
    base: str | None,
    head: str | None,
    previous_filename: str | None = None,
    status: str = "modified",
) -> FileChange:
    """The fallback when GitHub omits a patch: compare each top-level block's lines.

    A block whose meaningful lines (neither blank nor only a comment) differ is touched:
    `image` when its own `image:` line differs (or exists on one side only), else `flags`.
    A key renamed with its image line unchanged is `flags` on both names, as in its patch,
    where that line stays context. Past MAX_CHANGED_KEYS touched keys the change is
    `unavailable`, as for a patch.
    """
    previous = previous_filename if status == "renamed" else None
    old, new = _blocks(base or ""), _blocks(head or "")
    renamed = _renamed_keys(old, new)
    keys: dict[str, Literal["image", "flags"]] = {}
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if len(keys) == MAX_CHANGED_KEYS:
            return FileChange(filename, previous, unavailable=True, oversized=True)
        moved = key in renamed
        keys[key] = "image" if not moved and _image_lines(before) != _image_lines(after) else "flags"
    return FileChange(filename, previous, keys=keys)


def _renamed_keys(old: dict[str, tuple[str, ...]], new: dict[str, tuple[str, ...]]) -> set[str]:
    """Keys gone from one side paired, in file order, with new keys of the same image line:
    a diff aligns that line and changes the key line around it."""
    gone: dict[str, list[str]] = {}
    for key, block in old.items():
        line = _image_line(block)
        if key not in new and line is not None:
            gone.setdefault(line, []).append(key)
    renamed: set[str] = set()
    for key, block in new.items():
        line = _image_line(block)
        if key not in old and line is not None and gone.get(line):
            renamed |= {gone[line].pop(0), key}
    return renamed


def _blocks(text: str) -> dict[str, tuple[str, ...]]:
    """Top-level key -> the meaningful lines of its block, key line included."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    # Lines are compared as they are, trailing blanks included: the patch rule counts an edit
    # of only those as a change, and so does git when it merges Klaud's edit of the line.
    for line in text.split("\n"):
        if _is_blank_or_comment(line):
            continue
        key = top_level_key(line)
        if key is not None:
            current = blocks.setdefault(key, [])
        if current is not None:
            current.append(line)
    return {key: tuple(lines) for key, lines in blocks.items()}


def _image_line(block: tuple[str, ...] | None) -> str | None:
    """The block's own `image:` line: the last (YAML keeps the later of a repeated key)."""
    lines = _image_lines(block)
    return lines[-1] if lines else None


def _image_lines(block: tuple[str, ...] | None) -> list[str]:
    """Every child key named image at child depth, in order: a patch that changes any of
    them touches `image`, so a comparison of contents does too."""
    if not block or len(block) < 2:
        return []
    indent = len(block[1]) - len(block[1].lstrip(" "))
    return [line for line in block[1:] if (child := _INDENTED_KEY_RE.match(line))
            and child["key"].rstrip() == "image" and len(child["indent"]) == indent]


def touched_keys(
    patch: str, known_keys: Mapping[str, int] | None = None
) -> dict[str, Literal["image", "flags"]] | None:
    """Top-level keys whose blocks the patch changes; see the module notes for the rule.

    None when a hunk header names a key git cut short that no single one of `known_keys`
    completes: the patch alone cannot say which block that hunk's lines belong to.
    `known_keys` also gives each key's child indentation, for a hunk that starts inside its
    block (below its key line, from which the indentation is otherwise read).
    """
    known_keys = known_keys or {}
    old, new = _SideState(known_keys), _SideState(known_keys)
    touched: dict[str, Literal["image", "flags"]] = {}
    in_hunk = False
    sorted_keys = sorted(known_keys)
    for line in patch.split("\n"):
        header = _HUNK_HEADER_RE.match(line)
        if header is not None:
            context = header.group(1)
            key = top_level_key(context)
            if context and key is None:
                key = _completed_key(context, sorted_keys)
                if key is None:
                    return None
            # The lines between two hunks are the same on both sides. When they hold no key
            # line, the header repeats the old side's current key, and the new side keeps
            # its own (which differs when the last hunk added or removed a key line).
            new.enter_hunk(new.key if in_hunk and key == old.key else key)
            old.enter_hunk(key)
            in_hunk = True
            continue
        if not in_hunk or line.startswith("\\"):
            continue  # anything before the first hunk, "\ No newline at end of file"
        tag, text = (line[0], line[1:]) if line else (" ", "")
        if tag == " ":
            old.see(text)
            new.see(text)
        elif tag in "-+":
            side = old if tag == "-" else new
            side.see(text)
            kind = side.touch_kind(text)
            if kind is not None and side.key is not None and touched.get(side.key) != "image":
                touched[side.key] = kind
    return touched


def family_indents(families: Iterable[Family]) -> dict[str, int]:
    """The `known_keys` of `file_change_from_patch`: each family's key and child indentation."""
    return {family.key: family.child_indent for family in families if family.child_indent is not None}


def hunk_headers_name(families: Iterable[Family]) -> bool:
    """Whether git heads a hunk of these families' file with the key of the block it is in.

    git takes the nearest line above a hunk that begins with a letter, `_` or `$`: a key
    line that begins otherwise (`405b-fp8:`, `"quoted":`) is passed over, and the header
    names the key above it, so the patch alone cannot say whose lines the hunk holds.
    """
    return all(not f.key_quoted and _FUNCNAME_START_RE.match(f.key) for f in families)


def _completed_key(cut: str, sorted_keys: Sequence[str]) -> str | None:
    """The one key of `sorted_keys` that a hunk header's context without a `:` begins.

    In a YAML mapping every line git picks as that context is a top-level key line, so one
    without its `:` was cut to 80 bytes (xdiff's funcname buffer; trailing blanks trimmed).
    """
    start = cut.rstrip()
    at = bisect_left(sorted_keys, start)
    found = [key for key in sorted_keys[at : at + 2] if key.startswith(start)]
    return found[0] if len(found) == 1 else None


class _SideState:
    """The current top-level key on one side of a patch, and its children's indentation."""

    __slots__ = ("awaiting_child", "child_indent", "indents", "key")

    def __init__(self, indents: Mapping[str, int]) -> None:
        self.key: str | None = None
        self.indents = indents  # known keys' child indentation, from the catalog
        self.child_indent = _DEFAULT_INDENT
        self.awaiting_child = False

    def enter_hunk(self, key: str | None) -> None:
        self.key = key
        if key is not None:
            self.child_indent = self.indents.get(key, self.child_indent)
        self.awaiting_child = False

    def see(self, text: str) -> None:
        if _is_blank_or_comment(text):
            return
        key = top_level_key(text)
        if key is not None:
            self.key = key
            self.child_indent = self.indents.get(key, self.child_indent)
            self.awaiting_child = True  # its first child line in the hunk, if any, says better
        elif self.awaiting_child:
            # The first line under a key shows how deep this file indents its children.
            self.child_indent = len(text) - len(text.lstrip(" "))
            self.awaiting_child = False

    def touch_kind(self, text: str) -> Literal["image", "flags"] | None:
        if _is_blank_or_comment(text):
            return None
        child = _INDENTED_KEY_RE.match(text)
        if child and child["key"].rstrip() == "image" and len(child["indent"]) == self.child_indent:
            return "image"
        return "flags"


def top_level_key(text: str) -> str | None:
    """The key a column-0 `key:` line opens, or None for any other line."""
    match = _TOP_LEVEL_KEY_RE.match(text)
    if match is None:
        return None
    plain = match["plain"]
    return (plain.rstrip() if plain else None) or match["dq"] or match["sq"]


def _is_blank_or_comment(text: str) -> bool:
    stripped = text.strip()
    return not stripped or stripped.startswith("#")


# ---------------------------------------------------------------------------
# Pull requests -> families
# ---------------------------------------------------------------------------


def is_klaud_own(
    head_ref: str, author: str | None, head_repo_is_base: bool, bot_logins: Iterable[str]
) -> tuple[bool, str | None]:
    """Whether a PR is Klaud's own, and the family hash its branch names.

    Only a branch in the repository itself counts: anyone can name a fork's branch
    `klaud/auto-…`.
    """
    match = OWN_BRANCH_RE.match(head_ref) if head_repo_is_base else None
    family_hash = match.group(1) if match else None
    by_bot = author is not None and author.lower() in {login.lower() for login in bot_logins}
    return (family_hash is not None or by_bot), family_hash


def pull_record(
    repo: str,
    pull: events.PullRequest,
    bot_logins: Iterable[str],
    *,
    changes: tuple[FileChange, ...],
    files_complete: bool,
    files_sha: str | None,
) -> PullRequest:
    """What the overlap index keeps of an open PR (from a webhook or the pulls API alike)."""
    author = pull.user.login or ""
    own, fam16 = is_klaud_own(pull.head.ref, author, _head_in_base_repo(repo, pull), bot_logins)
    return PullRequest(
        number=pull.number,
        title=pull.title,
        author=author,
        head_ref=pull.head.ref,
        head_sha=pull.head.sha,
        base_ref=pull.base.ref,
        draft=pull.draft,
        labels=tuple(sorted(label.name for label in pull.labels)),
        created_at=pull.created_at,
        updated_at=pull.updated_at,
        klaud_own=own,
        own_family_hash=fam16,
        changes=changes,
        files_complete=files_complete,
        files_sha=files_sha,
    )


def _head_in_base_repo(repo: str, pull: events.PullRequest) -> bool:
    """Whether the PR's branch lives in the repository itself (`repo`), not in a fork.

    Ids first: an event sent before a rename, handled after it, names both repositories by
    the old name while `repo` is the new one. Names only when a payload carries no ids.
    """
    head, base = pull.head.repo, pull.base.repo
    if head is None:
        return False  # the fork was deleted
    if head.id is not None and base is not None and base.id is not None:
        return head.id == base.id
    return head.full_name.lower() == repo.lower()


def is_idle(pr: PullRequest, now: datetime, idle_days: int) -> bool:
    """A human PR untouched for `idle_days` overlaps nothing; Klaud's own never idle."""
    return not pr.klaud_own and now - pr.last_active >= timedelta(days=idle_days)


class _FamilyFiles:
    """Policy `family_files` expanded for every family, looked up by a file's path.

    Each expanded glob is filed under its literal prefix, so a path is only tested
    against the globs whose prefix it starts with instead of every family's.
    """

    def __init__(self, catalog: Catalog, patterns: Sequence[str]) -> None:
        self._by_prefix: dict[str, list[tuple[str, str]]] = {}
        # Compiled on first use: most globs never meet a path that starts like them.
        self._compiled: dict[str, re.Pattern[str]] = {}
        for family in catalog if patterns else ():
            for glob in family_file_patterns(family, patterns):
                prefix = glob_literal_prefix(glob)
                self._by_prefix.setdefault(prefix, []).append((glob, family.id))
        # Only a path's prefixes of these lengths can be filed: slicing it at every length
        # cost time in the square of its length (a PR's 3,000 paths of thousands of characters).
        self._lengths = sorted({len(prefix) for prefix in self._by_prefix})

    def families_for(self, path: str) -> list[str]:
        found: list[str] = []
        for end in self._lengths:
            if end > len(path):
                break
            for glob, family_id in self._by_prefix.get(path[:end], ()):
                if self._regex(glob).fullmatch(path):
                    found.append(family_id)
        return found

    def _regex(self, glob: str) -> re.Pattern[str]:
        compiled = self._compiled.get(glob)
        if compiled is None:
            try:
                compiled = re.compile(glob_pattern(glob))
            except (ValueError, re.error):
                # `[a-{precision}]`, valid for some families' values and not for others',
                # kept from a policy read before such classes were refused: it matches
                # nothing for those families, rather than every pull request's event raising.
                compiled = _NOTHING
            self._compiled[glob] = compiled
        return compiled


_NOTHING = re.compile(r"(?!)")


def pull_touches(
    pr: PullRequest, catalog: Catalog, family_files: Sequence[str] = ()
) -> dict[str, TouchKind]:
    """Family id -> how `pr` touches it, ignoring idleness and Klaud ownership."""
    return _touches(pr, catalog, _FamilyFiles(catalog, family_files))


def _touches(
    pr: PullRequest, catalog: Catalog, family_files: _FamilyFiles
) -> dict[str, TouchKind]:
    touches: dict[str, TouchKind] = {}

    def add(family_id: str, kind: TouchKind) -> None:
        current = touches.get(family_id)
        if current is None or _KIND_RANK[kind] > _KIND_RANK[current]:
            touches[family_id] = kind

    for change in pr.changes:
        paths = [change.filename]
        if change.previous_filename and change.previous_filename != change.filename:
            paths.append(change.previous_filename)
        for path in paths:
            if change.unavailable:
                for family in catalog.families_of(path):
                    add(family.id, "patch-unavailable")
            for key, kind in change.keys.items():
                found = catalog.find(path, key)
                if found is not None:
                    add(found.id, kind)
            for family_id in family_files.families_for(path):
                add(family_id, "flags")
    if not pr.files_complete:
        # GitHub lists at most 3,000 files; what it left out may touch any family.
        for family in catalog:
            add(family.id, "patch-unavailable")
    return touches


@dataclass(frozen=True, slots=True)
class _Entry:
    pr: PullRequest
    touches: dict[str, TouchKind]


class OverlapIndex:
    """Open PRs of one repository with a reverse index family -> {PR number: kind}.

    upsert and remove cost what the PR itself touches, never the size of the index.
    """

    def __init__(self, catalog: Catalog, family_files: Sequence[str] = ()) -> None:
        self._catalog = catalog
        self._family_files = _FamilyFiles(catalog, family_files)
        self._entries: dict[int, _Entry] = {}
        self._by_family: dict[str, dict[int, TouchKind]] = {}
        self._own_by_hash: dict[str, set[int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, number: object) -> bool:
        return number in self._entries

    def upsert(self, pr: PullRequest) -> None:
        self.remove(pr.number)
        entry = _Entry(pr, _touches(pr, self._catalog, self._family_files))
        self._entries[pr.number] = entry
        self._link(entry)

    def remove(self, number: int) -> PullRequest | None:
        entry = self._entries.pop(number, None)
        if entry is None:
            return None
        self._unlink(entry)
        return entry.pr

    def get(self, number: int) -> PullRequest | None:
        entry = self._entries.get(number)
        return entry.pr if entry is not None else None

    def prs(self) -> list[PullRequest]:
        """Every open PR, by number."""
        return [self._entries[number].pr for number in sorted(self._entries)]

    def touches(self, number: int) -> dict[str, TouchKind]:
        entry = self._entries.get(number)
        return dict(entry.touches) if entry is not None else {}

    def retouch(self, catalog: Catalog, family_files: Sequence[str] = ()) -> None:
        """Recompute every PR's touches for a new catalog or policy, from stored changes."""
        self._catalog = catalog
        self._family_files = _FamilyFiles(catalog, family_files)
        self._by_family.clear()
        self._entries = {
            number: _Entry(entry.pr, _touches(entry.pr, catalog, self._family_files))
            for number, entry in self._entries.items()
        }
        for entry in self._entries.values():
            self._link_touches(entry)

    def klaud_prs(self) -> dict[str, int]:
        """Live family id -> its open Klaud PR (the lowest number if there are several)."""
        found: dict[str, int] = {}
        for family in self._catalog:
            numbers = self._own_by_hash.get(family.family_hash)
            if numbers:
                found[family.id] = min(numbers)
        return found

    def overlaps(self, family: Family, now: datetime, idle_days: int) -> list[Overlap]:
        """Open PRs that block `family` now, by PR number, each with a reason for people."""
        found: dict[int, Overlap] = {}
        for number in self._own_by_hash.get(family.family_hash, ()):
            found[number] = Overlap(
                number, "image", f"Klaud PR #{number} is already working on this family"
            )
        for number, kind in self._by_family.get(family.id, {}).items():
            pr = self._entries[number].pr
            if number in found or is_idle(pr, now, idle_days):
                continue
            found[number] = Overlap(number, kind, _reason(pr, kind, family))
        return [found[number] for number in sorted(found)]

    def klaud_pr(self, family: Family) -> int | None:
        """The family's open Klaud PR (the lowest number if there are several)."""
        numbers = self._own_by_hash.get(family.family_hash)
        return min(numbers) if numbers else None

    def overlaps_until(self, family: Family, now: datetime, idle_days: int) -> datetime | None:
        """When the first human PR overlapping `family` now goes idle (and stops overlapping)."""
        idle = timedelta(days=idle_days)
        times = [
            pr.last_active + idle
            for number in self._by_family.get(family.id, {})
            if not (pr := self._entries[number].pr).klaud_own and pr.last_active + idle > now
        ]
        return min(times, default=None)

    def families_of(self, number: int) -> tuple[set[str], str | None]:
        """The family ids PR `number` touches, and the family hash its Klaud branch names."""
        entry = self._entries.get(number)
        if entry is None:
            return set(), None
        return set(entry.touches), entry.pr.own_family_hash if entry.pr.klaud_own else None

    def blocking(self, now: datetime, idle_days: int) -> dict[str, list[Overlap]]:
        """Family id -> `overlaps(family, …)`, for the live families some open PR blocks now."""
        found: dict[str, list[Overlap]] = {}
        for family in self._catalog:
            if family.id in self._by_family or family.family_hash in self._own_by_hash:
                overlaps = self.overlaps(family, now, idle_days)
                if overlaps:
                    found[family.id] = overlaps
        return found

    def _link(self, entry: _Entry) -> None:
        self._link_touches(entry)
        if entry.pr.klaud_own and entry.pr.own_family_hash:
            self._own_by_hash.setdefault(entry.pr.own_family_hash, set()).add(entry.pr.number)

    def _link_touches(self, entry: _Entry) -> None:
        for family_id, kind in entry.touches.items():
            self._by_family.setdefault(family_id, {})[entry.pr.number] = kind

    def _unlink(self, entry: _Entry) -> None:
        number = entry.pr.number
        for family_id in entry.touches:
            prs = self._by_family.get(family_id)
            if prs is not None:
                prs.pop(number, None)
                if not prs:
                    del self._by_family[family_id]
        family_hash = entry.pr.own_family_hash
        if family_hash and family_hash in self._own_by_hash:
            self._own_by_hash[family_hash].discard(number)
            if not self._own_by_hash[family_hash]:
                del self._own_by_hash[family_hash]


def _reason(pr: PullRequest, kind: TouchKind, family: Family) -> str:
    if kind == "image":
        return f"PR #{pr.number} changes this family's image line"
    if kind == "flags":
        return f"PR #{pr.number} changes this family's settings"
    if not pr.files_complete and not _lists_file_unavailable(pr, family.path):
        listing = "incomplete" if pr.changes else "unavailable"
        return f"PR #{pr.number}: file list {listing}; assuming it touches this family"
    return (
        f"PR #{pr.number}: patch unavailable for {family.path}; assuming it touches this family"
    )


def _lists_file_unavailable(pr: PullRequest, path: str) -> bool:
    return any(
        change.unavailable and path in (change.filename, change.previous_filename)
        for change in pr.changes
    )
