"""Unified diffs exactly as `git diff` prints them (GitHub's files API `patch` field).

Klaud reads hunk headers to learn which family a changed line belongs to, and the sandbox
must hand out the same patches GitHub would, so "close to git" is not enough: the hunks,
their boundaries and the function-name context after `@@` must match git byte for byte.
This module therefore follows git's default (Myers) diff as xdiff implements it:

1. lines are compared whole, trailing newline included (so a missing final newline is a
   change of that line);
2. the common head and tail are trimmed, and lines that cannot match anything on the
   other side are set aside before the search, as xdiff does to keep the search small;
3. Myers' middle-snake search with xdiff's cost limits picks the changed lines;
4. every group of changed lines is slid to its canonical place: aligned with a change on
   the other side when it can be, else where git's indent heuristic (on by default since
   git 2.14) scores best;
5. changes closer than 2 × 3 context lines share a hunk; each header carries the nearest
   line above the hunk that starts with a letter, `_` or `$` (git's default funcname rule),
   cut to 80 bytes.

The result starts at the first `@@` (no `diff --git`/`---`/`+++` lines) and ends with a
newline, like the fixtures' `patch` text.
"""

from __future__ import annotations

from dataclasses import dataclass

CONTEXT_LINES = 3
# git's hunk-header function name buffer (xdiff `funcbuf`), in bytes.
FUNCNAME_BYTES = 80
NO_NEWLINE_MARKER = "\\ No newline at end of file\n"

# xdiff's tuning constants for the Myers search and the pre-pass.
_MAX_COST_MIN = 256
_HEURISTIC_MIN_COST = 256
_SNAKE_COUNT = 20
_K_HEURISTIC = 4
_MAX_EQUAL_LIMIT = 1024
_KEEP_DISCARD_RUN = 4
_SIMILAR_SCAN_WINDOW = 100
_LINE_MAX = 2**63 - 1

# Indent-heuristic weights (git's values, tuned on a corpus by its authors).
_MAX_INDENT = 200
_MAX_BLANKS = 20
_START_OF_FILE_PENALTY = 1
_END_OF_FILE_PENALTY = 21
_TOTAL_BLANK_WEIGHT = -30
_POST_BLANK_WEIGHT = 6
_RELATIVE_INDENT_PENALTY = -4
_RELATIVE_INDENT_WITH_BLANK_PENALTY = 10
_RELATIVE_OUTDENT_PENALTY = 24
_RELATIVE_OUTDENT_WITH_BLANK_PENALTY = 17
_RELATIVE_DEDENT_PENALTY = 23
_RELATIVE_DEDENT_WITH_BLANK_PENALTY = 17
_INDENT_WEIGHT = 60
_INDENT_MAX_SLIDING = 100

# git's own ctype: only these count as whitespace (not \v or \f).
_GIT_SPACE = frozenset(" \t\n\r")
_GIT_SPACE_BYTES = b" \t\n\r"


def unified_diff(old: str | None, new: str | None) -> str:
    """The patch `git diff` prints from `old` to `new`, from the first `@@` on.

    None stands for an absent file (added or deleted), diffed as empty text, which gives
    `@@ -0,0 +1,N @@` and `@@ -1,N +0,0 @@` like git. Equal texts give "".
    """
    lines1 = split_lines(old or "")
    lines2 = split_lines(new or "")
    return "".join(_emit_hunks(lines1, lines2, _changes(lines1, lines2)))


def kept_lines(old: str, new: str) -> list[tuple[int, int]]:
    """(line in `old`, line in `new`), 0-based, of every line git's diff leaves unchanged.

    This is what `git blame` passes on from a parent: a kept line keeps its origin.
    """
    lines1, lines2 = split_lines(old), split_lines(new)
    pairs: list[tuple[int, int]] = []
    i1 = i2 = 0
    for change in _changes(lines1, lines2):
        pairs.extend(zip(range(i1, change.i1), range(i2, change.i2), strict=True))
        i1, i2 = change.i1 + change.count1, change.i2 + change.count2
    pairs.extend(zip(range(i1, len(lines1)), range(i2, len(lines2)), strict=True))
    return pairs


