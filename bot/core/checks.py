"""The `Klaud Cold` check run on Klaud pull requests (DESIGN §4 "Check run").

`render_check` turns what Klaud knows about a PR's candidate into the check run's status,
conclusion and Markdown summary (`bot.services.coalescer` batches the updates).

Status mapping:
- in flight (dispatched, outcome not recorded): `in_progress`;
- otherwise `completed`, with the attempt the candidate's cooldown comes from, else the
  latest *verified* attempt, deciding the conclusion: `success` for `validated`, `neutral`
  for `NEUTRAL_OUTCOMES`, `failure` else, and `failure` for a cooldown after runs that
  failed before an outcome twice in a row (whatever outcome came before them);
- nothing verified and no cooldown (no attempt, or only unverified ones) and not in flight:
  `completed` `neutral`. Nothing is running, so an `in_progress` check would spin forever
  and block branch protection on something nobody is doing.

The title names the latest attempt, verified or not, and says when the candidate cools down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from bot.core import commands
from bot.core.catalog import config_problems
from bot.core.cooldown import human_time
from bot.core.domain import Attempt, Blocked, Family, Hold, Overlap, code_span
from bot.core.outcomes import check_conclusion
from bot.core.policy import POLICY_PATH

CHECK_NAME = "Klaud Cold"
# GitHub rejects an output.summary over 65535 characters; counting UTF-8 bytes instead
# keeps us under the limit whatever GitHub counts.
SUMMARY_LIMIT = 65535
_CLIPPED = "\n\n… (summary truncated)"

Status = Literal["in_progress", "completed"]
Conclusion = Literal["success", "neutral", "failure"]


@dataclass(frozen=True, slots=True)
class CheckView:
    """Everything the check run of one Klaud PR shows."""

    repo: str  # owner/name
    family: Family | None  # None when the candidate no longer matches a live family
    candidate: str
    image: str | None
    attempts: Sequence[Attempt]  # newest first
    cooldown_reason: str
    cooldown_until: datetime | None
    overlaps: Sequence[Overlap]  # other open PRs touching the family
    hold: Hold | None
    in_flight: bool
    policy_error: str | None  # why .github/klaud.yml was rejected, if it was
    blocked: Blocked | None = None  # a dispatch pause or a setup error of the repository
    config_errors: Mapping[str, str] = field(default_factory=dict)  # path -> problems, one a line
    cooled_by: Attempt | None = None  # the attempt the cooldown in force comes from (None: not cooling down)


@dataclass(frozen=True, slots=True)
class CheckOutput:
    status: Status
    conclusion: Conclusion | None
    title: str
    summary: str

    def payload(self, head_sha: str | None = None) -> dict[str, Any]:
        """JSON body for `POST …/check-runs` (give `head_sha`) or `PATCH …/check-runs/{id}`."""
        body: dict[str, Any] = {
            "name": CHECK_NAME,
            "status": self.status,
            "output": {"title": self.title, "summary": self.summary},
        }
        if head_sha is not None:
            body["head_sha"] = head_sha
        # GitHub treats any conclusion as "completed", so an in-progress run sends none.
        if self.conclusion is not None:
            body["conclusion"] = self.conclusion
        return body


def render_check(view: CheckView, *, web_url: str = commands.GITHUB_WEB) -> CheckOutput:
    status, conclusion, title = _state(view)
    if view.hold is not None:
        title += " · held"
    if view.policy_error is not None:
        title += f" · invalid {POLICY_PATH}"
    if view.blocked is not None:
        title += " · dispatch paused" if view.blocked.code == "dispatch-paused" else " · setup error"
    return CheckOutput(status, conclusion, title, _summary(view, web_url.rstrip("/")))


def latest_verified(attempts: Sequence[Attempt]) -> Attempt | None:
    verified = [a for a in attempts if a.verified and a.outcome is not None]
    return max(verified, key=lambda a: a.completed_at, default=None)


def _state(view: CheckView) -> tuple[Status, Conclusion | None, str]:
    if view.in_flight:
        return "in_progress", None, "Candidate run in progress"
    if not view.attempts:
        return "completed", "neutral", "Waiting for a wave"
    newest = max(view.attempts, key=lambda a: (a.completed_at, a.run_id, a.run_attempt))
    title = f"Latest attempt: {commands.attempt_result(newest)}"
    if view.cooldown_until is not None:
        title += " · cooling down"
    return "completed", _conclusion(view), title


def _conclusion(view: CheckView) -> Conclusion:
    """What decides the candidate now: the attempt its cooldown comes from, else its latest
    verified outcome (an artifact that expired says nothing of its run)."""
    deciding = view.cooled_by or latest_verified(view.attempts)
    if deciding is None:
        return "neutral"
    if not deciding.verified or deciding.outcome is None:
        # Two runs in a row failed before an outcome: the planner cools the candidate down
        # for a broken run, whatever outcome (a capacity deferral: neutral) came before.
        return "failure"
    return check_conclusion(deciding.outcome)


def _summary(view: CheckView, web_url: str) -> str:
    before = _blocked_warning(view.blocked) + _policy_warning(view.policy_error) + _config_warning(view.config_errors) + [
        *commands.facts_table(_facts(view)),
        "",
        "### Overlapping pull requests",
        "",
        *_overlap_lines(view, web_url),
        "",
        "### Attempts",
        "",
    ]
    after = ["", "### Commands", "", commands.help_text()]
    if not view.attempts:
        return _clip("\n".join([*before, "No attempts yet.", *after]))
    ordered = sorted(view.attempts, key=lambda a: a.completed_at, reverse=True)
    rows = commands.attempt_rows(ordered, view.repo, web_url)
    header = commands.attempts_table_header()
    return _clip(_fit_rows(before + header, rows, after))


def _fit_rows(before: list[str], rows: list[str], after: list[str]) -> str:
    """The summary with as many attempt rows (newest first) as the size limit allows."""
    budget = SUMMARY_LIMIT - _size("\n".join(before + after)) - _size(_omitted(len(rows))) - 2
    kept: list[str] = []
    for row in rows:
        cost = _size(row) + 1
        if cost > budget:
            break
        kept.append(row)
        budget -= cost
    table = "\n".join(kept)
    if len(kept) < len(rows):
        table += _omitted(len(rows) - len(kept))
    return "\n".join([*before, table, *after])


def _omitted(count: int) -> str:
    return f"\n\n{count} older attempts not shown (summary size limit)."


def _clip(summary: str) -> str:
    """Last resort when even the parts around the attempts table are too big."""
    return commands.clip(summary, SUMMARY_LIMIT, _CLIPPED)


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _blocked_warning(blocked: Blocked | None) -> list[str]:
    if blocked is None:
        return []
    heading = "Dispatch paused" if blocked.code == "dispatch-paused" else "Setup error"
    return [
        f"### ⚠️ {heading} since {human_time(blocked.since)}",
        "",
        f"Waves plan but dispatch nothing: {blocked.reason}",
        "",
    ]


# Problems listed on a check run; the status page and the dashboard list them all.
CONFIG_PROBLEMS_SHOWN = 10


def _config_warning(errors: Mapping[str, str]) -> list[str]:
    problems = config_problems(errors)
    if not problems:
        return []
    shown = [f"- {code_span(path)}: {problem}" for path, problem in problems[:CONFIG_PROBLEMS_SHOWN]]
    more = len(problems) - len(shown)
    return [
        "### ⚠️ Configuration errors",
        "",
        *shown,
        *([f"- … and {more} more on the status page"] if more else []),
        "",
    ]


def _policy_warning(error: str | None) -> list[str]:
    if error is None:
        return []
    return [
        f"### ⚠️ Invalid `{POLICY_PATH}`",
        "",
        f"Klaud keeps using the last valid policy until the file is fixed: {error}",
        "",
    ]


def _facts(view: CheckView) -> list[tuple[str, str]]:
    if view.family is not None:
        family = code_span(view.family.id)
    else:
        family = "none: the candidate no longer matches a family on the default branch"
    hold = (
        f"{commands.describe_hold(view.hold)}; release with `/klaud unhold`"
        if view.hold is not None
        else "none"
    )
    return [
        ("Family", family),
        ("Candidate", code_span(view.candidate)),
        ("Image", _image_fact(view)),
        # When the image last changed, not an age: a check run is not re-rendered as it ages.
        ("Image changed", human_time(changed) if (changed := _image_changed_at(view)) else "unknown"),
        ("Cooldown", commands.with_until(view.cooldown_reason, view.cooldown_until)),
        ("Hold", hold),
    ]


def _image_fact(view: CheckView) -> str:
    if not view.image:
        return "unknown"
    image = code_span(view.image)
    if view.family is not None and view.family.candidate != view.candidate:
        # The PR's branch names the candidate it works on; the family has moved on since.
        return f"{image} on the default branch now; this candidate is for an earlier image"
    return image


def _image_changed_at(view: CheckView) -> datetime | None:
    return view.family.image_changed_at if view.family is not None else None


def _overlap_lines(view: CheckView, web_url: str) -> list[str]:
    if not view.overlaps:
        return ["None."]
    return [
        f"- [#{o.pr}]({web_url}/{view.repo}/pull/{o.pr}) ({o.kind}): {o.reason}"
        for o in view.overlaps
    ]
