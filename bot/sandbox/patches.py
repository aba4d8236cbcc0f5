"""Patches for pull-request files: computed like `git diff`, or applied to a base text.

A scenario may give a file's head `content` (we diff it against the base, the way git
does) or only its `patch` (we apply it to the base, so the contents API and a merge can
still produce the head text).
"""

from __future__ import annotations

import hashlib
import re

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """A patch does not apply to the text it was given for."""


def compute_patch(old: str, new: str) -> str:
    # Imported late: bot.sandbox.gitdiff is optional for scenarios that give every patch.
    from bot.sandbox.gitdiff import unified_diff

    return unified_diff(old, new)


def blob_sha(text: str) -> str:
    """Git's blob id of `text`, so the contents API answers the sha git would."""
    data = text.encode("utf-8")
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def count_changes(patch: str | None) -> tuple[int, int]:
    """(additions, deletions) of a patch that starts at its first hunk header."""
    if not patch:
        return 0, 0
    additions = deletions = 0
    for line in patch.split("\n"):
        if line.startswith("@@"):
            continue
        if line.startswith("+"):
            additions += 1
        elif line.startswith("-"):
            deletions += 1
    return additions, deletions


def apply_patch(old: str, patch: str) -> str:
    """Apply a unified diff (from its first `@@` on) to `old`; PatchError if it does not fit."""
    old_lines = old.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    lines = patch.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    previous = ""
    in_hunk = False
    for line in lines:
        header = HUNK_RE.match(line)
        if header:
            start, length = int(header.group(1)), int(header.group(2) or "1")
            target = start if length == 0 else start - 1
            if target < pos or target > len(old_lines):
                raise PatchError(f"hunk {line!r} does not fit the base text")
            out.extend(old_lines[pos:target])
            pos = target
            in_hunk = True
            previous = "@"
            continue
        if not in_hunk:
            raise PatchError("patch text must start with a hunk header")
        # Some tools strip the lone space of an empty context line.
        kind, text = (line[:1], line[1:]) if line else (" ", "")
        if kind in (" ", "-"):
            if pos >= len(old_lines) or old_lines[pos].rstrip("\r\n") != text:
                raise PatchError(f"line {pos + 1} of the base text does not match the patch")
            if kind == " ":
                out.append(old_lines[pos])
            pos += 1
        elif kind == "+":
            out.append(text + "\n")
        elif kind == "\\":
            if previous in ("+", " ") and out:
                out[-1] = out[-1].rstrip("\n")
        else:
            raise PatchError(f"unexpected patch line {line!r}")
        previous = kind
    out.extend(old_lines[pos:])
    return "".join(out)