def _changes(lines1: list[str], lines2: list[str]) -> list[_Change]:
    side1, side2 = _Side.pair(lines1, lines2)
    _mark_changes(side1, side2)
    _compact(side1, side2)
    _compact(side2, side1)
    return _edit_script(side1, side2)


def split_lines(text: str) -> list[str]:
    """Lines with their `\\n` kept; only `\\n` ends a line (a `\\r` stays in it, as in git)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


class _Side:
    """One file of the diff: line classes and the changed-line marks being computed."""

    __slots__ = ("changed", "classes", "count", "lines")

    def __init__(self, lines: list[str], classes: list[int]) -> None:
        self.lines = lines
        self.classes = classes
        self.count = len(lines)
        # changed[i + 1] is line i; the two extra slots are the "unchanged" sentinels
        # before the first and after the last line that the group walks rely on.
        self.changed = bytearray(self.count + 2)

    @classmethod
    def pair(cls, lines1: list[str], lines2: list[str]) -> tuple[_Side, _Side]:
        ids: dict[str, int] = {}
        classes1 = [ids.setdefault(line, len(ids)) for line in lines1]
        classes2 = [ids.setdefault(line, len(ids)) for line in lines2]
        return cls(lines1, classes1), cls(lines2, classes2)

    def is_changed(self, index: int) -> bool:
        return bool(self.changed[index + 1])

    def set_changed(self, index: int, value: bool) -> None:
        self.changed[index + 1] = value


# ---------------------------------------------------------------------------
# Finding the changed lines
# ---------------------------------------------------------------------------


def _mark_changes(side1: _Side, side2: _Side) -> None:
    start, end1, end2 = _common_ends(side1.classes, side2.classes)
    keep1 = _searchable_lines(side1, side2, start, end1)
    keep2 = _searchable_lines(side2, side1, start, end2)
    _mark_set_aside(side1, start, end1, keep1)
    _mark_set_aside(side2, start, end2, keep2)
    _MyersSearch(side1, keep1, side2, keep2).run()


def _mark_set_aside(side: _Side, start: int, end: int, keep: list[int]) -> None:
    kept = set(keep)
    for index in range(start, end + 1):
        if index not in kept:
            side.set_changed(index, True)


def _common_ends(classes1: list[int], classes2: list[int]) -> tuple[int, int, int]:
    """First differing line and the last line of each side before the common tail."""
    limit = min(len(classes1), len(classes2))
    start = 0
    while start < limit and classes1[start] == classes2[start]:
        start += 1
    tail = 0
    while tail < limit - start and classes1[-1 - tail] == classes2[-1 - tail]:
        tail += 1
    return start, len(classes1) - tail - 1, len(classes2) - tail - 1


def _bogo_sqrt(value: int) -> int:
    """xdiff's power-of-two square-root estimate."""
    root = 1
    while value > 0:
        value >>= 2
        root <<= 1
    return root


def _searchable_lines(side: _Side, other: _Side, start: int, end: int) -> list[int]:
    """Lines of `side[start..end]` the Myers search must consider.

    A line absent from the other file is certainly changed. A line with very many equal
    lines on the other side is also set aside when it sits inside a run of such lines, as
    xdiff does: it changes which of several equally short diffs is printed.
    """
    other_counts: dict[int, int] = {}
    for cls in other.classes:
        other_counts[cls] = other_counts.get(cls, 0) + 1
    limit = min(_bogo_sqrt(side.count), _MAX_EQUAL_LIMIT)
    # 0: no match on the other side, 1: some, 2: very many
    matches = bytearray(side.count + 1)
    for index in range(start, end + 1):
        found = other_counts.get(side.classes[index], 0)
        matches[index] = 0 if found == 0 else 2 if found >= limit else 1
    return [
        index
        for index in range(start, end + 1)
        if matches[index] == 1
        or (matches[index] == 2 and not _inside_discarded_run(matches, index, start, end))
    ]


