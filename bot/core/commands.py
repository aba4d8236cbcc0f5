"""`/klaud` commands in issue and pull-request comments (DESIGN §4 "Commands"), pure parts.

Parsing, permission checks, target resolution and the Markdown replies live here; the
issue_comment handler does the I/O (reaction, permission lookup, store writes, replies).
Every verb is declared once in `VERBS`, with its usage and help text, so the help reply,
the check-run summary and the permission rule cannot drift apart.

Replies never @-mention anyone (domain §6.1) and show user-typed text inside code spans,
so a hold reason cannot ping people or inject Markdown.
"""

from __future__ import annotations

import difflib
import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType

from bot.core.cooldown import human_time
from bot.core.domain import (
    CANDIDATE_RE,
    FAMILY_RE,
    Attempt,
    Blocked,
    Decision,
    Family,
    Hold,
    Overlap,
    code_span,
)

GITHUB_WEB = "https://github.com"
# A status reply shows this many attempts; older ones are summarised in one line.
STATUS_ATTEMPTS_SHOWN = 20
# Family keys offered for a target that names none.
SUGGESTIONS = 3


@dataclass(frozen=True, slots=True)
class Verb:
    name: str
    usage: str
    help: str
    needs_write: bool
    takes_text: bool = False  # free text after the target (a hold's reason)


_TARGET_HELP = (
    "The target is a family id, a family key alone when it is unique across master configs, "
    "or a candidate id; on a Klaud pull request it defaults to its family, and on another pull "
    "request `status` answers for the families it overlaps."
)

VERBS: Mapping[str, Verb] = MappingProxyType(
    {
        verb.name: verb
        for verb in (
            Verb(
                "retry",
                "/klaud retry [target]",
                "clear the cooldown of the target's current candidate once, for the next wave",
                needs_write=True,
            ),
            Verb(
                "hold",
                "/klaud hold [target] [reason]",
                "keep the family out of every wave until it is released",
                needs_write=True,
                takes_text=True,
            ),
            Verb(
                "unhold",
                "/klaud unhold [target]",
                "release a hold",
                needs_write=True,
            ),
            Verb(
                "resume",
                "/klaud resume",
                "after a dispatch pause: arm a canary, the next wave dispatches one candidate and "
                "its outcome resumes dispatch",
                needs_write=True,
            ),
            Verb(
                "status",
                "/klaud status [target]",
                "show the family's candidate, attempts, cooldown, overlaps, hold and "
                "what the next wave would decide",
                needs_write=False,
            ),
            Verb("help", "/klaud help", "list these commands", needs_write=False),
        )
    }
)

# Highest first. `maintain` and `triage` only appear in the API's `role_name`.
_PERMISSION_RANK = {"none": 0, "read": 1, "triage": 2, "write": 3, "maintain": 4, "admin": 5}
_WRITE_RANK = _PERMISSION_RANK["write"]


@dataclass(frozen=True, slots=True)
class Command:
    """One `/klaud` line of a comment.

    `verb` is lower-cased for known verbs and kept as typed (possibly empty) otherwise.
    `line` is the 1-based line of the comment body it was found on.
    """

    verb: str
    target: str | None
    text: str
    line: int
    unknown: bool = False

    @property
    def spec(self) -> Verb | None:
        return VERBS.get(self.verb)

    def as_typed(self) -> str:
        return " ".join(part for part in ("/klaud", self.verb, self.target, self.text) if part)


@dataclass(frozen=True, slots=True)
class Resolved:
    """The family a command acts on, or a reason for people why there is none."""

    family: str | None = None
    error: str | None = None
    text: str | None = None  # the free text left once a family key was taken from it


@dataclass(frozen=True, slots=True)
class StatusView:
    """What `/klaud status` reports about one family (the next decision comes from a dry plan)."""

    family: Family
    staleness: datetime | None  # the family's image_changed_at
    attempts: Sequence[Attempt]  # the current candidate's attempts, newest first
    cooldown_reason: str
    cooldown_until: datetime | None
    overlaps: Sequence[Overlap]
    hold: Hold | None
    next_decision: Decision
    next_wave_at: datetime | None
    repo: str | None = None  # owner/name; when set, attempts link to their runs
    web_url: str = GITHUB_WEB
    blocked: Blocked | None = None  # a dispatch pause or a setup error of the repository


