"""The outcome ledger's pure parts: verified candidate outcomes and the attempts built on them.

A candidate run reports how it ended in `candidate-diagnostics.json` inside its
`klaud-candidate-<id>` artifact (domain §8.5), and again in a completion receipt comment
on its pull request (domain §6.3, §8.6). Both carry a `CandidateOutcome` (domain §2.4).
This module validates them, turns them into `Attempt`s and indexes those for the cooldown
rule (DESIGN §4 "Outcomes", "Cooldown"). Downloading artifacts and listing comments happen
elsewhere; everything here works on bytes and text already in hand.

Artifact archives are untrusted input: only the one expected member at the archive root is
read, its size is capped both as declared and as actually inflated, and nothing is ever
written to disk.
"""

from __future__ import annotations

import io
import json
import random
import re
import struct
import zipfile
import zlib
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from bot.core.domain import (
    CANDIDATE_RE,
    NEUTRAL_OUTCOMES,
    RUN_FAILED_CONCLUSIONS,
    Attempt,
    Outcome,
    family_hash,
)
from bot.core.events import Job

MiB = 1024 * 1024
DIAGNOSTICS_MEMBER = "candidate-diagnostics.json"
MAX_MEMBER_BYTES = 8 * MiB
# upload-artifact writes one entry here; a few hundred leave room for what people add.
MAX_ENTRIES = 1000
MAX_ARCHIVE_BYTES = 64 * MiB
MAX_RUN_IDS = 256

# Every reason an artifact yields no verified outcome, mapped to whether trying again later
# can help. The reading codes are permanent because the same bytes give the same answer.
ERROR_CODES: dict[str, bool] = {
    "not-a-zip": False,
    "member-missing": False,
    "member-too-large": False,
    "unsafe-path": False,
    "invalid-json": False,
    "outcome-missing": False,
    "outcome-invalid": False,
    "artifact-expired": False,
    "artifact-not-found": False,
    "download-failed": True,  # network error, timeout or 5xx
    "download-refused": False,  # a 4xx other than 404, e.g. blob storage's 403 on a bad signature
    "download-too-large": False,  # archive over MAX_ARCHIVE_BYTES
    "artifact-missing": False,  # a run Klaud dispatched finished without the artifact
    "run-failed": False,  # a run Klaud dispatched failed before producing the artifact
    "too-many-entries": False,  # an archive listing more entries than an artifact needs
}
# An artifact the run left whose bytes hold no readable outcome: the run wrote it wrong, and
# the same run gives the same answer every time (unlike a refused or expired download).
UNREADABLE_CONTENT = frozenset({
    "not-a-zip", "member-missing", "member-too-large", "unsafe-path", "invalid-json",
    "outcome-missing", "outcome-invalid", "download-too-large", "too-many-entries",
})
# A finished run of Klaud's that gave no outcome through its own doing: once may be bad luck,
# twice in a row is a broken workflow (the cooldown counts them, DESIGN §4).
NO_OUTCOME = UNREADABLE_CONTENT | {"run-failed", "artifact-missing"}


class ArtifactError(Exception):
    """An artifact that yields no verified outcome; `code` is one of ERROR_CODES."""

    def __init__(self, code: str, detail: str) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown artifact error code {code!r}")
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail

    @property
    def transient(self) -> bool:
        return ERROR_CODES[self.code]


class ReceiptError(ValueError):
    """A comment carries the `klaud-outcome` marker but its payload cannot be trusted."""


# ---------------------------------------------------------------------------------------
# The CandidateOutcome contract (domain §2.4)


def _hyphenated(name: str) -> str:
    return name.replace("_", "-")