def _inside_discarded_run(matches: bytearray, index: int, start: int, end: int) -> bool:
    start = max(start, index - _SIMILAR_SCAN_WINDOW)
    end = min(end, index + _SIMILAR_SCAN_WINDOW)
    unmatched_before, many_before = _scan_run(matches, index, start, -1)
    if unmatched_before == 0:
        return False
    unmatched_after, many_after = _scan_run(matches, index, end, 1)
    if unmatched_after == 0:
        return False
    unmatched = unmatched_before + unmatched_after
    many = many_before + many_after
    return many * _KEEP_DISCARD_RUN < many + unmatched


def _scan_run(matches: bytearray, index: int, bound: int, step: int) -> tuple[int, int]:
    """Count unmatched and many-matched lines next to `index` (itself counted as many)."""
    unmatched, many = 0, 1
    position = index + step
    while (position >= bound) if step < 0 else (position <= bound):
        if matches[position] == 0:
            unmatched += 1
        elif matches[position] == 2:
            many += 1
        else:
            break
        position += step
    return unmatched, many


@dataclass(slots=True)
class _Split:
    i1: int
    i2: int
    minimal_low: bool
    minimal_high: bool


class _MyersSearch:
    """Divide-and-conquer Myers search over the lines kept for searching."""

    def __init__(self, side1: _Side, keep1: list[int], side2: _Side, keep2: list[int]) -> None:
        self.side1, self.side2 = side1, side2
        self.index1, self.index2 = keep1, keep2
        self.hash1 = [side1.classes[i] for i in keep1]
        self.hash2 = [side2.classes[i] for i in keep2]
        diagonals = len(keep1) + len(keep2) + 3
        # Diagonal d lives at forward[d + offset]; d ranges over -len(keep2)-1..len(keep1)+1.
        self.offset = len(keep2) + 1
        self.forward = [0] * (diagonals + 1)
        self.backward = [0] * (diagonals + 1)
        self.max_cost = max(_bogo_sqrt(diagonals), _MAX_COST_MIN)

    def run(self) -> None:
        # An explicit stack instead of recursion: large rewrites would split deeper than
        # Python's recursion limit. Boxes are independent, so their order does not matter.
        boxes = [(0, len(self.hash1), 0, len(self.hash2), False)]
        while boxes:
            off1, lim1, off2, lim2, need_min = boxes.pop()
            off1, lim1, off2, lim2 = self._shrink(off1, lim1, off2, lim2)
            if off1 == lim1:
                for position in range(off2, lim2):
                    self.side2.set_changed(self.index2[position], True)
            elif off2 == lim2:
                for position in range(off1, lim1):
                    self.side1.set_changed(self.index1[position], True)
            else:
                split = self._split(off1, lim1, off2, lim2, need_min)
                boxes.append((split.i1, lim1, split.i2, lim2, split.minimal_high))
                boxes.append((off1, split.i1, off2, split.i2, split.minimal_low))

    def _shrink(self, off1: int, lim1: int, off2: int, lim2: int) -> tuple[int, int, int, int]:
        hash1, hash2 = self.hash1, self.hash2
        while off1 < lim1 and off2 < lim2 and hash1[off1] == hash2[off2]:
            off1 += 1
            off2 += 1
        while off1 < lim1 and off2 < lim2 and hash1[lim1 - 1] == hash2[lim2 - 1]:
            lim1 -= 1
            lim2 -= 1
        return off1, lim1, off2, lim2

    def _split(self, off1: int, lim1: int, off2: int, lim2: int, need_min: bool) -> _Split:
        """Where the shortest edit path crosses the middle diagonal, or a good-enough point."""
        hash1, hash2 = self.hash1, self.hash2
        kf, kb, o = self.forward, self.backward, self.offset
        dmin, dmax = off1 - lim2, lim1 - off2
        fmid, bmid = off1 - off2, lim1 - lim2
        odd = (fmid - bmid) & 1
        fmin = fmax = fmid
        bmin = bmax = bmid
        kf[fmid + o] = off1
        kb[bmid + o] = lim1
        cost = 0
        while True:
            cost += 1
            got_snake = False
            if fmin > dmin:
                fmin -= 1
                kf[fmin - 1 + o] = -1
            else:
                fmin += 1
            if fmax < dmax:
                fmax += 1
                kf[fmax + 1 + o] = -1
            else:
                fmax -= 1
            for d in range(fmax, fmin - 1, -2):
                if kf[d - 1 + o] >= kf[d + 1 + o]:
                    i1 = kf[d - 1 + o] + 1
                else:
                    i1 = kf[d + 1 + o]
                before = i1
                i2 = i1 - d
                while i1 < lim1 and i2 < lim2 and hash1[i1] == hash2[i2]:
                    i1 += 1
                    i2 += 1
                if i1 - before > _SNAKE_COUNT:
                    got_snake = True
                kf[d + o] = i1
                if odd and bmin <= d <= bmax and kb[d + o] <= i1:
                    return _Split(i1, i2, True, True)

            if bmin > dmin:
                bmin -= 1
                kb[bmin - 1 + o] = _LINE_MAX
            else:
                bmin += 1
            if bmax < dmax:
                bmax += 1
                kb[bmax + 1 + o] = _LINE_MAX
            else:
                bmax -= 1
            for d in range(bmax, bmin - 1, -2):
                if kb[d - 1 + o] < kb[d + 1 + o]:
                    i1 = kb[d - 1 + o]
                else:
                    i1 = kb[d + 1 + o] - 1
                before = i1
                i2 = i1 - d
                while i1 > off1 and i2 > off2 and hash1[i1 - 1] == hash2[i2 - 1]:
                    i1 -= 1
                    i2 -= 1
                if before - i1 > _SNAKE_COUNT:
                    got_snake = True
                kb[d + o] = i1
                if not odd and fmin <= d <= fmax and i1 <= kf[d + o]:
                    return _Split(i1, i2, True, True)

            if need_min:
                continue
            if got_snake and cost > _HEURISTIC_MIN_COST:
                found = self._promising_forward(off1, lim1, off2, lim2, fmin, fmax, fmid, cost)
                if found is None:
                    found = self._promising_backward(
                        off1, lim1, off2, lim2, bmin, bmax, bmid, cost
                    )
                if found is not None:
                    return found
            if cost >= self.max_cost:
                return self._furthest_reaching(off1, lim1, off2, lim2, fmin, fmax, bmin, bmax)

    def _promising_forward(
        self, off1: int, lim1: int, off2: int, lim2: int, fmin: int, fmax: int, fmid: int, cost: int
    ) -> _Split | None:
        hash1, hash2, kf, o = self.hash1, self.hash2, self.forward, self.offset
        best = 0
        found: _Split | None = None
        for d in range(fmax, fmin - 1, -2):
            distance = d - fmid if d > fmid else fmid - d
            i1 = kf[d + o]
            i2 = i1 - d
            value = (i1 - off1) + (i2 - off2) - distance
            if (
                value > _K_HEURISTIC * cost
                and value > best
                and off1 + _SNAKE_COUNT <= i1 < lim1
                and off2 + _SNAKE_COUNT <= i2 < lim2
            ):
                k = 1
                while hash1[i1 - k] == hash2[i2 - k]:
                    if k == _SNAKE_COUNT:
                        best = value
                        found = _Split(i1, i2, True, False)
                        break
                    k += 1
        return found

    def _promising_backward(
        self, off1: int, lim1: int, off2: int, lim2: int, bmin: int, bmax: int, bmid: int, cost: int
    ) -> _Split | None:
        hash1, hash2, kb, o = self.hash1, self.hash2, self.backward, self.offset
        best = 0
        found: _Split | None = None
        for d in range(bmax, bmin - 1, -2):
            distance = d - bmid if d > bmid else bmid - d
            i1 = kb[d + o]
            i2 = i1 - d
            value = (lim1 - i1) + (lim2 - i2) - distance
            if (
                value > _K_HEURISTIC * cost
                and value > best
                and off1 < i1 <= lim1 - _SNAKE_COUNT
                and off2 < i2 <= lim2 - _SNAKE_COUNT
            ):
                k = 0
                while hash1[i1 + k] == hash2[i2 + k]:
                    if k == _SNAKE_COUNT - 1:
                        best = value
                        found = _Split(i1, i2, False, True)
                        break
                    k += 1
        return found

    def _furthest_reaching(
        self, off1: int, lim1: int, off2: int, lim2: int, fmin: int, fmax: int, bmin: int, bmax: int
    ) -> _Split:
        """The search got too expensive: take whichever half-path got furthest."""
        kf, kb, o = self.forward, self.backward, self.offset
        forward_best, forward_i1 = -1, -1
        for d in range(fmax, fmin - 1, -2):
            i1 = min(kf[d + o], lim1)
            i2 = i1 - d
            if lim2 < i2:
                i1, i2 = lim2 + d, lim2
            if forward_best < i1 + i2:
                forward_best, forward_i1 = i1 + i2, i1
        backward_best, backward_i1 = _LINE_MAX, _LINE_MAX
        for d in range(bmax, bmin - 1, -2):
            i1 = max(off1, kb[d + o])
            i2 = i1 - d
            if i2 < off2:
                i1, i2 = off2 + d, off2
            if i1 + i2 < backward_best:
                backward_best, backward_i1 = i1 + i2, i1
        if (lim1 + lim2) - backward_best < forward_best - (off1 + off2):
            return _Split(forward_i1, forward_best - forward_i1, True, False)
        return _Split(backward_i1, backward_best - backward_i1, False, True)