# ---------------------------------------------------------------------------- parsing

# ASCII: under IGNORECASE alone the Kelvin sign (U+212A) would match the `k`.
_COMMAND_RE = re.compile(r"^/klaud(?:\s+(?P<verb>\S+))?(?:\s+(?P<rest>.*))?$", re.IGNORECASE | re.ASCII)
# Markdown's line endings only: str.splitlines also breaks at U+2028, U+0085 or a form feed,
# which GitHub shows inside a line.
_LINE_BREAK_RE = re.compile(r"\r\n|\r|\n")
_BACKTICKS_RE = re.compile(r"`+")
# A setext heading's underline: it ends the paragraph above it (as its heading).
_SETEXT_RE = re.compile(r"^ {0,3}(?:=+|-+)[ \t]*$")
# An HTML comment starting a line (CommonMark's HTML block 2) hides every line up to `-->`.
_HTML_COMMENT_RE = re.compile(r"^ {0,3}<!--")
_LIST_MARKER_RE = re.compile(r"^ {0,3}(?:[-*+]|\d{1,9}[.)])[ \t]+")
_FENCE_OPEN_RE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_QUOTE_RE = re.compile(r"^ {0,3}>")
_QUOTE_MARKERS_RE = re.compile(r"^(?: {0,3}> ?)+")
# What may interrupt a paragraph (CommonMark 0.31) besides a fence and a quote: an ATX
# heading or a thematic break (which hold no paragraph) and a list item with content (an
# ordered one only from 1).
_HEADING_OR_BREAK_RE = re.compile(r"^ {0,3}(?:#{1,6}(?:[ \t]|$)|(?:-[ \t]*){3,}$|(?:\*[ \t]*){3,}$|(?:_[ \t]*){3,}$)")
_LIST_ITEM_RE = re.compile(r"^ {0,3}(?:[-*+]|1[.)])[ \t]+\S")


def parse_commands(body: str) -> list[Command]:
    """Every `/klaud` line of a Markdown comment body, in order.

    Lines inside fenced code blocks (``` or ~~~), indented code blocks and quotes (`>`) are
    not commands: quoting or showing a command must not run it again. Following CommonMark,
    a line indented four or more columns is code only when it does not continue a
    paragraph; an unclosed fence runs to the end of the comment; a line right after a
    quoted paragraph, without its own `>`, continues the quote (GitHub shows it quoted)
    unless it starts a block that interrupts a paragraph.
    """
    commands: list[Command] = []
    fence: str | None = None  # the opening fence while inside a fenced block
    fence_quoted = False  # that block is inside a quote
    fence_column = 0  # the content column of the list item that block opened in (0: none)
    paragraph_open = False  # an indented line right after text continues that text
    quoted_paragraph = False  # the paragraph open is inside a quote
    html_comment = False  # inside an HTML comment that started a line
    hidden_until = 0  # the last line of an HTML comment opened inside a paragraph
    unclosed_until = 0  # where the paragraph ended that left the last one opened unclosed
    lines = _LINE_BREAK_RE.split(body)
    for number, raw in enumerate(lines, start=1):
        line = raw.expandtabs(4)
        if number <= hidden_until:
            if number == hidden_until and opens_a_comment(line[line.index("-->") + 3:]):
                hidden_until, unclosed_until = _comment_end(lines, number)  # `--> and <!-- another`
            continue
        if html_comment:
            html_comment = "-->" not in line
            continue
        quoted = bool(_QUOTE_RE.match(line))
        text = _QUOTE_MARKERS_RE.sub("", line, count=1) if quoted else line
        # A line without `>` ends a quote and a block fenced in it (no lazy continuation); a
        # line left of a list item's content ends the item and a block fenced in it.
        if fence is not None and (quoted or not fence_quoted) and not _leaves_item(line, fence_column):
            if closes_fence((text if fence_quoted else line)[fence_column:], fence):
                fence = None
            continue
        fence = None
        if not line.strip():
            paragraph_open = quoted_paragraph = False
            continue
        if quoted:
            fence, fence_quoted = fence_opened(text), True
            paragraph_open = quoted_paragraph = fence is None and _is_paragraph_text(text)
            continue
        if quoted_paragraph and not _interrupts_paragraph(line):
            continue
        quoted_paragraph = False
        indent = len(line) - len(line.lstrip(" "))
        if indent >= 4 and not paragraph_open:
            continue
        if _HTML_COMMENT_RE.match(line):
            # Its own line may end it: `<!-->` and `<!-- a -->` are whole comments.
            html_comment = "-->" not in line[line.index("<!--") + 2:]
            paragraph_open = False
            continue
        # A fence may open a list item too (`- ```…`): its lines are code as far as the
        # item goes, to the left edge of its content.
        marker = _LIST_MARKER_RE.match(line)
        fence, fence_quoted = fence_opened(line[marker.end():] if marker else line), False
        fence_column = marker.end() if marker and fence else 0
        if fence is not None:
            paragraph_open = False
            continue
        # A heading or a thematic break holds no paragraph: an indented line after it is code.
        paragraph_open = not _HEADING_OR_BREAK_RE.match(line)
        command = _parse_command_line(line.strip(), number)
        if command is not None:
            commands.append(command)
        # A comment the paragraph does not close leaves every line of it as it is: another
        # opened in one of them is not looked for again (thousands of `a <!--` lines in one
        # paragraph took minutes, each scanning to its end).
        if paragraph_open and number >= unclosed_until and opens_a_comment(line):
            hidden_until, unclosed_until = _comment_end(lines, number)
    return commands


