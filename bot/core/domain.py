"""Plain data shared by Klaud's pure decision modules.

Everything here is free of I/O: the catalog, overlap, outcome, planner and check modules
exchange these frozen dataclasses, the store persists them, and handlers build them from
payloads. Identities follow DESIGN §4 ("Candidate id") and domain §3.3 exactly, because
branch names, claim refs and artifact names computed elsewhere must match ours bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator

CANDIDATE_RE = re.compile(r"^[0-9a-f]{16}-[0-9a-f]{16}$")
CANDIDATE_LENGTH = 33  # every candidate id: 16 hex digits, a dash, 16 hex digits
# A family id: the path of a master config (anywhere `config_globs` reaches), ':', its key.
FAMILY_RE = re.compile(r"^[^\s:]+\.ya?ml:[^\s:]+$")
ARTIFACT_RE = re.compile(r"^klaud-candidate-([0-9a-f]{16}-[0-9a-f]{16})$")
# Klaud's own PR branches (DESIGN §4: a prefix naming the family's hash, whatever follows:
# `…-<img16>-2`, `…-retry`); the older `klaude/` spelling still occurs on live repositories.
OWN_BRANCH_RE = re.compile(r"^klaude?/auto-([0-9a-f]{16})-")
# The candidate such a branch works on, when it names one whole.
BRANCH_CANDIDATE_RE = re.compile(r"^klaude?/auto-([0-9a-f]{16}-[0-9a-f]{16})(?![0-9a-f])")

# Outcomes that retry at the next wave instead of cooling down (DESIGN §4 "Cooldown").
RETRY_NEXT_WAVE_OUTCOMES = frozenset({"capacity-deferred"})
# Check-run conclusions per outcome (DESIGN §4 "Check run"); everything else is `failure`.
NEUTRAL_OUTCOMES = frozenset(
    {"capacity-deferred", "handoff", "already-updated", "retired", "duplicate"}
)

Outcome = Literal[
    "validated",
    "capacity-deferred",
    "readiness-blocked",
    "incompatible",
    "duplicate",
    "retired",
    "already-updated",
    "uncertain",
    "failed",
    "handoff",
    "unexpected-error",
]
TouchKind = Literal["image", "flags", "patch-unavailable"]
DecisionKind = Literal[
    "selected",
    "cooldown",
    "overlap",
    "capacity",
    "claimed",
    "in-flight",
    "held",
    "cap",
    "paused",
    "dispatch-failed",
]
BlockCode = Literal["dispatch-paused", "setup-error"]
# A run that ends like this before its candidate's artifact exists failed before an outcome.
RUN_FAILED_CONCLUSIONS = frozenset({"failure", "cancelled", "timed_out", "startup_failure"})
# What GitHub says of a run that has not finished.
ACTIVE_RUN_STATUSES = frozenset({"queued", "in_progress", "waiting", "requested", "pending"})


def identity(value: Any) -> str:
    """SHA-256 hex of the canonical JSON of `value` (domain §2)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def normalized_image(image: str) -> str:
    """Rewrite enroot's `registry#path` spelling to `registry/path` (domain §2)."""
    registry, sep, rest = image.partition("#")
    if sep and rest and ("." in registry or ":" in registry):
        return f"{registry}/{rest}"
    return image


# Both are asked for every family of every wave; the inputs are few and never change.
@lru_cache(maxsize=65536)
def family_hash(family: str) -> str:
    return identity(family)[:16]


@lru_cache(maxsize=65536)
def candidate_id(family: str, image: str) -> str:
    return f"{family_hash(family)}-{identity(normalized_image(image))[:16]}"


CLAIM_BRANCH_PREFIX = "klaud/claim-"


def claim_ref(family: str) -> str:
    """Branch name (without `refs/heads/`) of a family's claim."""
    return CLAIM_BRANCH_PREFIX + family_hash(family)


TIME_RANGE = (1970, 9000)  # years
# What a time given by a person (`--at`, `?at=`) must be, as their errors say it.
TIME_EXPECTED = f"an ISO time with a timezone, in the years {TIME_RANGE[0]}-{TIME_RANGE[1]}"