# ---------------------------------------------------------------------------
# Sliding change groups to git's canonical place
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Group:
    """Changed lines [start, end) of one side; empty (start == end) between unchanged lines."""

    start: int
    end: int


def _first_group(side: _Side) -> _Group:
    group = _Group(0, 0)
    while side.is_changed(group.end):
        group.end += 1
    return group


def _next_group(side: _Side, group: _Group) -> bool:
    if group.end == side.count:
        return False
    group.start = group.end + 1
    group.end = group.start
    while side.is_changed(group.end):
        group.end += 1
    return True


def _previous_group(side: _Side, group: _Group) -> bool:
    if group.start == 0:
        return False
    group.end = group.start - 1
    group.start = group.end
    while side.is_changed(group.start - 1):
        group.start -= 1
    return True


def _slide_down(side: _Side, group: _Group) -> bool:
    if group.end < side.count and side.classes[group.start] == side.classes[group.end]:
        side.set_changed(group.start, False)
        side.set_changed(group.end, True)
        group.start += 1
        group.end += 1
        while side.is_changed(group.end):
            group.end += 1
        return True
    return False


def _slide_up(side: _Side, group: _Group) -> bool:
    if group.start > 0 and side.classes[group.start - 1] == side.classes[group.end - 1]:
        group.start -= 1
        group.end -= 1
        side.set_changed(group.start, True)
        side.set_changed(group.end, False)
        while side.is_changed(group.start - 1):
            group.start -= 1
        return True
    return False