def _backtick_runs(line: str) -> tuple[list[tuple[int, int]], dict[int, list[int]]]:
    """The runs of backticks of `line` (start, end), and by length the indexes of the runs
    of that length, in order (a span opened by a run is closed by the next run of its
    length)."""
    runs = [match.span() for match in _BACKTICKS_RE.finditer(line)]
    by_length: dict[int, list[int]] = {}
    for index, (start, end) in enumerate(runs):
        by_length.setdefault(end - start, []).append(index)
    return runs, by_length


def _escaped(line: str, at: int) -> bool:
    """Whether the character at `at` follows an odd number of backslashes (a literal one)."""
    before = at
    while before and line[before - 1] == "\\":
        before -= 1
    return (at - before) % 2 == 1


def opens_a_comment(line: str) -> bool:
    """Whether paragraph text `line` leaves an HTML comment open: read left to right, a
    comment or a code span, whichever starts first, hides what follows up to its end (a
    `<!--` in a code span opens nothing, a backtick in a comment opens no span). Outside a
    span a backslash escapes the character after it (`\\<!--`, `\\``); inside one it does not."""
    runs, by_length = _backtick_runs(line)
    at, run, opener = 0, 0, line.find("<!--")
    while opener >= 0:
        while run < len(runs) and runs[run][0] < at:
            run += 1
        if run == len(runs) or opener < runs[run][0]:
            if _escaped(line, opener):
                at = opener + 1
            else:
                end = line.find("-->", opener + 2)
                if end < 0:
                    return True
                at = end + 3
        else:
            start, end = runs[run]
            length = end - start - (1 if _escaped(line, start) else 0)
            later = by_length.get(length, [])
            closer = later[bisect_right(later, run)] if length and bisect_right(later, run) < len(later) else None
            at = end if closer is None else runs[closer][1]
            run += 1
        if opener < at:
            opener = line.find("<!--", at)
    return False


