"""The dashboard issue (DESIGN §4 "Dashboard issue"; Renovate's Dependency Dashboard is the model).

One open issue per repository, re-rendered after each wave: the pause or setup error, the
last wave's selections, counts per decision, families cooling down (each with a box that
approves a retry when ticked), held families (a box that releases the hold), the stalest
images and the configuration errors. Its body also carries the holds and pending retries
in a marker, so a full reconcile restores them when the local store is lost.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from bot.core.catalog import config_problems
from bot.core.commands import (
    MAX_TEXT,
    clip,
    closes_fence,
    describe_hold,
    fence_opened,
    opens_a_comment,
    person,
    table_cell,
    with_until,
)
from bot.core.cooldown import human_time
from bot.core.domain import (
    CANDIDATE_RE,
    Blocked,
    DecisionKind,
    Family,
    Hold,
    RetryApproval,
    Wave,
    code_span,
    image_age_days,
    parse_time,
    stamp,
)

TITLE = "Klaud Cold dashboard"
STALEST_SHOWN = 15
# Boxes shown per list: at thousands of families, a full cooling list filled the issue's
# 65,000 characters and cut off the held families and the configuration errors after it
# (and cost ~20 ms per render). The status page lists them all.
BOXES_SHOWN = 100
# GitHub refuses an issue body over 65,536 characters.
BODY_LIMIT = 65_000
# The marker's share of the body. What does not fit is left out, reasons first (a hold
# restored without its reason still holds), then the oldest entries: 400 holds once made a
# 145,000-character marker, and GitHub refused every later update of the dashboard.
MARKER_BUDGET = 32_000
# v1 is base64 JSON; v2, written only when v1 would not fit, deflated JSON. What a decoded
# marker may grow to.
MARKER_MAX_JSON = 1024 * 1024
MAX_LOGIN = 64  # characters of a login read from a marker (GitHub's are at most 39, "[bot]" aside)
_MARKER_RE = re.compile(r"<!-- klaud-dashboard:v(?P<version>[12]):(?P<data>[A-Za-z0-9_=-]+) -->")
# `[ \t]*`, not `\s*`: in multiline mode `\s*` crosses newlines, and a body of 65,000
# blank lines took 8 s of the event loop to scan. The family is a code span as `code_span`
# writes it: a fence of as many backticks as it takes, closed by a run of exactly as many.
_BOX_RE = re.compile(
    r"^[ \t]*- \[(?P<mark>[ xX])\] (?P<verb>retry|unhold) "
    r"(?P<fence>`+)(?!`)(?P<family>.+?)(?<!`)(?P=fence)(?!`)",
    re.MULTILINE,
)

BoxVerb = Literal["retry", "unhold"]
_LOGIN_RE = re.compile(r"[A-Za-z0-9_-]+(?:\[bot\])?")  # `_`: Enterprise Managed Users' logins


@dataclass(frozen=True, slots=True)
class DashboardView:
    repo: str
    wave: Wave | None  # the last real wave, when there was one
    blocked: Blocked | None
    cooling: Sequence[tuple[Family, str, datetime | None]]  # family, reason, until
    holds: Sequence[Hold]
    retries: Sequence[RetryApproval]
    families: Sequence[Family]
    config_errors: Mapping[str, str]
    now: datetime
    setup_errors: Sequence[str] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class Remembered:
    """What the marker keeps: enough to restore holds and retries from GitHub alone."""

    holds: tuple[Hold, ...]
    retries: tuple[RetryApproval, ...]


def render_dashboard(view: DashboardView) -> str:
    parts = [
        (
            f"This issue is kept by Klaud Cold for {view.repo}. Tick a box to act on it "
            "(write access needed); Klaud answers by updating this issue."
        ),
        "",
        *_blocked_section(view.blocked),
        *_wave_section(view.wave),
        *_cooling_section(view),
        *_held_section(view.repo, view.holds),
        *_stalest_section(view.families, view.now),
        *_config_section(view.config_errors),
        _marker(Remembered(tuple(view.holds), tuple(view.retries))),
    ]
    # The marker must survive whatever is cut: it is what a lost store comes back from.
    *shown, marker = parts
    room = BODY_LIMIT - len(marker.encode("utf-8")) - 1
    return clip("\n".join(shown), room, "\n\n… (truncated)\n") + "\n" + marker


def _blocked_section(blocked: Blocked | None) -> list[str]:
    if blocked is None:
        return []
    heading = "Dispatch paused" if blocked.code == "dispatch-paused" else "Setup error"
    return [f"## ⚠️ {heading} since {human_time(blocked.since)}", "", blocked.reason, ""]


def _wave_section(wave: Wave | None) -> list[str]:
    if wave is None:
        return ["## Last wave", "", "No wave has run yet.", ""]
    counts = Counter(d.decision for d in wave.decisions)
    lines = [
        f"## Last wave: {wave.wave} at {human_time(wave.at)}",
        "",
        ", ".join(f"{count} {kind}" for kind, count in sorted(counts.items())) + ".",
        "",
    ]
    selected = [d for d in wave.decisions if d.decision == "selected"]
    if selected:
        lines += [f"- {code_span(d.family)} (candidate {code_span(d.candidate)})" for d in selected]
    else:
        lines.append("Nothing was selected.")
    return [*lines, ""]


def _cooling_section(view: DashboardView) -> list[str]:
    if not view.cooling:
        return []
    lines = ["## Cooling down", "", "Tick a box to retry the family's candidate at the next wave.", ""]
    approved = _approved_since_the_wave(view)
    ordered = sorted(view.cooling, key=lambda item: item[0].id)
    for family, reason, until in ordered[:BOXES_SHOWN]:
        if (approval := approved.get(family.candidate)) is not None:
            # The box was ticked (or `/klaud retry` said) since the wave: no box to tick again.
            lines.append(f"- retry {code_span(family.id)}: approved by {person(approval.by)} "
                         f"{human_time(approval.at)}; the next wave may pick it")
        else:
            lines.append(f"- [ ] retry {code_span(family.id)}: {with_until(reason, until)}")
    return [*lines, *_more(view.repo, len(ordered), "cooling down", "cooldown"), ""]


def _approved_since_the_wave(view: DashboardView) -> dict[str, RetryApproval]:
    """Retries approved after the wave that found their candidates cooling down (an earlier
    approval that wave already weighed, and a later failure outweighed)."""
    since = view.wave.at if view.wave is not None else None
    return {r.candidate: r for r in view.retries if since is None or r.at > since}


def _held_section(repo: str, holds: Sequence[Hold]) -> list[str]:
    if not holds:
        return []
    lines = ["## Held", "", "Tick a box to release the hold.", ""]
    ordered = sorted(holds, key=lambda h: h.family)
    for hold in ordered[:BOXES_SHOWN]:
        lines.append(f"- [ ] unhold {code_span(hold.family)}: {describe_hold(hold)}")
    return [*lines, *_more(repo, len(ordered), "held", "held"), ""]


def _more(repo: str, total: int, what: str, decision: DecisionKind) -> list[str]:
    if total <= BOXES_SHOWN:
        return []
    more = total - BOXES_SHOWN
    return ["", f"… and {more} more families {what}: the status page lists them all (`/repos/{repo}?decision={decision}`)."]


def _stalest_section(families: Sequence[Family], now: datetime) -> list[str]:
    if not families:
        return []
    ordered = sorted(families, key=lambda f: (f.image_changed_at is not None, f.image_changed_at or now, f.id))
    lines = ["## Stalest images", "", "| Family | Image | Image age |", "| --- | --- | --- |"]
    for family in ordered[:STALEST_SHOWN]:
        cells = (table_cell(code_span(family.id)), table_cell(code_span(family.image)), image_age(family, now))
        lines.append(f"| {' | '.join(cells)} |")
    return [*lines, ""]


def image_age(family: Family, now: datetime) -> str:
    days = image_age_days(family, now)
    return "unknown" if days is None else f"{days:.0f} days"


def _config_section(errors: Mapping[str, str]) -> list[str]:
    if not errors:
        return []
    return ["## Configuration errors", "", *(f"- {code_span(path)}: {detail}" for path, detail in config_problems(errors)), ""]


# -- the marker -------------------------------------------------------------------------


def _marker(remembered: Remembered) -> str:
    holds, retries, reasons = list(remembered.holds), list(remembered.retries), True
    while True:
        marker = _encoded_marker(holds, retries, reasons=reasons)
        if len(marker) <= MARKER_BUDGET or not (holds or retries):
            return marker
        if reasons:
            reasons = False
        else:
            holds = sorted(holds, key=lambda h: h.at, reverse=True)[: len(holds) // 2]
            retries = sorted(retries, key=lambda r: r.at, reverse=True)[: len(retries) // 2]


def _encoded_marker(holds: Sequence[Hold], retries: Sequence[RetryApproval], *, reasons: bool) -> str:
    document = {
        "holds": [
            {"family": h.family, "by": h.by, "at": stamp(h.at), **({"reason": h.reason} if reasons else {})}
            for h in holds
        ],
        "retries": [{"candidate": r.candidate, "by": r.by, "at": stamp(r.at)} for r in retries],
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    # v1 (DESIGN §4's base64 JSON) while it fits: tools reading the marker as documented see
    # it; only a marker too long for the issue is deflated.
    plain = f"<!-- klaud-dashboard:v1:{base64.urlsafe_b64encode(text).decode()} -->"
    if len(plain) <= MARKER_BUDGET:
        return plain
    packed = zlib.compress(text, 9)
    return f"<!-- klaud-dashboard:v2:{base64.urlsafe_b64encode(packed).decode()} -->"


def parse_marker(body: str) -> Remembered | None:
    """The holds and retries a dashboard body remembers; None when it has no readable marker.

    The dashboard's own marker is its last line: a hold's reason shown above it may hold a
    marker too (`/klaud hold X <!-- klaud-dashboard:v1:… -->`), and read first, it would
    replace every hold and retry when a lost store is rebuilt from the issue.
    """
    matches = list(_MARKER_RE.finditer(body))
    if not matches:
        return None
    match = matches[-1]
    try:
        data = base64.urlsafe_b64decode(match["data"])
        if match["version"] == "2":
            # Anyone who may edit the issue may write a marker: a bomb is refused, not inflated.
            inflater = zlib.decompressobj()
            data = inflater.decompress(data, MARKER_MAX_JSON)
            if inflater.unconsumed_tail:
                return None
        document = json.loads(data)
        return Remembered(
            holds=tuple(_hold(item) for item in document.get("holds", [])),
            retries=tuple(retry for item in document.get("retries", []) if (retry := _retry(item)) is not None),
        )
    # RecursionError: JSON nested thousands deep, which json.loads does not refuse itself.
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError, zlib.error):
        return None


def _hold(item: dict[str, Any]) -> Hold:
    # Clipped as a command's are: anyone who may edit the issue writes what it says.
    return Hold(str(item["family"]), _login(item["by"]), str(item.get("reason", ""))[:MAX_TEXT], _time(item["at"]))


def _retry(item: dict[str, Any]) -> RetryApproval | None:
    """None for what names no candidate: it would key a stored record (6,000 characters
    made PostgreSQL refuse its index row, and the repository's rebuild with it)."""
    candidate = str(item["candidate"])
    if not CANDIDATE_RE.match(candidate):
        return None
    return RetryApproval(candidate, _login(item["by"]), _time(item["at"]))


def _login(value: Any) -> str:
    # Anyone who may edit the issue writes the marker: a "login" holding a line break
    # rendered a ticked box of its own into Klaud's next render, which acted when carried.
    login = str(value)[:MAX_LOGIN]
    return login if _LOGIN_RE.fullmatch(login) else "someone"


def _time(value: Any) -> datetime:
    parsed = parse_time(str(value))
    if parsed is None:
        raise ValueError("no time")
    return parsed


# -- ticked boxes -----------------------------------------------------------------------


def ticked(before: str, after: str) -> list[tuple[BoxVerb, str]]:
    """The boxes a person ticked between two bodies of the dashboard, as (verb, family)."""
    was = set(_ticked_boxes(before))
    return [box for box in _ticked_boxes(after) if box not in was]


def _ticked_boxes(body: str) -> list[tuple[BoxVerb, str]]:
    boxes: list[tuple[BoxVerb, str]] = []
    for match in _BOX_RE.finditer(_shown(body)):
        if match["mark"] != " ":
            boxes.append(("retry" if match["verb"] == "retry" else "unhold", _span_text(match["family"])))
    return boxes


def _shown(body: str) -> str:
    """`body` without what GitHub shows no checkbox in: fenced code and HTML comments (a box
    written there by whoever may edit the issue, to show one, is no tick)."""
    kept: list[str] = []
    fence: str | None = None
    comment = False
    for line in body.split("\n"):
        if comment:
            comment = "-->" not in line
        elif fence is not None:
            fence = None if closes_fence(line, fence) else fence
        elif (fence := fence_opened(line)) is None:
            # Not one in a code span: a hold reason shown as `see <!-- notes` hid every box after it.
            comment = opens_a_comment(line)
            kept.append(line[:line.rfind("<!--")] if comment else line)
    return "\n".join(kept)


def _span_text(inside: str) -> str:
    """What a code span's fences enclose, read as CommonMark does: `code_span` pads text that
    begins or ends with a backtick with one space each side, and the reader drops them."""
    if inside.startswith(" ") and inside.endswith(" ") and inside.strip(" "):
        return inside[1:-1]
    return inside