def parse_time(value: str | None) -> datetime | None:
    """Parse GitHub's ISO timestamps (`Z` suffix) into aware datetimes."""
    if value is None:
        return None
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp without a timezone: {value!r}")
    # Near year 1 or 9999, converting to UTC or adding a cooldown overflows (a 500 from
    # `/plan?at=`, a traceback from `klaud plan --at`): no time Klaud plans with is there.
    outside = f"timestamp outside {TIME_RANGE[0]}-{TIME_RANGE[1]}: {value!r}"
    if not TIME_RANGE[0] <= parsed.year <= TIME_RANGE[1]:
        raise ValueError(outside)
    try:
        return as_utc(parsed)  # in UTC, and checked there, as every stored time is
    except ValueError:
        raise ValueError(outside) from None


def as_utc(value: datetime) -> datetime:
    """An aware time with `datetime.UTC` as its tzinfo. pydantic reads "…Z" with a tzinfo
    object of its own, and two times whose tzinfo objects differ compare in ~0.8 µs (each
    is asked for its offset) where times sharing UTC take ~0.05 µs: planning compares
    thousands of them. A naive time is refused: GitHub's always say their zone, and one
    that did not (a payload fed by hand or replayed) was stored and made every later wave
    of its repository raise when it compared it with an aware one. A time past the years
    Klaud plans with is refused too: a dispatch stored at 9999-12-31 made every plan of its
    repository overflow adding the claim TTL. (Not one before 1970: GitHub's zero time,
    year 1, may stand for "none".)"""
    if value.tzinfo is None:
        raise ValueError("a time without a timezone")
    try:
        utc = value if value.tzinfo is UTC else value.astimezone(UTC)
    except OverflowError:  # an OverflowError would get past pydantic: a ValueError naming the end
        end = f"past the year {TIME_RANGE[1]}" if value.year > TIME_RANGE[1] else "before the year 1 in UTC"
        raise ValueError(f"a time {end}") from None
    # Checked in UTC, as it is stored: the last hours of 9000 west of UTC are 9001 there.
    if utc.year > TIME_RANGE[1]:
        raise ValueError(f"a time past the year {TIME_RANGE[1]}")
    return utc


# The type of every time the domain's records and GitHub's models hold (see `as_utc`).
UtcTime = Annotated[datetime, AfterValidator(as_utc)]


# What reading a document of another shape than the one Klaud writes raises (a key missing,
# a value of another type: `Wave.from_document`).
UNREADABLE_DOCUMENT = (KeyError, TypeError, ValueError)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"text expected, not {type(value).__name__}")
    return value


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a whole number expected, not {type(value).__name__}")
    return value


def _required_time(value: str) -> datetime:
    parsed = parse_time(value)
    if parsed is None:
        raise ValueError("a time is required")
    return parsed