def _comment_end(lines: list[str], number: int) -> tuple[int, int]:
    """(the number of the line that closes the comment line `number` opened inside a
    paragraph, 0 when the paragraph ends first; the line where the paragraph ended then).
    CommonMark: such a comment spans the paragraph's next lines, and GitHub shows none of
    it; one the paragraph does not close is text."""
    for later in range(number + 1, len(lines) + 1):
        line = lines[later - 1].expandtabs(4)
        if not line.strip() or _QUOTE_RE.match(line) or _interrupts_paragraph(line) or _SETEXT_RE.match(line):
            return 0, later
        if "-->" in line:
            return later, 0
    return 0, len(lines) + 1


def _leaves_item(line: str, content_column: int) -> bool:
    """Whether `line` ends the list item whose content starts at `content_column`."""
    return content_column > 0 and bool(line.strip()) and len(line) - len(line.lstrip(" ")) < content_column


def _is_paragraph_text(text: str) -> bool:
    """Whether a quote line's `text` (neither in nor opening a fenced block) is paragraph
    text, which the next line may continue without its own `>` (CommonMark's lazy
    continuation); blank, a heading, a thematic break or code is not."""
    if not text.strip() or len(text) - len(text.lstrip(" ")) >= 4:
        return False
    return not _HEADING_OR_BREAK_RE.match(text)


def _interrupts_paragraph(line: str) -> bool:
    return bool(
        _HEADING_OR_BREAK_RE.match(line) or _LIST_ITEM_RE.match(line) or fence_opened(line)
        or _HTML_COMMENT_RE.match(line)
    )


def fence_opened(line: str) -> str | None:
    """The fence `line` opens, if it opens one. CommonMark: a backtick fence's info string
    cannot hold a backtick (the line is inline code then), a tilde fence's can."""
    opening = _FENCE_OPEN_RE.match(line)
    if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
        return None
    return opening["fence"]


def closes_fence(line: str, fence: str) -> bool:
    stripped = line.rstrip()
    indent = len(stripped) - len(stripped.lstrip(" "))
    marker = stripped.lstrip(" ")
    return (
        indent <= 3
        and len(marker) >= len(fence)
        and set(marker) == {fence[0]}
    )


def _parse_command_line(line: str, number: int) -> Command | None:
    match = _COMMAND_RE.match(line)
    if match is None:
        return None
    typed_verb = match["verb"] or ""
    rest = (match["rest"] or "").strip()
    verb = typed_verb.lower()
    unknown = verb not in VERBS
    words = rest.split(maxsplit=1)
    if words and _looks_like_target(words[0]):
        target, text = words[0], words[1] if len(words) > 1 else ""
    else:
        target, text = None, rest
    if len(text) > MAX_TEXT:
        # A hold's reason is kept with the hold and shown on every check run and dashboard.
        text = text[: MAX_TEXT - 1] + "…"
    return Command(
        verb=typed_verb if unknown else verb,
        target=target,
        text=text,
        line=number,
        unknown=unknown,
    )


MAX_TEXT = 300  # characters of free text after a command's target (a hold's reason)


def _looks_like_target(word: str) -> bool:
    return bool(FAMILY_RE.match(word) or CANDIDATE_RE.match(word))


# ------------------------------------------------------------------------- permission


def effective_permission(permission: str | None, role_name: str | None) -> str | None:
    """The stronger of the collaborator API's `permission` and `role_name`.

    `permission` only says admin/write/read/none, so a maintainer shows up as `write` there
    and as `maintain` in `role_name`; custom role names are ignored (their base level is
    what `permission` reports).
    """
    known = [p.lower() for p in (permission, role_name) if p and p.lower() in _PERMISSION_RANK]
    return max(known, key=_PERMISSION_RANK.__getitem__) if known else None


def permission_allows(verb: str, permission: str | None) -> bool:
    """Whether a user with `permission` may run `verb`; unknown verbs only answer with help."""
    spec = VERBS.get(verb.lower())
    if spec is None or not spec.needs_write:
        return True
    rank = _PERMISSION_RANK.get((permission or "").lower(), 0)
    return rank >= _WRITE_RANK


# ----------------------------------------------------------------------------- target


