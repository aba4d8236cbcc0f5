"""The `Klaud Cold` check run on Klaud pull requests (DESIGN §4 "Check run").

`render_check` turns what Klaud knows about a PR's candidate into the check run's status,
conclusion and Markdown summary; `CheckCoalescer` batches the updates, so a burst of
changes (a reconcile, a wave touching many candidates) costs one PATCH per check run.

Status mapping:
- in flight (dispatched, outcome not recorded): `in_progress`;
- otherwise `completed`, with the latest *verified* attempt's outcome deciding the
  conclusion: `success` for `validated`, `neutral` for `NEUTRAL_OUTCOMES`, `failure` else;
- no verified attempt (none at all, or only unverified ones) and not in flight: `completed`
  `neutral`. Nothing is running, so an `in_progress` check would spin forever and block
  branch protection on something nobody is doing; the title says what Klaud waits for.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Awaitable, Callable, Generic, Hashable, Literal, Sequence, TypeVar

import structlog

from bot import commands
from bot.domain import Attempt, Family, Hold, Overlap
from bot.outcomes import check_conclusion
from bot.settings import POLICY_PATH

CHECK_NAME = "Klaud Cold"
# GitHub rejects an output.summary over 65535 characters; counting UTF-8 bytes instead
# keeps us under the limit whatever GitHub counts.
SUMMARY_LIMIT = 65535
_CLIPPED = "\n\n… (summary truncated)"

Status = Literal["in_progress", "completed"]
Conclusion = Literal["success", "neutral", "failure"]

log = structlog.get_logger(__name__)


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
    latest = latest_verified(view.attempts)
    status, conclusion, title = _state(view, latest)
    if view.hold is not None:
        title += " · held"
    if view.policy_error is not None:
        title += f" · invalid {POLICY_PATH}"
    return CheckOutput(status, conclusion, title, _summary(view, web_url.rstrip("/")))


def latest_verified(attempts: Sequence[Attempt]) -> Attempt | None:
    verified = [a for a in attempts if a.verified and a.outcome is not None]
    return max(verified, key=lambda a: a.completed_at, default=None)


def _state(view: CheckView, latest: Attempt | None) -> tuple[Status, Conclusion | None, str]:
    if view.in_flight:
        return "in_progress", None, "Candidate run in progress"
    if latest is not None and latest.outcome is not None:
        return "completed", check_conclusion(latest.outcome), f"Latest attempt: {latest.outcome}"
    if view.attempts:
        newest = max(view.attempts, key=lambda a: a.completed_at)
        return "completed", "neutral", f"Outcome not verified ({newest.error or 'unknown'})"
    return "completed", "neutral", "Waiting for a wave"


def _summary(view: CheckView, web_url: str) -> str:
    before = _policy_warning(view.policy_error) + [
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
    if _size(summary) <= SUMMARY_LIMIT:
        return summary
    room = SUMMARY_LIMIT - _size(_CLIPPED)
    head = summary.encode("utf-8")[:room].decode("utf-8", errors="ignore")
    return head + _CLIPPED


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


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
        family = commands.code_span(view.family.id)
    else:
        family = "none: the candidate no longer matches a family on the default branch"
    hold = (
        f"{commands.describe_hold(view.hold)}; release with `/klaud unhold`"
        if view.hold is not None
        else "none"
    )
    return [
        ("Family", family),
        ("Candidate", commands.code_span(view.candidate)),
        ("Image", commands.code_span(view.image) if view.image else "unknown"),
        ("Cooldown", commands.with_until(view.cooldown_reason, view.cooldown_until)),
        ("Hold", hold),
    ]


def _overlap_lines(view: CheckView, web_url: str) -> list[str]:
    if not view.overlaps:
        return ["None."]
    return [
        f"- [#{o.pr}]({web_url}/{view.repo}/pull/{o.pr}) ({o.kind}): {o.reason}"
        for o in view.overlaps
    ]


# -------------------------------------------------------------------------- coalescer

K = TypeVar("K", bound=Hashable)


class CheckCoalescer(Generic[K]):
    """Runs `flush(key)` once per burst of `mark(key)` calls.

    The first mark of a key starts a `delay_seconds` window; marks inside it add nothing.
    A mark while that key's flush runs asks for exactly one more flush, a window after the
    running one ends, so the last change is never lost. Exceptions listed in `errors` are
    logged with the key and the key stays usable; any other exception ends that key's task
    and surfaces through asyncio like any task failure.
    """

    def __init__(
        self,
        flush: Callable[[K], Awaitable[None]],
        delay_seconds: float = 3.0,
        *,
        errors: tuple[type[BaseException], ...] = (),
    ) -> None:
        self._flush = flush
        self._delay = delay_seconds
        self._errors = errors
        self._tasks: dict[K, asyncio.Task[None]] = {}
        self._running: set[K] = set()
        self._again: set[K] = set()
        self._hurry = asyncio.Event()  # set while settling: windows end at once
        self._closed = False

    @property
    def pending(self) -> frozenset[K]:
        """Keys with a flush scheduled or running."""
        return frozenset(self._tasks)

    def mark(self, key: K) -> None:
        if self._closed:
            raise RuntimeError("CheckCoalescer is closed")
        if key not in self._tasks:
            self._tasks[key] = asyncio.get_running_loop().create_task(
                self._run(key), name=f"check-flush:{key}"
            )
        elif key in self._running:
            self._again.add(key)

    async def settle(self) -> None:
        """Flush every pending key now and wait until none is left."""
        self._hurry.set()
        try:
            while self._tasks:
                await asyncio.wait(list(self._tasks.values()))
        finally:
            if not self._closed:
                self._hurry.clear()

    async def close(self) -> None:
        """For shutdown: flush what is pending, then refuse new marks."""
        self._closed = True
        await self.settle()

    async def _run(self, key: K) -> None:
        try:
            while True:
                await self._window()
                self._running.add(key)
                try:
                    await self._flush(key)
                except self._errors as exc:
                    log.warning("check_flush_failed", key=str(key), error=repr(exc))
                finally:
                    self._running.discard(key)
                if key not in self._again:
                    return
                self._again.discard(key)
        finally:
            self._tasks.pop(key, None)
            self._again.discard(key)

    async def _window(self) -> None:
        if self._hurry.is_set():
            return
        try:
            async with asyncio.timeout(self._delay):
                await self._hurry.wait()
        except TimeoutError:
            pass  # the window ended normally