class DiffInvariantError(AssertionError):
    """The two sides' change groups fell out of step: a bug in this module, never input."""


def _compact(side: _Side, other: _Side) -> None:
    """Slide each group of `side` to where git would print it, merging groups it meets."""
    group = _first_group(side)
    other_group = _first_group(other)
    while True:
        if group.end != group.start:
            _place_group(side, group, other, other_group)
        if not _next_group(side, group):
            break
        if not _next_group(other, other_group):
            raise DiffInvariantError("group sync broken moving to next group")
    if _next_group(other, other_group):
        raise DiffInvariantError("group sync broken at end of file")


def _place_group(side: _Side, group: _Group, other: _Side, other_group: _Group) -> None:
    while True:
        size = group.end - group.start
        end_matching_other = -1
        while _slide_up(side, group):
            _step(_previous_group(other, other_group), "sliding up")
        earliest_end = group.end
        if other_group.end > other_group.start:
            end_matching_other = group.end
        while _slide_down(side, group):
            _step(_next_group(other, other_group), "sliding down")
            if other_group.end > other_group.start:
                end_matching_other = group.end
        if size == group.end - group.start:
            break

    if group.end == earliest_end:
        return
    if end_matching_other != -1:
        # Line the group up with the last change on the other side it can meet, so a
        # replaced block prints as one -/+ pair instead of two half-changes.
        while other_group.end == other_group.start:
            _step(_slide_up(side, group), "match disappeared")
            _step(_previous_group(other, other_group), "sliding to match")
        return
    best_end = _best_indent_split(side, group, earliest_end, size)
    while group.end > best_end:
        _step(_slide_up(side, group), "best shift unreached")
        _step(_previous_group(other, other_group), "sliding to best shift")