def resolve_target(
    target: str | None,
    *,
    families: Mapping[str, Family],
    default_family: str | None,
) -> Resolved:
    """The family a command names (family id, a key unique across master configs, or a
    current candidate id), else why not, with the closest keys for a typo.

    `default_family` is the family of the Klaud pull request the comment is on, if any.
    """
    if target is None:
        if default_family is None:
            return Resolved(error="this is not a Klaud pull request: name a family")
        return _known_family(default_family, families)
    if FAMILY_RE.match(target):
        return _known_family(target, families)
    if CANDIDATE_RE.match(target):
        return _family_of_candidate(target, families)
    return _family_of_key(target, families)


def _family_of_key(key: str, families: Mapping[str, Family]) -> Resolved:
    matching = sorted(f.id for f in families.values() if f.key == key)
    if len(matching) == 1:
        return Resolved(family=matching[0])
    if matching:
        ids = ", ".join(code_span(f) for f in matching)
        return Resolved(error=f"{code_span(key)} is a key in several master configs ({ids}): name the family id")
    return Resolved(error=f"{code_span(key)} is not a family, family key or candidate id" + _did_you_mean(key, families))


def _did_you_mean(name: str, families: Mapping[str, Family]) -> str:
    key = name.rpartition(":")[2]
    keys = sorted({f.key for f in families.values()})
    # A fragment ("h200") is close to no key by difflib's measure: the keys holding it. A
    # word far from every key ("please") gets none: three arbitrary keys would mislead.
    closest = (
        difflib.get_close_matches(key, keys, n=SUGGESTIONS, cutoff=0.5)
        or [k for k in keys if key.lower() in k.lower()][:SUGGESTIONS]
    )
    if not closest:
        return ""
    return "; did you mean " + ", ".join(code_span(k) for k in closest) + "?"


def resolve_command(
    command: Command,
    *,
    families: Mapping[str, Family],
    default_family: str | None,
) -> Resolved:
    """`resolve_target` for a parsed command.

    For verbs without free text the first word is the target whatever it looks like, so a
    mistyped id is refused instead of silently falling back to the pull request's family.
    """
    spec = command.spec
    if command.target is None and command.text and spec is not None:
        # Split as the command line was (any Unicode space): a key then the reason after a
        # no-break space held the PR's own family, with "KEY reason" as the reason.
        first, *others = command.text.split(maxsplit=1)
        rest = others[0] if others else ""
        if not spec.takes_text:
            return resolve_target(first, families=families, default_family=default_family)
        if any(f.key == first for f in families.values()):
            # `/klaud hold dsr1-fp8-h200-trt new weights`: a family key, then the reason.
            return replace(resolve_target(first, families=families, default_family=None), text=rest.strip())
    return resolve_target(command.target, families=families, default_family=default_family)


def _known_family(family: str, families: Mapping[str, Family]) -> Resolved:
    if family in families:
        return Resolved(family=family)
    return Resolved(error=f"unknown family {code_span(family)}" + _did_you_mean(family, families))


def _family_of_candidate(candidate: str, families: Mapping[str, Family]) -> Resolved:
    for family in families.values():
        if family.candidate == candidate:
            return Resolved(family=family.id)
    fam16 = candidate.split("-")[0]
    for family in families.values():
        if family.family_hash == fam16:
            return Resolved(
                error=f"candidate {code_span(candidate)} is not the current candidate of any "
                f"family: {code_span(family.id)} is now at {code_span(family.candidate)}"
            )
    return Resolved(
        error=f"candidate {code_span(candidate)} is not the current candidate of any family"
    )


# ---------------------------------------------------------------------------- markers

_MARKER_RE = re.compile(r"<!-- klaud-command:(\d+) -->")
# A comment body GitHub accepts (it answers 422 above 65,536 characters).
COMMENT_LIMIT = 65_536
CLIPPED = "\n\n… (reply truncated: GitHub's comment size limit)"
# Each command may write (a hold, an approval) and look things up: a comment of thousands
# of `/klaud` lines, which anyone may post, must not run thousands.
MAX_COMMANDS_PER_COMMENT = 10


def reply_marker(comment_id: int) -> str:
    return f"<!-- klaud-command:{comment_id} -->"