class Contract(BaseModel):
    """Common base of the previous system's models: all JSON uses hyphenated aliases."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        populate_by_name=True,
        alias_generator=_hyphenated,
    )


Phase = Literal["resolve", "baseline", "targeted", "final-sweep", "cleanup", "unknown"]
ReasonCode = Literal[
    "baseline-preflight-mismatch",
    "baseline-provenance-unverified",
    "baseline-point-mismatch",
    "baseline-eval-unverified",
    "baseline-api-unavailable",
    "baseline-other",
]


class CandidateOutcome(Contract):
    """The public-safe terminal outcome of one candidate session.

    Serialise with `model_dump(by_alias=True, exclude_unset=True)` like the previous system
    did, so `reason-code` only appears when it was set.
    """

    outcome: Outcome
    phase: Phase
    pull_request: PositiveInt | None
    run_ids: list[PositiveInt] = Field(max_length=MAX_RUN_IDS)
    repairs_used: NonNegativeInt | None
    reason_code: ReasonCode | None = None

    @field_validator("run_ids")
    @classmethod
    def _distinct_run_ids(cls, run_ids: list[int]) -> list[int]:
        repeated = sorted(r for r, n in Counter(run_ids).items() if n > 1)
        if repeated:
            raise ValueError(f"run ids must be distinct; repeated: {repeated}")
        return run_ids

    @model_validator(mode="after")
    def _consistent(self) -> CandidateOutcome:
        problem = _inconsistency(self)
        if problem is not None:
            raise ValueError(problem)
        return self


def _inconsistency(o: CandidateOutcome) -> str | None:
    """The first cross-field rule of domain §2.4 that `o` breaks, naming its fields."""
    if o.phase == "unknown" and o.outcome != "unexpected-error":
        return "phase 'unknown' is only allowed with outcome 'unexpected-error'"
    if o.outcome in ("validated", "handoff") and o.pull_request is None:
        return f"outcome '{o.outcome}' requires pull-request"
    if o.outcome == "validated" and not o.run_ids:
        return "outcome 'validated' requires non-empty run-ids"
    if o.outcome == "validated" and o.phase != "final-sweep":
        return "outcome 'validated' requires phase 'final-sweep'"
    # A failed baseline *without* a code is still accepted: historical receipts lack it.
    if o.reason_code is not None and (o.outcome, o.phase) != ("failed", "baseline"):
        return "reason-code is only allowed with outcome 'failed' in phase 'baseline'"
    return None


def _describe(error: ValidationError, root: str) -> str:
    """Name the failing fields by their JSON path, e.g. `candidate-outcome.run-ids.1`."""
    problems = []
    for item in error.errors(include_url=False)[:3]:
        path = ".".join([root, *(str(part) for part in item["loc"])])
        problems.append(f"{path}: {item['msg']}")
    return "; ".join(problems)


# ---------------------------------------------------------------------------------------
# Reading `candidate-diagnostics.json` out of an artifact archive

_LOCAL_HEADER_SIGNATURE = b"PK\x03\x04"
_LOCAL_HEADER_SIZE = 30
_ENCRYPTED_FLAG = 0x1
_UTF8_NAME_FLAG = 0x800
_PATH_SEPARATORS = re.compile(r"[\\/]")
_DRIVE_LETTER = re.compile(r"^[A-Za-z]:")


def read_outcome_artifact(
    data: bytes,
    *,
    member: str = DIAGNOSTICS_MEMBER,
    max_member_bytes: int = MAX_MEMBER_BYTES,
) -> CandidateOutcome:
    """The verified `candidate-outcome` of an artifact archive, or an ArtifactError."""
    document = _json_object(_read_member(data, member=member, max_bytes=max_member_bytes))
    if "candidate-outcome" not in document:
        raise ArtifactError("outcome-missing", f"{member} has no 'candidate-outcome' key")
    return _validated_outcome(document["candidate-outcome"])


def _validated_outcome(value: Any) -> CandidateOutcome:
    # The value comes from json.loads, so strict mode sees JSON's own types: a run id
    # written as "42" is rejected, as model_validate_json would.
    try:
        return CandidateOutcome.model_validate(value)
    except ValidationError as error:
        raise ArtifactError("outcome-invalid", _describe(error, "candidate-outcome")) from error


def _read_member(data: bytes, *, member: str, max_bytes: int) -> bytes:
    """The content of the archive-root entry named exactly `member`, at most `max_bytes`."""
    if len(data) > MAX_ARCHIVE_BYTES:
        raise ArtifactError(
            "download-too-large", f"archive is {len(data)} bytes, over {MAX_ARCHIVE_BYTES}"
        )
    info = _find_member(_open_archive(data).infolist(), member)
    if info.flag_bits & _ENCRYPTED_FLAG:
        raise ArtifactError("not-a-zip", f"{member} is encrypted")
    if info.file_size > max_bytes:
        raise ArtifactError(
            "member-too-large", f"{member} declares {info.file_size} bytes, over {max_bytes}"
        )
    content = _inflate(_stored_bytes(data, info), info, max_bytes)
    if len(content) != info.file_size or zlib.crc32(content) != info.CRC:
        raise ArtifactError("not-a-zip", f"{member} does not match its declared size and CRC")
    return content


def _open_archive(data: bytes) -> zipfile.ZipFile:
    # zipfile builds an object per entry of the central directory before anything can be
    # checked: an archive of a million tiny entries costs hundreds of MiB. The directory's
    # headers are counted first, where zipfile will read them (the end record's own count
    # is no bound: zipfile reads the directory by its size).
    entries = _directory_entries(data)
    if entries > MAX_ENTRIES:
        raise ArtifactError("too-many-entries", f"archive's central directory holds over {MAX_ENTRIES} entries")
    try:
        return zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, NotImplementedError, ValueError, OSError, EOFError) as error:
        raise ArtifactError("not-a-zip", str(error) or type(error).__name__) from error


_EOCD = struct.Struct("<4s4H2LH")  # end of central directory record
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
_CENTRAL_HEADER = struct.Struct("<4s24x3H12x")  # signature, then name/extra/comment lengths
_MAX_COMMENT = 1 << 16  # how far before the end zipfile looks for the end record


def _central_directory(data: bytes) -> tuple[int, int] | None:
    """Where zipfile reads the central directory: (the offset it ends at, its size), from
    the end record found as zipfile finds it (at the very end when it has no comment, else
    the last signature in the last 64 KiB), and from the zip64 record only when its locator
    and the record itself are both there. Found any other way, an end record whose counts
    spell its signature, or a stray locator, hid the directory zipfile reads."""
    at = len(data) - _EOCD.size
    if not (at >= 0 and data[at : at + 4] == b"PK\x05\x06" and data[-2:] == b"\x00\x00"):
        at = data.rfind(b"PK\x05\x06", max(0, len(data) - _MAX_COMMENT - _EOCD.size))
        if at < 0 or at + _EOCD.size > len(data):
            return None
    size = _EOCD.unpack_from(data, at)[5]
    locator_at = at - _ZIP64_LOCATOR.size
    record_at = locator_at - _ZIP64_EOCD.size
    if record_at >= 0 and data[locator_at : locator_at + 4] == b"PK\x06\x07" and data[record_at : record_at + 4] == b"PK\x06\x06":
        return record_at, int(_ZIP64_EOCD.unpack_from(data, record_at)[8])
    return at, int(size)


def _directory_entries(data: bytes) -> int:
    """How many headers the central directory holds where zipfile reads it, up to
    MAX_ENTRIES + 1 (0 without a directory: zipfile refuses the archive then)."""
    found = _central_directory(data)
    if found is None:
        return 0
    end, size = found
    start, entries = end - size, 0
    while 0 <= start < end and entries <= MAX_ENTRIES and start + _CENTRAL_HEADER.size <= len(data):
        signature, name, extra, comment = _CENTRAL_HEADER.unpack_from(data, start)
        if signature != b"PK\x01\x02":
            break  # zipfile refuses the archive there
        start += _CENTRAL_HEADER.size + name + extra + comment
        entries += 1
    return entries


def _find_member(infos: list[zipfile.ZipInfo], member: str) -> zipfile.ZipInfo:
    exact = [info for info in infos if info.filename == member]
    if len(exact) > 1:
        # upload-artifact never writes two entries with one name; tools disagree on which wins.
        raise ArtifactError("not-a-zip", f"archive holds {len(exact)} entries named {member}")
    if exact:
        return exact[0]
    unsafe = [info.filename for info in infos if _escapes_to(info.filename, member)]
    if unsafe:
        raise ArtifactError("unsafe-path", f"{member} is only reachable as {unsafe[0][:200]!r}")
    raise ArtifactError(
        "member-missing", f"no entry named {member} at the archive root ({len(infos)} entries)"
    )


def _escapes_to(name: str, member: str) -> bool:
    """Whether an entry would land on `member` only by leaving the extraction folder."""
    parts = _PATH_SEPARATORS.split(name)
    absolute = name.startswith(("/", "\\")) or bool(_DRIVE_LETTER.match(name))
    return parts[-1] == member and (absolute or ".." in parts)


def _stored_bytes(data: bytes, info: zipfile.ZipInfo) -> memoryview:
    """The member's raw (compressed) bytes, located through its local header."""
    start = info.header_offset
    header = data[start : start + _LOCAL_HEADER_SIZE]
    if len(header) < _LOCAL_HEADER_SIZE or header[:4] != _LOCAL_HEADER_SIGNATURE:
        raise ArtifactError("not-a-zip", f"{info.filename} has no valid local header")
    name_length, extra_length = struct.unpack_from("<HH", header, 26)
    name_start = start + _LOCAL_HEADER_SIZE
    encoding = "utf-8" if info.flag_bits & _UTF8_NAME_FLAG else "cp437"
    # A local name that differs from the central directory's is a known way to show
    # different tools different files.
    if data[name_start : name_start + name_length] != info.orig_filename.encode(encoding):
        raise ArtifactError("not-a-zip", f"local header of {info.filename} names another file")
    data_start = name_start + name_length + extra_length
    return memoryview(data)[data_start : data_start + info.compress_size]