def _step(moved: bool, what: str) -> None:
    if not moved:
        raise DiffInvariantError(f"group sync broken {what}")


def _best_indent_split(side: _Side, group: _Group, earliest_end: int, size: int) -> int:
    """git's indent heuristic: the group end (at most 100 lines up) whose two splits score best."""
    shift = max(earliest_end, group.end - size - 1, group.end - _INDENT_MAX_SLIDING)
    best_end = -1
    best: tuple[int, int] = (0, 0)
    indents = _IndentCache(side)
    while shift <= group.end:
        score = _add_split_score(indents, shift, (0, 0))
        score = _add_split_score(indents, shift - size, score)
        if best_end == -1 or _compare_scores(score, best) <= 0:
            best, best_end = score, shift
        shift += 1
    return best_end


class _IndentCache:
    __slots__ = ("known", "side")

    def __init__(self, side: _Side) -> None:
        self.side = side
        self.known: dict[int, int] = {}

    def __call__(self, index: int) -> int:
        indent = self.known.get(index)
        if indent is None:
            indent = self.known[index] = _indent(self.side.lines[index])
        return indent


def _indent(line: str) -> int:
    """Columns of leading space (tab = to the next multiple of 8); -1 for a blank line."""
    width = 0
    for char in line:
        if char not in _GIT_SPACE:
            return width
        if char == " ":
            width += 1
        elif char == "\t":
            width += 8 - width % 8
        if width >= _MAX_INDENT:
            return _MAX_INDENT
    return -1


def _add_split_score(
    indent_of: _IndentCache, split: int, score: tuple[int, int]
) -> tuple[int, int]:
    """Add the (effective indent, penalty) of splitting the file just above line `split`."""
    count = indent_of.side.count
    end_of_file = split >= count
    indent = -1 if end_of_file else indent_of(split)

    pre_blank, pre_indent = 0, -1
    for index in range(split - 1, -1, -1):
        pre_indent = indent_of(index)
        if pre_indent != -1:
            break
        pre_blank += 1
        if pre_blank == _MAX_BLANKS:
            pre_indent = 0
            break

    post_blank, post_indent = 0, -1
    for index in range(split + 1, count):
        post_indent = indent_of(index)
        if post_indent != -1:
            break
        post_blank += 1
        if post_blank == _MAX_BLANKS:
            post_indent = 0
            break

    effective, penalty = score
    if pre_indent == -1 and pre_blank == 0:
        penalty += _START_OF_FILE_PENALTY
    if end_of_file:
        penalty += _END_OF_FILE_PENALTY
    blank_after = 1 + post_blank if indent == -1 else 0
    total_blank = pre_blank + blank_after
    penalty += _TOTAL_BLANK_WEIGHT * total_blank + _POST_BLANK_WEIGHT * blank_after
    if indent == -1:
        indent = post_indent
    any_blanks = total_blank != 0
    effective += indent
    if indent == -1 or pre_indent == -1:
        pass
    elif indent > pre_indent:
        penalty += _RELATIVE_INDENT_WITH_BLANK_PENALTY if any_blanks else _RELATIVE_INDENT_PENALTY
    elif indent < pre_indent:
        if post_indent != -1 and post_indent > indent:
            penalty += (
                _RELATIVE_OUTDENT_WITH_BLANK_PENALTY if any_blanks else _RELATIVE_OUTDENT_PENALTY
            )
        else:
            penalty += (
                _RELATIVE_DEDENT_WITH_BLANK_PENALTY if any_blanks else _RELATIVE_DEDENT_PENALTY
            )
    return effective, penalty


def _compare_scores(first: tuple[int, int], second: tuple[int, int]) -> int:
    indents = (first[0] > second[0]) - (first[0] < second[0])
    return _INDENT_WEIGHT * indents + (first[1] - second[1])