def answered_comments(comment_bodies: Iterable[str]) -> set[int]:
    """The command comments that already have their reply (a redelivery must not answer twice)."""
    return {int(match[1]) for body in comment_bodies if (match := _MARKER_RE.search(body))}


def compose_reply(comment_id: int, answers: Sequence[tuple[Command, str]], *, not_run: int = 0) -> str:
    """One reply to a comment, answering each of its commands in order.

    Commands are idempotent (a hold, a retry approval, …), so a comment is answered once,
    after all its commands ran: a redelivery finds the marker and posts nothing more.
    `not_run` counts the commands past MAX_COMMANDS_PER_COMMENT. The reply is clipped to
    GitHub's comment limit, which refuses a longer one (422) and the person would get no
    answer at all; the marker comes first, so it survives the cut.
    """
    if len(answers) == 1 and not not_run:
        return clip(_answer(reply_marker(comment_id), answers[0][1]), COMMENT_LIMIT, CLIPPED)
    parts = [reply_marker(comment_id)]
    for command, answer in answers:
        parts += [f"**{code_span(command.as_typed())}**", "", answer, ""]
    if not_run:
        parts.append(
            f"{not_run} more `/klaud` command{'s were' if not_run > 1 else ' was'} not run: "
            f"at most {MAX_COMMANDS_PER_COMMENT} are run per comment."
        )
    return clip(_answer(*parts).rstrip(), COMMENT_LIMIT, CLIPPED)