def _inflate(raw: memoryview, info: zipfile.ZipInfo, max_bytes: int) -> bytes:
    """Decompress at most `max_bytes + 1` bytes: a bomb's headers lie about its size."""
    if info.compress_type == zipfile.ZIP_STORED:
        if len(raw) > max_bytes:
            raise ArtifactError("member-too-large", f"{info.filename} holds over {max_bytes} bytes")
        return bytes(raw)
    if info.compress_type != zipfile.ZIP_DEFLATED:
        raise ArtifactError(
            "not-a-zip", f"{info.filename} uses compression method {info.compress_type}"
        )
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        content = inflater.decompress(raw, max_bytes + 1)
    except zlib.error as error:
        raise ArtifactError("not-a-zip", f"{info.filename}: {error}") from error
    if len(content) > max_bytes:
        raise ArtifactError(
            "member-too-large",
            f"{info.filename} inflates past {max_bytes} bytes (declares {info.file_size})",
        )
    if not inflater.eof:
        raise ArtifactError("not-a-zip", f"{info.filename} is truncated")
    return content


def _json_object(content: bytes) -> dict[str, Any]:
    try:
        document = json.loads(content.decode("utf-8"))
    # ValueError: not UTF-8, not JSON, or an integer past Python's 4,300 digits.
    except (ValueError, RecursionError) as error:
        raise ArtifactError("invalid-json", str(error) or type(error).__name__) from error
    if not isinstance(document, dict):
        raise ArtifactError("invalid-json", f"top level is {type(document).__name__}, not object")
    return document