def stamp(value: datetime | None) -> str | None:
    """ISO text with a `Z` suffix, the form every document and payload uses."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Family:
    """One top-level key of a master config on the default branch."""

    id: str  # "<path>:<key>"
    path: str
    key: str
    image: str
    runner: str
    clusters: tuple[str, ...]
    model_prefix: str | None
    precision: str | None
    framework: str | None
    line_start: int  # 1-based line of `key:`
    line_end: int  # last line of the block, inclusive
    image_changed_at: UtcTime | None = None
    # Runner names listed under its runner label that name no cluster runners.yaml declares.
    unresolved: tuple[str, ...] = ()
    image_line: int | None = None  # 1-based line of its own `image:` key
    key_quoted: bool = False  # its key line writes the key in quotes (`"key":`)
    # How deep its block indents its own keys (the column of its `image:`): a patch hunk
    # that starts inside the block does not show the key line it could be read from.
    child_indent: int | None = None  # None: stored before it was recorded

    @property
    def normalized_image(self) -> str:
        return normalized_image(self.image)

    @property
    def candidate(self) -> str:
        return candidate_id(self.id, self.image)

    @property
    def family_hash(self) -> str:
        return family_hash(self.id)


def image_age_days(family: Family, now: datetime) -> float | None:
    """Days since the family's image last changed, to a tenth; None when unknown. A change
    dated after `now` (a committer's clock ahead, or ours behind GitHub's) is 0 days old."""
    if family.image_changed_at is None:
        return None
    return max(round((now - family.image_changed_at).total_seconds() / 86400, 1), 0.0)


@dataclass(frozen=True, slots=True)
class FileChange:
    """What one changed file of a pull request touches, derived from its patch alone.

    `keys` maps a top-level key of a master config to "image" (the key's own `image:` line
    changed) or "flags" (any other non-blank, non-comment line of its block changed).
    `unavailable` is set when neither a usable patch (GitHub may omit it, and a hunk header
    may name a cut key no family key completes) nor a local diff could be had: the PR then
    overlaps every family of that file with reason `patch-unavailable`. `oversized` says why
    when the diff was had but touched more keys than Klaud keeps: reading it again gives the
    same answer, so it is not read again for the same head.
    """

    filename: str
    previous_filename: str | None = None
    keys: dict[str, Literal["image", "flags"]] = field(default_factory=dict)
    unavailable: bool = False
    oversized: bool = False

    @property
    def diff_missing(self) -> bool:
        """Neither the patch nor a local diff said what changed: a later read may."""
        return self.unavailable and not self.oversized


@dataclass(frozen=True, slots=True)
class PullRequest:
    number: int
    title: str
    author: str
    head_ref: str
    head_sha: str
    base_ref: str
    draft: bool
    labels: tuple[str, ...]
    created_at: UtcTime | None
    updated_at: UtcTime
    klaud_own: bool
    own_family_hash: str | None  # fam16 from a Klaud branch name, when it has one
    changes: tuple[FileChange, ...] = ()
    files_complete: bool = True
    files_sha: str | None = None  # head SHA the `changes` were computed for
    # A comment on it, later than `updated_at`: GitHub moves `updated_at` for it, but here that
    # field is only set by `pull_request` events and listings, whose order it checks.
    active_at: UtcTime | None = None

    @property
    def last_active(self) -> datetime:
        """When it was last touched: what makes a human PR idle (DESIGN §4)."""
        return self.active_at if self.active_at is not None and self.active_at > self.updated_at else self.updated_at


@dataclass(frozen=True, slots=True)
class Attempt:
    """One finished run of a candidate, read from its artifact or a receipt comment."""

    candidate: str
    family: str | None
    run_id: int
    run_attempt: int
    base: str | None
    completed_at: UtcTime
    verified: bool
    outcome: Outcome | None
    phase: str | None
    pull_request: int | None
    reason_code: str | None
    error: str | None  # error code when unverified, e.g. "artifact-expired"
    source: Literal["artifact", "receipt", "run"] = "artifact"
    # For `run-failed`: the first job and step of the run that failed.
    failed_job: str | None = None
    failed_step: str | None = None


@dataclass(frozen=True, slots=True)
class Overlap:
    """One open pull request that blocks a family, with a reason for people."""

    pr: int
    kind: TouchKind  # "image", "flags" or "patch-unavailable"
    reason: str  # e.g. "PR #4012 changes this family's image line"


@dataclass(frozen=True, slots=True)
class CapacityReading:
    """Which clusters may take Klaud work now (domain §4.5), fetched once per wave.

    `error` is set (and `eligible` empty) when the feed is missing or structurally
    invalid: Klaud fails closed and every capacity decision says why. `invalid`: the known
    clusters whose own entry is malformed (never eligible, and not to be called busy).
    `unavailable`: those the feed reports stale, out of service, or with times out of step
    (never eligible; "busy" would send people looking at the cluster's load).
    """

    eligible: frozenset[str]
    known: frozenset[str]
    at: UtcTime
    error: str | None = None
    invalid: frozenset[str] = frozenset()
    unavailable: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Hold:
    family: str
    by: str
    reason: str
    at: UtcTime


@dataclass(frozen=True, slots=True)
class RetryApproval:
    candidate: str
    by: str
    at: UtcTime


@dataclass(frozen=True, slots=True)
class Claim:
    family: str
    candidate: str
    wave: int | None  # None when the ref was not made by Klaud's own wave (found on GitHub)
    ref: str
    at: UtcTime


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A candidate Klaud dispatched and whose outcome is not recorded yet.

    `run_id` links it to its run (from the dispatch's answer, or a run's title); when the
    claim TTL passes, the run is read and `run_status` / `checked_at` say what GitHub
    answered: a run still queued or running keeps the dispatch in flight until the next
    check, one TTL later.
    """

    family: str
    candidate: str
    wave: int
    base: str
    at: UtcTime
    run_id: int | None = None
    run_status: str | None = None
    checked_at: UtcTime | None = None
    # The `/klaud retry` this dispatch used, until its run is linked: given back should
    # the dispatch start no run (its answer lost, or the process stopped before sending it).
    approval: RetryApproval | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    family: str
    candidate: str
    decision: DecisionKind
    reason: str
    until: UtcTime | None = None
    pull_requests: tuple[int, ...] = ()
    clusters: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why a repository's waves select nothing: a dispatch pause or a setup error."""

    code: BlockCode
    reason: str
    since: UtcTime

    def document(self) -> dict[str, Any]:
        return {"code": self.code, "reason": self.reason, "since": stamp(self.since)}


@dataclass(frozen=True, slots=True)
class Wave:
    repo: str
    at: UtcTime
    base: str
    wave: int
    decisions: tuple[Decision, ...]
    blocked: Blocked | None = None

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> Wave:
        """A stored wave document read back (the inverse of `document`). One of another
        shape (written by hand, or not by Klaud) raises one of UNREADABLE_DOCUMENT: its
        values are checked here, as every reader of a wave counts, prints and compares them."""
        if not isinstance(document, dict):
            raise TypeError(f"a wave document is an object, not {type(document).__name__}")
        blocked = document.get("blocked")
        return cls(
            repo=_text(document["repo"]),
            at=_required_time(document["at"]),
            base=_text(document["base"]),
            wave=_whole(document["wave"]),
            decisions=tuple(
                Decision(
                    family=_text(d["family"]),
                    candidate=_text(d["candidate"]),
                    decision=cast(DecisionKind, _text(d["decision"])),
                    reason=_text(d["reason"]),
                    until=parse_time(d.get("until")),
                    pull_requests=tuple(_whole(n) for n in d.get("pull_requests") or ()),
                    clusters=tuple(_text(c) for c in d.get("clusters") or ()),
                )
                for d in document["decisions"]
            ),
            blocked=(
                Blocked(cast(BlockCode, _text(blocked["code"])), _text(blocked["reason"]), _required_time(blocked["since"]))
                if blocked else None
            ),
        )

    @property
    def selected(self) -> tuple[str, ...]:
        return tuple(d.candidate for d in self.decisions if d.decision == "selected")

    def document_head(self) -> dict[str, Any]:
        """The wave document without its decisions."""
        return {
            "repo": self.repo,
            "at": stamp(self.at),
            "base": self.base,
            "wave": self.wave,
            "selected": list(self.selected),
            "blocked": self.blocked.document() if self.blocked is not None else None,
        }

    def document(self) -> dict[str, Any]:
        """The wave document of DESIGN §3.4."""
        return {
            **self.document_head(),
            "decisions": [
                {
                    "family": d.family,
                    "candidate": d.candidate,
                    "decision": d.decision,
                    "reason": d.reason,
                    "until": stamp(d.until),
                    "pull_requests": list(d.pull_requests),
                    "clusters": list(d.clusters),
                }
                for d in self.decisions
            ],
        }


def code_span(text: str) -> str:
    """`text` as an inline code span that its own backticks cannot break."""
    flat = " ".join(text.split())
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    ticks = "`" * (longest + 1)
    padded = f" {flat} " if flat.startswith("`") or flat.endswith("`") else flat
    return f"{ticks}{padded}{ticks}"