def clip(text: str, limit: int, note: str) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, `note` included, at a character boundary.

    Counted in bytes, it is as many characters or fewer: within GitHub's limit, whichever
    of the two GitHub counts.
    """
    if len(text.encode("utf-8")) <= limit:
        return text
    room = limit - len(note.encode("utf-8"))
    kept = text.encode("utf-8")[:room].decode("utf-8", errors="ignore")
    # Whole lines: every text people typed is a code span within one line, and one cut in
    # half leaves its backtick unclosed and the rest of the text read as Markdown again.
    return (kept[: kept.rindex("\n")] if "\n" in kept else kept) + note


def help_text() -> str:
    """The verbs as a Markdown list, in declaration order."""
    lines = [
        f"- `{verb.usage}`: {verb.help}"
        + (" (needs write access)" if verb.needs_write else "")
        for verb in VERBS.values()
    ]
    return "\n".join([*lines, "", _TARGET_HELP])


def render_help(*, unknown_verb: str | None = None) -> str:
    """The help reply; `unknown_verb` says what was not understood ("" when none was given)."""
    if unknown_verb is None:
        opening = "Klaud commands:"
    elif unknown_verb:
        opening = f"{code_span(unknown_verb)} is not a Klaud command. Klaud commands:"
    else:
        opening = "`/klaud` needs a verb. Klaud commands:"
    return _answer(opening, "", help_text())


def render_refusal(command: Command, why: str) -> str:
    stop = "" if why.endswith(("?", ".")) else "."  # "did you mean `x`?" ends the sentence
    return _answer(f"Not done: {code_span(command.as_typed())}: {why}{stop}")


def render_retry(
    family: str,
    candidate: str,
    cleared: bool,
    cooldown_reason: str,
    next_wave_at: datetime | None,
) -> str:
    if cleared:
        what = (
            f"Cleared the cooldown of candidate {code_span(candidate)} of {code_span(family)} "
            f"({cooldown_reason}) for the next wave only."
        )
    else:
        what = (
            f"Candidate {code_span(candidate)} of {code_span(family)} is not cooling down "
            f"({cooldown_reason}): nothing to clear."
        )
    return _answer(what, "", _next_wave(next_wave_at))


def render_retry_late(family: str, candidate: str, cooldown_reason: str) -> str:
    """A `/klaud retry` found after its webhook was lost, whose candidate began cooling down
    after it was written: that cooldown is not the one it asked to clear."""
    return _answer(
        f"Not cleared: this comment reached Klaud late, and candidate {code_span(candidate)} of "
        f"{code_span(family)} began cooling down after it was written ({cooldown_reason}). "
        "Write `/klaud retry` again to clear this cooldown."
    )


def render_resume_late(pause_reason: str, since: datetime) -> str:
    return _answer(
        f"Not resumed: this comment reached Klaud late, and dispatch was paused after it was written "
        f"({human_time(since)}: {pause_reason}). Write `/klaud resume` again to resume."
    )


def render_resume(armed: bool, pause_reason: str | None, running: str | None = None) -> str:
    if running is not None:
        return _answer(f"A canary is already running (candidate {code_span(running)}): "
                       "when its run produces an outcome, dispatch resumes.")
    if not armed:
        return _answer("Dispatch is not paused: nothing to resume.")
    return _answer(f"Canary armed. Dispatch was paused ({pause_reason}).",
        "",
        "The next wave dispatches one candidate; when its run produces an outcome, dispatch resumes.",
    )


def render_resume_disabled(reason: str, pause_reason: str | None) -> str:
    """`/klaud resume` while the policy turns dispatch off: plans say `dispatch-paused` then,
    and a canary would not run. A pause after failed runs may be there too (`pause_reason`):
    the push that turns the policy on arms its canary."""
    if pause_reason is None:
        first = f"Not resumed: dispatch is off by the policy, not paused after failed runs ({reason})."
    else:
        first = (f"Not resumed: dispatch is off by the policy ({reason}), and paused after failed runs"
                 f" ({pause_reason}); the push that turns the policy on arms a canary.")
    return _answer(
        first,
        "",
        "`/klaud resume` does not change that: `enabled` in `.github/klaud.yml` on the default branch does.",
    )


# Families one `/klaud status` on a PR answers for: a PR changing a whole master config
# overlaps hundreds of them, each answer a table (GitHub cuts a comment at 65,536 characters).
MAX_STATUS_FAMILIES = 20


def render_more_families(number: int, count: int) -> str:
    return _answer(f"PR #{number} overlaps {count} more families.", "",
                   "`/klaud status FAMILY` answers for one of them.")


def render_idle_pull(number: int, updated_at: datetime, idle_days: int) -> str:
    return _answer(
        f"PR #{number} has not been updated since {human_time(updated_at)}: idle for "
        f"{idle_days} days or more (`idle_days`), it overlaps no family and blocks no wave.",
        "",
        "Any update makes it active again. `/klaud status FAMILY` answers for one family.",
    )


def render_hold(hold: Hold) -> str:
    return _answer(f"Held {code_span(hold.family)} out of every wave: {describe_hold(hold)}.",
        "",
        f"Release it with `/klaud unhold {hold.family}`.",
    )


def render_unhold(family: str, previous_hold: Hold | None, by: str) -> str:
    if previous_hold is None:
        return _answer(f"{code_span(family)} was not held: nothing to release.")
    return _answer(f"Released {code_span(family)} (requested by {person(by)}); "
        f"it was held {describe_hold(previous_hold)}.",
        "",
        "The next wave considers it again.",
    )


def render_status(view: StatusView) -> str:
    family = view.family
    decision = view.next_decision
    facts = [
        ("Candidate", code_span(family.candidate)),
        ("Image", code_span(family.image)),
        ("Image changed", human_time(view.staleness) if view.staleness else "unknown"),
        ("Cooldown", with_until(view.cooldown_reason, view.cooldown_until)),
        ("Hold", describe_hold(view.hold) if view.hold else "none"),
        ("Overlapping PRs", _overlaps_inline(view.overlaps)),
        (
            "Next wave",
            (
                f"{human_time(view.next_wave_at) if view.next_wave_at else 'time unknown'}: "
                f"**{decision.decision}**, {_decision_reason(decision)}"
            ),
        ),
    ]
    if view.blocked is not None:
        facts.insert(0, ("Dispatch", f"**blocked** since {human_time(view.blocked.since)}: {view.blocked.reason}"))
    shown = list(view.attempts[:STATUS_ATTEMPTS_SHOWN])
    hidden = len(view.attempts) - len(shown)
    parts = [f"Status of {code_span(family.id)}:", "", *facts_table(facts), ""]
    if shown:
        parts += attempts_table_header() + attempt_rows(shown, view.repo, view.web_url)
        if hidden:
            parts += ["", f"{hidden} older attempts not shown."]
    else:
        parts.append("No attempts yet.")
    return _answer(*parts)


# ------------------------------------------------- Markdown pieces shared with checks


def table_cell(text: str) -> str:
    """`text` made safe as one cell of a Markdown table."""
    # A pipe would end the table cell even inside a code span.
    return text.replace("|", "\\|").replace("\n", " ")


def facts_table(facts: Sequence[tuple[str, str]]) -> list[str]:
    return ["| | |", "| --- | --- |", *(f"| {name} | {table_cell(value)} |" for name, value in facts)]


def attempts_table_header() -> list[str]:
    return [
        "| Completed | Outcome | Phase | Reason | Base | PR | Run |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]


def attempt_rows(
    attempts: Iterable[Attempt], repo: str | None, web_url: str = GITHUB_WEB
) -> list[str]:
    """One table row per attempt; runs and PRs are links when `repo` is known."""
    return [_attempt_row(attempt, repo, web_url.rstrip("/")) for attempt in attempts]


def attempt_result(attempt: Attempt, *, emphasis: str = "") -> str:
    """An attempt's verified outcome (between `emphasis` marks), or why it has none."""
    if attempt.verified and attempt.outcome:
        return f"{emphasis}{attempt.outcome}{emphasis}"
    return f"unverified ({attempt.error or 'no outcome'})"