# ---------------------------------------------------------------------------------------
# Completion receipts (domain §6.3, §8.6)

RECEIPT_PREFIX = "<!-- klaud-outcome:"
_RECEIPT_MARKER = re.compile(
    r"<!-- klaud-outcome:(?P<parent>[1-9][0-9]*):(?P<candidate>[0-9a-f]{16}-[0-9a-f]{16})"
)
_RECEIPT_END = "\n-->"


class _ReceiptValidation(Contract):
    head: str
    run_id: PositiveInt
    run_attempt: PositiveInt


class _ReceiptPayload(Contract):
    head: str = Field(min_length=1)
    outcome: CandidateOutcome
    validation: _ReceiptValidation | None = None


@dataclass(frozen=True, slots=True)
class Receipt:
    """A completion receipt; `head` is the PR head it was written for."""

    parent_run_id: int
    candidate: str
    head: str
    outcome: CandidateOutcome


def parse_receipt(body: str) -> Receipt | None:
    """The receipt in a comment body, None when it has no `klaud-outcome` marker.

    Whether the comment's author may post receipts (a bot login) is the caller's check.
    """
    text = body.replace("\r\n", "\n")
    first_line = text.partition("\n")[0]
    if not first_line.startswith(RECEIPT_PREFIX):
        return None
    marker = _RECEIPT_MARKER.fullmatch(first_line.rstrip())
    if marker is None:
        raise ReceiptError(f"malformed klaud-outcome marker {first_line[:120]!r}")
    payload, end, _ = text[len(first_line) :].partition(_RECEIPT_END)
    if not end:
        raise ReceiptError("klaud-outcome marker is never closed by a '-->' line")
    try:
        receipt = _ReceiptPayload.model_validate_json(payload)
    except ValidationError as error:
        raise ReceiptError(_describe(error, "receipt")) from error
    return Receipt(
        parent_run_id=int(marker["parent"]),
        candidate=marker["candidate"],
        head=receipt.head,
        outcome=receipt.outcome,
    )