# ---------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Change:
    """Lines [i1, i1+count1) of the old file replaced by [i2, i2+count2) of the new one."""

    i1: int
    i2: int
    count1: int
    count2: int


def _edit_script(side1: _Side, side2: _Side) -> list[_Change]:
    changes: list[_Change] = []
    i1, i2 = side1.count, side2.count
    while i1 >= 0 or i2 >= 0:
        if side1.is_changed(i1 - 1) or side2.is_changed(i2 - 1):
            end1, end2 = i1, i2
            while side1.is_changed(i1 - 1):
                i1 -= 1
            while side2.is_changed(i2 - 1):
                i2 -= 1
            changes.append(_Change(i1, i2, end1 - i1, end2 - i2))
        i1 -= 1
        i2 -= 1
    changes.reverse()
    return changes


def _hunk_groups(changes: list[_Change]) -> list[list[_Change]]:
    """Changes at most 2 × context lines apart print as one hunk."""
    groups: list[list[_Change]] = []
    for change in changes:
        if groups:
            last = groups[-1][-1]
            if change.i1 - (last.i1 + last.count1) <= 2 * CONTEXT_LINES:
                groups[-1].append(change)
                continue
        groups.append([change])
    return groups


def _emit_hunks(lines1: list[str], lines2: list[str], changes: list[_Change]) -> list[str]:
    out: list[str] = []
    funcname = ""
    searched_down_to = 0
    for group in _hunk_groups(changes):
        first, last = group[0], group[-1]
        start1 = max(first.i1 - CONTEXT_LINES, 0)
        start2 = max(first.i2 - CONTEXT_LINES, 0)
        after = min(
            CONTEXT_LINES,
            len(lines1) - (last.i1 + last.count1),
            len(lines2) - (last.i2 + last.count2),
        )
        end1 = last.i1 + last.count1 + after
        end2 = last.i2 + last.count2 + after
        # The nearest funcname line above the hunk; lines above the previous hunk's
        # start were searched already, so an earlier find still stands.
        found = _funcname_above(lines1, start1, searched_down_to)
        if found is not None:
            funcname = found
        searched_down_to = start1
        out.append(_hunk_header(start1, end1 - start1, start2, end2 - start2, funcname))

        position1 = start1
        for change in group:
            out.extend(_prefixed(" ", lines1[position1 : change.i1]))
            out.extend(_prefixed("-", lines1[change.i1 : change.i1 + change.count1]))
            out.extend(_prefixed("+", lines2[change.i2 : change.i2 + change.count2]))
            position1 = change.i1 + change.count1
        out.extend(_prefixed(" ", lines1[position1:end1]))
    return out


def _funcname_above(lines: list[str], start: int, stop: int) -> str | None:
    for index in range(start - 1, stop - 1, -1):
        name = funcname_of(lines[index])
        if name is not None:
            return name
    return None


def funcname_of(line: str) -> str | None:
    """git's default funcname rule: lines starting with a letter, `_` or `$`, cut to 80 bytes.

    As git does, trailing whitespace is trimmed from the cut bytes first, and then a
    multi-byte character the cut split is dropped whole (the text is valid UTF-8, so the
    cut is the only place a broken sequence can be).
    """
    if not line or not (("a" <= line[0] <= "z") or ("A" <= line[0] <= "Z") or line[0] in "_$"):
        return None
    raw = line.encode("utf-8")[:FUNCNAME_BYTES].rstrip(_GIT_SPACE_BYTES)
    return raw.decode("utf-8", errors="ignore")


def _hunk_header(start1: int, count1: int, start2: int, count2: int, funcname: str) -> str:
    header = f"@@ -{_range(start1, count1)} +{_range(start2, count2)} @@"
    return f"{header} {funcname}\n" if funcname else f"{header}\n"


def _range(start: int, count: int) -> str:
    """git's `start,count`: 1-based start (the line before, for an empty range); `,1` omitted."""
    first = start + 1 if count else start
    return str(first) if count == 1 else f"{first},{count}"


def _prefixed(prefix: str, lines: list[str]) -> list[str]:
    return [
        prefix + line if line.endswith("\n") else f"{prefix}{line}\n{NO_NEWLINE_MARKER}"
        for line in lines
    ]