def _attempt_row(attempt: Attempt, repo: str | None, web_url: str) -> str:
    outcome = attempt_result(attempt, emphasis="**")
    run = f"{attempt.run_id} / attempt {attempt.run_attempt}"
    if repo:
        url = f"{web_url}/{repo}/actions/runs/{attempt.run_id}/attempts/{attempt.run_attempt}"
        run = f"[{run}]({url})"
    if attempt.pull_request is None:
        pull = ""
    elif repo:
        pull = f"[#{attempt.pull_request}]({web_url}/{repo}/pull/{attempt.pull_request})"
    else:
        pull = f"#{attempt.pull_request}"
    cells = [
        human_time(attempt.completed_at),
        outcome,
        attempt.phase or "",
        attempt.reason_code or "",
        f"`{attempt.base[:12]}`" if attempt.base else "",
        pull,
        run,
    ]
    return "| " + " | ".join(table_cell(cell) for cell in cells) + " |"


def _overlaps_inline(overlaps: Sequence[Overlap]) -> str:
    if not overlaps:
        return "none"
    return "; ".join(f"#{o.pr} ({o.kind}): {o.reason}" for o in overlaps)


def describe_hold(hold: Hold) -> str:
    reason = code_span(hold.reason) if hold.reason.strip() else "no reason given"
    return f"by {person(hold.by)} since {human_time(hold.at)}: {reason}"


def _next_wave(at: datetime | None) -> str:
    if at is None:
        return "The time of the next wave is not known yet."
    return f"The next wave runs at {human_time(at)}."


def _decision_reason(decision: Decision) -> str:
    """A decision's reason for Markdown. A held family's names the hold's reason, its
    writer's free text: in a code span, as every user text is, or it could @-mention people
    and hide the rest of the reply behind `<!--`. The reason itself stays as it is in the
    wave and state documents."""
    reason = code_span(decision.reason) if decision.decision == "held" else decision.reason
    return with_until(reason, decision.until)


def with_until(reason: str, until: datetime | None) -> str:
    # Cooldown reasons usually name their end already ("cooling down until …").
    if until is None or human_time(until) in reason:
        return reason
    return f"{reason} (until {human_time(until)})"


def person(login: str) -> str:
    # Bold, not @login: Klaud never notifies people (domain §6.1).
    return f"**{' '.join(login.split())}**"


def _answer(*lines: str) -> str:
    return "\n".join(lines)