# ---------------------------------------------------------------------------------------
# Attempts


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The finished workflow run an attempt belongs to; `head_sha` is the candidate's base."""

    run_id: int
    run_attempt: int
    head_sha: str | None
    completed_at: datetime


def attempt_from_outcome(
    candidate: str,
    family: str | None,
    run: RunInfo,
    outcome: CandidateOutcome,
    source: Literal["artifact", "receipt"],
) -> Attempt:
    return _attempt(
        candidate, family, run,
        verified=True, outcome=outcome.outcome, phase=outcome.phase, pull_request=outcome.pull_request,
        reason_code=outcome.reason_code, error=None, source=source,
    )


def unverified_attempt(
    candidate: str, family: str | None, run: RunInfo, error_code: str
) -> Attempt:
    """A finished run whose outcome could not be read; all we know comes from the run."""
    if error_code not in ERROR_CODES:
        raise ValueError(f"unknown artifact error code {error_code!r}")
    return _attempt(
        candidate, family, run,
        verified=False, outcome=None, phase=None, pull_request=None, reason_code=None,
        error=error_code, source="run",
    )


def run_failed_attempt(
    candidate: str, family: str | None, run: RunInfo, jobs: Sequence[Job]
) -> Attempt:
    """A dispatched run that failed before its artifact existed, naming where it failed."""
    job, step = first_failure(jobs)
    return _attempt(
        candidate, family, run,
        verified=False, outcome=None, phase=None, pull_request=None, reason_code=None,
        error="run-failed", source="run", failed_job=job, failed_step=step,
    )


def first_failure(jobs: Sequence[Job]) -> tuple[str | None, str | None]:
    """The first job that did not succeed, and its first such step (None when unknown)."""
    for job in jobs:
        if job.conclusion in RUN_FAILED_CONCLUSIONS:
            step = next((s.name for s in job.steps if s.conclusion in RUN_FAILED_CONCLUSIONS), None)
            return job.name, step
    return None, None


def _attempt(candidate: str, family: str | None, run: RunInfo, **outcome_fields: Any) -> Attempt:
    """The attempt of `run` for `candidate`; the run gives its id, attempt, base and time."""
    _check_owner(candidate, family)
    return Attempt(
        candidate=candidate,
        family=family,
        run_id=run.run_id,
        run_attempt=run.run_attempt,
        base=run.head_sha,
        completed_at=run.completed_at,
        **outcome_fields,
    )


def _check_owner(candidate: str, family: str | None) -> None:
    if not CANDIDATE_RE.match(candidate):
        raise ValueError(f"not a candidate id: {candidate!r}")
    if family is not None and family_hash(family) != candidate[:16]:
        raise ValueError(f"candidate {candidate} does not belong to family {family}")


def _newest_first(attempts: Iterable[Attempt]) -> list[Attempt]:
    return sorted(
        attempts, key=lambda a: (a.completed_at, a.run_id, a.run_attempt), reverse=True
    )


def _precedence(attempt: Attempt) -> tuple[bool, bool]:
    # An artifact's run also knows the base, which a receipt does not.
    return (attempt.verified, attempt.source == "artifact")


class OutcomeLedger:
    """Attempts indexed by candidate, one per (candidate, run id, run attempt).

    A receipt and an artifact for the same run are the same attempt: a verified one
    replaces an unverified one and never the reverse; between two verified ones the
    artifact wins. Anything else replaces what was there, so a later error code (say
    `artifact-expired` after `download-failed`) is kept.
    """

    __slots__ = ("_ordered", "_runs_by_candidate")

    def __init__(self, attempts: Iterable[Attempt] = ()) -> None:
        self._runs_by_candidate: dict[str, dict[tuple[int, int], Attempt]] = {}
        # Newest-first lists, built on first read and dropped when the candidate changes:
        # a wave reads every candidate, events change a few.
        self._ordered: dict[str, list[Attempt]] = {}
        for attempt in attempts:
            self.add(attempt)

    def __len__(self) -> int:
        return sum(len(runs) for runs in self._runs_by_candidate.values())

    def would_change(self, attempt: Attempt) -> bool:
        """Whether `add(attempt)` would change the ledger: its run is new, or it says more."""
        current = self._runs_by_candidate.get(attempt.candidate, {}).get((attempt.run_id, attempt.run_attempt))
        return current is None or (current != attempt and _precedence(attempt) >= _precedence(current))

    def add(self, attempt: Attempt) -> bool:
        """Record `attempt`; True when the ledger changed."""
        if not self.would_change(attempt):
            return False
        runs = self._runs_by_candidate.setdefault(attempt.candidate, {})
        runs[(attempt.run_id, attempt.run_attempt)] = attempt
        self._ordered.pop(attempt.candidate, None)
        return True

    def forget_before(self, cutoff: datetime, keep: Collection[str] = ()) -> int:
        """Drop the attempts that completed before `cutoff`, but those of the candidates in
        `keep`; how many went."""
        forgotten = 0
        for candidate in [c for c in self._runs_by_candidate if c not in keep]:
            runs = self._runs_by_candidate[candidate]
            old = [key for key, attempt in runs.items() if attempt.completed_at < cutoff]
            for key in old:
                del runs[key]
            if old:
                forgotten += len(old)
                self._ordered.pop(candidate, None)
            if not runs:
                del self._runs_by_candidate[candidate]
        return forgotten

    def _newest(self, candidate: str) -> list[Attempt]:
        runs = self._runs_by_candidate.get(candidate)
        # Not cached without runs: every plan reads every family's candidate, and each image
        # bump makes a new one, so its empty list would stay for good (`forget_before` and
        # `add` drop the lists of candidates with runs only).
        if not runs:
            return []
        ordered = self._ordered.get(candidate)
        if ordered is None:
            ordered = self._ordered[candidate] = _newest_first(runs.values())
        return ordered

    def knows_run(self, candidate: str, run_id: int) -> bool:
        """Whether an attempt of run `run_id` (any of its run attempts) is recorded."""
        return any(key[0] == run_id for key in self._runs_by_candidate.get(candidate, {}))

    def for_candidate(self, candidate: str) -> list[Attempt]:
        return list(self._newest(candidate))

    def recent(self, candidate: str, since: datetime) -> list[Attempt]:
        """Newest first, the attempts that completed after `since` (the planner's lookup)."""
        ordered = self._newest(candidate)
        for index, attempt in enumerate(ordered):
            if attempt.completed_at <= since:
                return ordered[:index]
        return list(ordered)

    def recent_for(self, candidates: Iterable[str], since: datetime) -> dict[str, list[Attempt]]:
        """Candidate -> `recent(candidate, since)`, for those of `candidates` that have any."""
        found: dict[str, list[Attempt]] = {}
        for candidate in candidates:
            if candidate in self._runs_by_candidate:
                attempts = self.recent(candidate, since)
                if attempts:
                    found[candidate] = attempts
        return found

    def all(self) -> list[Attempt]:
        return _newest_first(
            a for runs in self._runs_by_candidate.values() for a in runs.values()
        )


# ---------------------------------------------------------------------------------------
# Retrying transient artifact failures

RETRY_FIRST_DELAY = timedelta(minutes=1)
RETRY_MAX_DELAY = timedelta(hours=6)
# DESIGN §4: retried "while the artifact can still exist": a candidate's artifact is kept
# 14 days (domain §4); one that expires sooner ends the retries with its non-transient answer.
RETRY_WINDOW = timedelta(days=14)


def next_retry_at(
    first_failure_at: datetime,
    failures_so_far: int,
    now: datetime,
    *,
    rng: random.Random,
) -> datetime | None:
    """When to try a transiently failed artifact again; None once the window has passed.

    The wait doubles from one minute up to six hours. It is drawn from the upper half of
    the nominal delay so artifacts that failed together in one outage spread out, yet no
    wait ever exceeds the nominal one. The last try lands on the window's end.
    """
    if failures_so_far < 1:
        raise ValueError("next_retry_at needs at least one failure")
    deadline = first_failure_at + RETRY_WINDOW
    if now >= deadline:
        return None
    nominal = min(RETRY_FIRST_DELAY * 2 ** min(failures_so_far - 1, 20), RETRY_MAX_DELAY)
    due: datetime = now + nominal * rng.uniform(0.5, 1.0)
    return min(due, deadline)


# ---------------------------------------------------------------------------------------
# Check run


def check_conclusion(outcome: Outcome) -> Literal["success", "neutral", "failure"]:
    """The Klaud check run's conclusion for a finished candidate (DESIGN §4 "Check run")."""
    if outcome == "validated":
        return "success"
    if outcome in NEUTRAL_OUTCOMES:
        return "neutral"
    return "failure"
