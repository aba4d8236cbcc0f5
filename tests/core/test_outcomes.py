"""The outcome ledger's pure parts: the CandidateOutcome contract, artifact and receipt
reading, attempts, the ledger index, the retry schedule and check conclusions."""

from __future__ import annotations

import io
import json
import random
import struct
import zipfile
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import ValidationError

from bot.core import outcomes
from bot.core.domain import NEUTRAL_OUTCOMES, Attempt, Outcome, candidate_id
from bot.core.events import Job, Step
from bot.core.outcomes import (
    ERROR_CODES,
    MAX_ARCHIVE_BYTES,
    MAX_ENTRIES,
    MAX_MEMBER_BYTES,
    ArtifactError,
    CandidateOutcome,
    OutcomeLedger,
    ReceiptError,
    RunInfo,
    attempt_from_outcome,
    check_conclusion,
    first_failure,
    next_retry_at,
    parse_receipt,
    read_outcome_artifact,
    run_failed_attempt,
    unverified_attempt,
)

DATA = Path(__file__).parent / "data" / "outcomes"
MEMBER = "candidate-diagnostics.json"
FAMILY = "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"
OTHER_FAMILY = "configs/amd-master.yaml:dsr1-fp8-mi355x-sglang"
CANDIDATE = candidate_id(FAMILY, "lmsysorg/sglang:v0.5.16-cu130")
NEXT_CANDIDATE = candidate_id(FAMILY, "lmsysorg/sglang:v0.5.17-cu130")
OTHER_CANDIDATE = candidate_id(OTHER_FAMILY, "lmsysorg/sglang:v0.5.16-rocm700")
T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def outcome_doc(**changes: Any) -> dict[str, Any]:
    """A valid `candidate-outcome` by alias; `changes` use aliases, None-valued keys removed."""
    doc: dict[str, Any] = {
        "outcome": "failed",
        "phase": "targeted",
        "pull-request": 4077,
        "run-ids": [28123999001],
        "repairs-used": 5,
    }
    doc.update(changes)
    return doc


def without(doc: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != key}


def diagnostics(outcome: Any) -> bytes:
    return json.dumps({"action-outcome": "success", "candidate-outcome": outcome}).encode()


def zip_of(entries: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, content in entries.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def hand_made_zip(
    name: str,
    stored: bytes,
    *,
    crc: int,
    declared_size: int,
    method: int = zipfile.ZIP_DEFLATED,
    flags: int = 0,
    local_name: str | None = None,
) -> bytes:
    """One-member archive whose headers say whatever the test wants, true or not."""
    central_name = name.encode()
    local = (local_name or name).encode()
    local_header = struct.pack(
        "<4sHHHHHIIIHH", b"PK\x03\x04", 20, flags, method, 0, 0x21,
        crc, len(stored), declared_size, len(local), 0,
    )
    central_header = struct.pack(
        "<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, flags, method, 0, 0x21,
        crc, len(stored), declared_size, len(central_name), 0, 0, 0, 0, 0, 0,
    )
    body = local_header + local + stored
    directory = central_header + central_name
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(directory), len(body), 0)
    return body + directory + end


def deflated(content: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(content) + compressor.flush()


def artifact_error(data: bytes, **kwargs: Any) -> ArtifactError:
    with pytest.raises(ArtifactError) as caught:
        read_outcome_artifact(data, **kwargs)
    return caught.value


# --- CandidateOutcome --------------------------------------------------------------------


VALID_OUTCOMES = {
    "validated": outcome_doc(
        outcome="validated", phase="final-sweep", **{"run-ids": [1, 2], "repairs-used": 1}
    ),
    "handoff without repairs": outcome_doc(
        outcome="handoff", phase="cleanup", **{"repairs-used": None}
    ),
    "unexpected-error fallback": outcome_doc(
        outcome="unexpected-error",
        phase="unknown",
        **{"pull-request": None, "run-ids": [], "repairs-used": None},
    ),
    "failed baseline with code": outcome_doc(
        phase="baseline", **{"reason-code": "baseline-point-mismatch", "run-ids": []}
    ),
    "historical failed baseline without code": outcome_doc(phase="baseline"),
    "reason-code explicitly null elsewhere": outcome_doc(**{"reason-code": None}),
    "capacity-deferred without PR": outcome_doc(
        outcome="capacity-deferred", phase="resolve", **{"pull-request": None, "run-ids": []}
    ),
    "256 run ids": outcome_doc(**{"run-ids": list(range(1, 257))}),
}


@pytest.mark.parametrize("doc", VALID_OUTCOMES.values(), ids=VALID_OUTCOMES.keys())
def test_valid_outcomes_are_accepted(doc: dict[str, Any]) -> None:
    parsed = CandidateOutcome.model_validate_json(json.dumps(doc))

    assert parsed.outcome == doc["outcome"]
    assert parsed.phase == doc["phase"]
    assert parsed.run_ids == doc["run-ids"]
    assert parsed.reason_code == doc.get("reason-code")


INVALID_OUTCOMES = {
    "phase unknown for failed": (outcome_doc(phase="unknown"), "phase 'unknown'"),
    "validated without PR": (
        outcome_doc(outcome="validated", phase="final-sweep", **{"pull-request": None}),
        "requires pull-request",
    ),
    "handoff without PR": (
        outcome_doc(outcome="handoff", phase="cleanup", **{"pull-request": None}),
        "requires pull-request",
    ),
    "validated without runs": (
        outcome_doc(outcome="validated", phase="final-sweep", **{"run-ids": []}),
        "requires non-empty run-ids",
    ),
    "validated outside final-sweep": (
        outcome_doc(outcome="validated", phase="cleanup"),
        "requires phase 'final-sweep'",
    ),
    "repeated run id": (outcome_doc(**{"run-ids": [7, 8, 7]}), "repeated: [7]"),
    "run id zero": (outcome_doc(**{"run-ids": [0]}), "greater than 0"),
    "negative run id": (outcome_doc(**{"run-ids": [3, -1]}), "greater than 0"),
    "257 run ids": (outcome_doc(**{"run-ids": list(range(1, 258))}), "at most 256"),
    "pull request zero": (outcome_doc(**{"pull-request": 0}), "greater than 0"),
    "negative repairs": (outcome_doc(**{"repairs-used": -1}), "greater than or equal to 0"),
    "reason-code outside baseline": (
        outcome_doc(**{"reason-code": "baseline-other"}),
        "reason-code is only allowed",
    ),
    "reason-code on another outcome": (
        outcome_doc(outcome="uncertain", phase="baseline", **{"reason-code": "baseline-other"}),
        "reason-code is only allowed",
    ),
    "unknown reason-code": (
        outcome_doc(phase="baseline", **{"reason-code": "flaky"}),
        "Input should be",
    ),
    "unknown outcome": (outcome_doc(outcome="success"), "Input should be"),
    "unknown phase": (outcome_doc(phase="review"), "Input should be"),
    "extra key": (outcome_doc(note="hi"), "Extra inputs are not permitted"),
    "missing repairs-used": (without(outcome_doc(), "repairs-used"), "Field required"),
    "missing pull-request": (without(outcome_doc(), "pull-request"), "Field required"),
}


@pytest.mark.parametrize(
    ("doc", "message"), INVALID_OUTCOMES.values(), ids=INVALID_OUTCOMES.keys()
)
def test_invalid_outcomes_are_rejected(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        CandidateOutcome.model_validate_json(json.dumps(doc))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("pull-request", "4077"),
        ("run-ids", ["28123999001"]),
        ("repairs-used", "0"),
        ("repairs-used", True),
        ("repairs-used", 1.0),
    ],
)
def test_strict_mode_rejects_lookalike_json_values(key: str, value: Any) -> None:
    text = json.dumps(outcome_doc(**{key: value}))

    with pytest.raises(ValidationError):
        CandidateOutcome.model_validate_json(text)
    with pytest.raises(ValidationError):
        CandidateOutcome.model_validate(json.loads(text))
    error = artifact_error(zip_of({MEMBER: diagnostics(json.loads(text))}))
    assert error.code == "outcome-invalid"
    assert key in error.detail


def test_strict_mode_accepts_json_integers() -> None:
    parsed = read_outcome_artifact(zip_of({MEMBER: diagnostics(outcome_doc())}))

    assert parsed.pull_request == 4077
    assert parsed.repairs_used == 5


def test_aliases_in_and_out() -> None:
    by_name = CandidateOutcome(
        outcome="failed", phase="targeted", pull_request=12, run_ids=[3], repairs_used=0
    )
    by_alias = CandidateOutcome.model_validate(
        {"outcome": "failed", "phase": "targeted", "pull-request": 12, "run-ids": [3],
         "repairs-used": 0}
    )

    assert by_name == by_alias
    assert by_name.model_dump(by_alias=True, exclude_unset=True) == {
        "outcome": "failed", "phase": "targeted", "pull-request": 12, "run-ids": [3],
        "repairs-used": 0,
    }
    assert "reason-code" in by_name.model_dump(by_alias=True)


def test_reason_code_is_dumped_when_set() -> None:
    outcome = CandidateOutcome.model_validate(
        outcome_doc(phase="baseline", **{"reason-code": "baseline-eval-unverified"})
    )

    dumped = json.loads(outcome.model_dump_json(by_alias=True, exclude_unset=True))
    assert dumped["reason-code"] == "baseline-eval-unverified"
    assert CandidateOutcome.model_validate_json(json.dumps(dumped)) == outcome


# --- reading artifacts -------------------------------------------------------------------


def test_domain_example_diagnostics_parse() -> None:
    archive = zip_of({MEMBER: (DATA / "candidate-diagnostics.json").read_bytes()})

    outcome = read_outcome_artifact(archive)

    assert outcome == CandidateOutcome(
        outcome="capacity-deferred",
        phase="targeted",
        pull_request=4077,
        run_ids=[28123999001],
        repairs_used=0,
    )


def test_stored_member_and_other_entries_are_fine() -> None:
    archive = zip_of(
        {"notes.txt": b"hello", MEMBER: diagnostics(outcome_doc())}, zipfile.ZIP_STORED
    )

    assert read_outcome_artifact(archive).outcome == "failed"


def test_root_member_is_read_even_beside_a_traversal_entry() -> None:
    archive = zip_of(
        {
            f"../{MEMBER}": diagnostics(outcome_doc(outcome="uncertain")),
            MEMBER: diagnostics(outcome_doc()),
        }
    )

    assert read_outcome_artifact(archive).outcome == "failed"


def test_custom_member_name() -> None:
    archive = zip_of({"outcome.json": diagnostics(outcome_doc())})

    assert read_outcome_artifact(archive, member="outcome.json").outcome == "failed"
    assert artifact_error(archive).code == "member-missing"


def good_archive() -> bytes:
    return zip_of({MEMBER: diagnostics(outcome_doc())})


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"this is not a zip at all",
        json.dumps({"candidate-outcome": outcome_doc()}).encode(),
        good_archive()[: len(good_archive()) // 2],
        good_archive()[:-1],
    ],
    ids=["empty", "text", "bare json", "truncated half", "truncated end"],
)
def test_not_a_zip(data: bytes) -> None:
    assert artifact_error(data).code == "not-a-zip"


def test_corrupt_member_data_is_not_a_zip() -> None:
    content = diagnostics(outcome_doc())
    stored = bytearray(deflated(content))
    stored[len(stored) // 2] ^= 0xFF
    archive = hand_made_zip(
        MEMBER, bytes(stored), crc=zlib.crc32(content), declared_size=len(content)
    )

    assert artifact_error(archive).code == "not-a-zip"


def test_truncated_member_stream_is_not_a_zip() -> None:
    content = diagnostics(outcome_doc()) * 50
    stored = deflated(content)
    archive = hand_made_zip(
        MEMBER, stored[: len(stored) // 2], crc=zlib.crc32(content), declared_size=len(content)
    )

    error = artifact_error(archive)
    assert error.code == "not-a-zip"
    assert "truncated" in error.detail


def test_encrypted_member_is_refused() -> None:
    content = diagnostics(outcome_doc())
    archive = hand_made_zip(
        MEMBER, deflated(content), crc=zlib.crc32(content), declared_size=len(content), flags=1
    )

    error = artifact_error(archive)
    assert (error.code, error.detail) == ("not-a-zip", f"{MEMBER} is encrypted")


def test_local_header_naming_another_file_is_refused() -> None:
    content = diagnostics(outcome_doc())
    archive = hand_made_zip(
        MEMBER,
        deflated(content),
        crc=zlib.crc32(content),
        declared_size=len(content),
        local_name="evil.json",
    )

    assert artifact_error(archive).code == "not-a-zip"


def test_unsupported_compression_is_refused() -> None:
    archive = zip_of({MEMBER: diagnostics(outcome_doc())}, zipfile.ZIP_BZIP2)

    error = artifact_error(archive)
    assert error.code == "not-a-zip"
    assert "compression method 12" in error.detail


def test_two_root_members_with_one_name_are_refused() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(MEMBER, diagnostics(outcome_doc()))
        with pytest.warns(UserWarning, match="Duplicate"):
            archive.writestr(MEMBER, diagnostics(outcome_doc(outcome="uncertain")))

    assert artifact_error(buffer.getvalue()).code == "not-a-zip"


@pytest.mark.parametrize(
    "entries",
    [{"notes.txt": b"hi"}, {f"klaud/{MEMBER}": diagnostics(outcome_doc())}, {}],
    ids=["other file", "subfolder only", "empty archive"],
)
def test_member_missing(entries: dict[str, bytes]) -> None:
    assert artifact_error(zip_of(entries)).code == "member-missing"


@pytest.mark.parametrize(
    "name",
    [f"../{MEMBER}", f"/{MEMBER}", f"a/../../{MEMBER}", f"..\\{MEMBER}", f"C:/{MEMBER}"],
)
def test_member_only_behind_an_unsafe_path(name: str) -> None:
    error = artifact_error(zip_of({name: diagnostics(outcome_doc())}))

    assert error.code == "unsafe-path"
    assert repr(name) in error.detail


def test_member_over_a_custom_cap() -> None:
    error = artifact_error(good_archive(), max_member_bytes=16)

    assert error.code == "member-too-large"
    assert "declares" in error.detail


def test_stored_member_lying_about_its_size() -> None:
    content = diagnostics(outcome_doc()) * 10
    archive = hand_made_zip(
        MEMBER, content, crc=zlib.crc32(content), declared_size=10, method=zipfile.ZIP_STORED
    )

    assert artifact_error(archive, max_member_bytes=100).code == "member-too-large"


def test_member_smaller_than_declared_is_corrupt() -> None:
    content = diagnostics(outcome_doc())
    archive = hand_made_zip(
        MEMBER, deflated(content), crc=zlib.crc32(content), declared_size=len(content) + 1
    )

    assert artifact_error(archive).code == "not-a-zip"


def test_archive_over_the_download_cap() -> None:
    assert artifact_error(bytes(MAX_ARCHIVE_BYTES + 1)).code == "download-too-large"


BOMB_SIZE = 100 * 1024 * 1024


@pytest.fixture(scope="module")
def bomb() -> tuple[bytes, int]:
    """100 MB of zeros deflated to about 100 KB, with its CRC."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    chunk = bytes(1024 * 1024)
    parts, crc = [], 0
    for _ in range(BOMB_SIZE // len(chunk)):
        parts.append(compressor.compress(chunk))
        crc = zlib.crc32(chunk, crc)
    parts.append(compressor.flush())
    return b"".join(parts), crc


class InflationMeter:
    """Wraps zlib.decompressobj to count every byte any decompressor hands out."""

    def __init__(self) -> None:
        self.inflated = 0
        self._real = zlib.decompressobj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _MeteredInflater(self, self._real(*args, **kwargs))


class _MeteredInflater:
    def __init__(self, meter: InflationMeter, inner: Any) -> None:
        self._meter, self._inner = meter, inner

    def decompress(self, *args: Any, **kwargs: Any) -> bytes:
        out = self._inner.decompress(*args, **kwargs)
        self._meter.inflated += len(out)
        return out

    def flush(self, *args: Any) -> bytes:
        out = self._inner.flush(*args)
        self._meter.inflated += len(out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_bomb_with_an_honest_header_is_refused_by_its_declared_size(
    bomb: tuple[bytes, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    stored, crc = bomb
    meter = InflationMeter()
    monkeypatch.setattr(zlib, "decompressobj", meter)

    error = artifact_error(hand_made_zip(MEMBER, stored, crc=crc, declared_size=BOMB_SIZE))

    assert error.code == "member-too-large"
    assert f"declares {BOMB_SIZE}" in error.detail
    assert meter.inflated == 0


def test_bomb_lying_about_its_size_stops_inflating_at_the_cap(
    bomb: tuple[bytes, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    stored, crc = bomb
    meter = InflationMeter()
    monkeypatch.setattr(zlib, "decompressobj", meter)

    error = artifact_error(hand_made_zip(MEMBER, stored, crc=crc, declared_size=1000))

    assert error.code == "member-too-large"
    assert f"inflates past {MAX_MEMBER_BYTES}" in error.detail
    assert 0 < meter.inflated <= MAX_MEMBER_BYTES + 1


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"candidate-outcome": ', b"\xff\xfe\x00", b"", b"[" * 100_000, b'{"run": ' + b"7" * 5_000 + b"}"],
    ids=["broken", "cut short", "not utf-8", "empty", "nested too deep", "an integer past 4,300 digits"],
)
def test_invalid_json(content: bytes) -> None:
    assert artifact_error(zip_of({MEMBER: content})).code == "invalid-json"


@pytest.mark.parametrize("document", [[outcome_doc()], "candidate-outcome", None, 42])
def test_json_that_is_not_an_object(document: Any) -> None:
    error = artifact_error(zip_of({MEMBER: json.dumps(document).encode()}))

    assert error.code == "invalid-json"
    assert "not object" in error.detail


def test_outcome_missing() -> None:
    document = json.dumps({"action-outcome": "failure", "outcome-error": "receipt-invalid"})

    assert artifact_error(zip_of({MEMBER: document.encode()})).code == "outcome-missing"


@pytest.mark.parametrize(
    ("outcome", "names"),
    [
        (outcome_doc(**{"run-ids": [5, 0]}), "candidate-outcome.run-ids.1"),
        (without(outcome_doc(), "phase"), "candidate-outcome.phase"),
        (outcome_doc(phase="unknown"), "phase 'unknown'"),
        (None, "candidate-outcome"),
        ("validated", "candidate-outcome"),
    ],
)
def test_schema_invalid_outcome_names_the_field(outcome: Any, names: str) -> None:
    error = artifact_error(zip_of({MEMBER: diagnostics(outcome)}))

    assert error.code == "outcome-invalid"
    assert names in error.detail


def test_error_codes_and_transience() -> None:
    assert set(ERROR_CODES) == {
        "not-a-zip", "member-missing", "member-too-large", "unsafe-path", "invalid-json",
        "outcome-missing", "outcome-invalid", "artifact-expired", "artifact-not-found",
        "download-failed", "download-refused", "download-too-large", "artifact-missing", "run-failed",
        "too-many-entries",
    }
    assert [code for code, transient in ERROR_CODES.items() if transient] == ["download-failed"]
    assert ArtifactError("download-failed", "502").transient
    assert not ArtifactError("artifact-expired", "410").transient


def test_unknown_error_codes_are_bugs() -> None:
    with pytest.raises(ValueError, match="unknown artifact error code"):
        ArtifactError("oops", "detail")


# --- receipts ----------------------------------------------------------------------------


def receipt_body(payload: str, candidate: str = CANDIDATE, parent: str = "28123456789") -> str:
    return f"<!-- klaud-outcome:{parent}:{candidate}\n{payload}\n-->\n**failed** · Reason: …"


def test_domain_example_receipt_parses() -> None:
    receipt = parse_receipt((DATA / "receipt-failed-baseline.md").read_text())

    assert receipt is not None
    assert receipt.parent_run_id == 28123456789
    assert receipt.candidate == "d92e15065c55779d-555679de269db36f"
    assert receipt.head == "5e6f…3e4f"
    assert receipt.outcome == CandidateOutcome(
        outcome="failed",
        phase="baseline",
        pull_request=4077,
        run_ids=[],
        repairs_used=0,
        reason_code="baseline-provenance-unverified",
    )


def test_validated_receipt_with_multiline_json_and_crlf() -> None:
    payload = json.dumps(
        {
            "head": "a" * 40,
            "outcome": outcome_doc(outcome="validated", phase="final-sweep"),
            "validation": {"head": "a" * 40, "run-id": 28123999001, "run-attempt": 2},
        },
        indent=2,
    )
    body = receipt_body(payload).replace("\n", "\r\n")

    receipt = parse_receipt(body)

    assert receipt is not None
    assert receipt.outcome.outcome == "validated"
    assert receipt.head == "a" * 40


def test_receipt_without_validation_key_is_read() -> None:
    receipt = parse_receipt(receipt_body(json.dumps({"head": "b" * 40, "outcome": outcome_doc()})))

    assert receipt is not None and receipt.outcome.outcome == "failed"


@pytest.mark.parametrize(
    "body",
    [
        "",
        "Looks good to me",
        f"/klaud retry {CANDIDATE}",
        f"Note\n<!-- klaud-outcome:1:{CANDIDATE}\n{{}}\n-->",
        f"<!-- klaud-cleanup:1:{CANDIDATE}\n{{}}\n-->",
        f"<!-- klaud-report:1:{CANDIDATE}:run-5-1\n{{}}\n-->",
        "<!-- klaud-command:123 -->",
    ],
    ids=["empty", "text", "command", "marker not first", "cleanup", "report", "command reply"],
)
def test_comment_without_outcome_marker_is_no_receipt(body: str) -> None:
    assert parse_receipt(body) is None


VALID_PAYLOAD = json.dumps({"head": "c" * 40, "outcome": outcome_doc(), "validation": None})
BROKEN_RECEIPTS = {
    "broken json": receipt_body('{"head": "x", "outcome": '),
    "no closing": receipt_body(VALID_PAYLOAD).replace("\n-->", ""),
    "schema": receipt_body(
        json.dumps({"head": "x", "outcome": outcome_doc(outcome="validated", phase="final-sweep",
                                                        **{"pull-request": None})})
    ),
    "string run id": receipt_body(
        json.dumps({"head": "x", "outcome": outcome_doc(**{"run-ids": ["1"]})})
    ),
    "extra key": receipt_body(json.dumps({"head": "x", "outcome": outcome_doc(), "more": 1})),
    "empty head": receipt_body(json.dumps({"head": "", "outcome": outcome_doc()})),
    "bad validation": receipt_body(
        json.dumps({"head": "x", "outcome": outcome_doc(),
                    "validation": {"head": "x", "run-id": 0, "run-attempt": 1}})
    ),
    "short candidate": receipt_body(VALID_PAYLOAD, candidate="d92e15065c55779d"),
    "parent not a number": receipt_body(VALID_PAYLOAD, parent="abc"),
    "single line marker": f"<!-- klaud-outcome:1:{CANDIDATE} -->",
}


@pytest.mark.parametrize("body", BROKEN_RECEIPTS.values(), ids=BROKEN_RECEIPTS.keys())
def test_broken_receipt_raises(body: str) -> None:
    with pytest.raises(ReceiptError):
        parse_receipt(body)


def test_receipt_error_names_the_field() -> None:
    body = receipt_body(json.dumps({"head": "x", "outcome": outcome_doc(**{"run-ids": [0]})}))

    with pytest.raises(ReceiptError, match=r"receipt\.outcome\.run-ids\.0"):
        parse_receipt(body)


# --- attempts ----------------------------------------------------------------------------


def run(run_id: int = 100, run_attempt: int = 1, at: datetime = T0) -> RunInfo:
    return RunInfo(run_id=run_id, run_attempt=run_attempt, head_sha="f" * 40, completed_at=at)


def verified(
    candidate: str = CANDIDATE,
    run_id: int = 100,
    run_attempt: int = 1,
    at: datetime = T0,
    outcome: str = "failed",
    source: str = "artifact",
    family: str | None = FAMILY,
) -> Attempt:
    parsed = CandidateOutcome.model_validate(
        outcome_doc(outcome=outcome, phase="cleanup" if outcome == "handoff" else "targeted")
    )
    return attempt_from_outcome(
        candidate, family, run(run_id, run_attempt, at), parsed, source  # type: ignore[arg-type]
    )


def unverified(
    candidate: str = CANDIDATE,
    run_id: int = 100,
    run_attempt: int = 1,
    at: datetime = T0,
    error: str = "download-failed",
) -> Attempt:
    return unverified_attempt(candidate, FAMILY, run(run_id, run_attempt, at), error)


def test_attempt_from_outcome_copies_run_and_outcome() -> None:
    outcome = CandidateOutcome.model_validate(
        outcome_doc(phase="baseline", **{"reason-code": "baseline-other"})
    )

    attempt = attempt_from_outcome(CANDIDATE, FAMILY, run(42, 3), outcome, "receipt")

    assert attempt == Attempt(
        candidate=CANDIDATE, family=FAMILY, run_id=42, run_attempt=3, base="f" * 40,
        completed_at=T0, verified=True, outcome="failed", phase="baseline",
        pull_request=4077, reason_code="baseline-other", error=None, source="receipt",
    )


def test_unverified_attempt_keeps_only_the_run_and_the_error() -> None:
    attempt = unverified_attempt(CANDIDATE, None, run(42, 1), "artifact-expired")

    assert attempt == Attempt(
        candidate=CANDIDATE, family=None, run_id=42, run_attempt=1, base="f" * 40,
        completed_at=T0, verified=False, outcome=None, phase=None, pull_request=None,
        reason_code=None, error="artifact-expired", source="run",
    )


def test_attempt_builders_refuse_inconsistent_input() -> None:
    outcome = CandidateOutcome.model_validate(outcome_doc())
    with pytest.raises(ValueError, match="does not belong"):
        attempt_from_outcome(OTHER_CANDIDATE, FAMILY, run(), outcome, "artifact")
    with pytest.raises(ValueError, match="not a candidate id"):
        attempt_from_outcome("d92e15065c55779d", None, run(), outcome, "artifact")
    with pytest.raises(ValueError, match="unknown artifact error code"):
        unverified_attempt(CANDIDATE, FAMILY, run(), "timeout")


# --- the ledger --------------------------------------------------------------------------


def test_adding_the_same_attempt_twice_changes_nothing() -> None:
    ledger = OutcomeLedger()

    assert ledger.add(verified()) is True
    assert ledger.add(verified()) is False
    assert ledger.for_candidate(CANDIDATE) == [verified()]


def test_verified_replaces_unverified_but_never_the_reverse() -> None:
    ledger = OutcomeLedger([unverified()])

    assert ledger.add(verified(source="receipt")) is True
    assert ledger.add(unverified(error="artifact-expired")) is False
    assert ledger.for_candidate(CANDIDATE) == [verified(source="receipt")]


def test_artifact_outranks_receipt_for_the_same_run() -> None:
    receipt_first = OutcomeLedger([verified(source="receipt", family=None)])
    artifact_first = OutcomeLedger([verified(source="artifact")])

    assert receipt_first.add(verified(source="artifact")) is True
    assert artifact_first.add(verified(source="receipt", family=None)) is False
    assert receipt_first.for_candidate(CANDIDATE) == [verified(source="artifact")]
    assert artifact_first.for_candidate(CANDIDATE) == [verified(source="artifact")]


def test_later_error_code_replaces_an_earlier_one() -> None:
    ledger = OutcomeLedger([unverified(error="download-failed")])

    assert ledger.add(unverified(error="artifact-expired")) is True
    assert [a.error for a in ledger.for_candidate(CANDIDATE)] == ["artifact-expired"]


def test_each_run_attempt_is_its_own_attempt() -> None:
    ledger = OutcomeLedger([verified(run_attempt=1), verified(run_attempt=2)])

    assert len(ledger) == 2
    assert [a.run_attempt for a in ledger.for_candidate(CANDIDATE)] == [2, 1]


def test_queries_order_newest_first_and_filter() -> None:
    hour = timedelta(hours=1)
    old = verified(run_id=1, at=T0 - 30 * hour)
    recent = verified(run_id=2, at=T0 - 2 * hour, outcome="capacity-deferred")
    newest_unverified = unverified(run_id=3, at=T0 - hour)
    sibling = verified(NEXT_CANDIDATE, run_id=4, at=T0, family=None)
    other = verified(OTHER_CANDIDATE, run_id=5, at=T0 + hour, family=OTHER_FAMILY)
    ledger = OutcomeLedger([old, other, recent, sibling, newest_unverified])

    assert ledger.for_candidate(CANDIDATE) == [newest_unverified, recent, old]
    assert ledger.for_candidate("0" * 16 + "-" + "0" * 16) == []
    assert ledger.recent(CANDIDATE, T0 - 24 * hour) == [newest_unverified, recent]
    assert ledger.recent(CANDIDATE, T0 - 2 * hour) == [newest_unverified]
    assert ledger.recent(CANDIDATE, T0 - 48 * hour) == [newest_unverified, recent, old]
    assert ledger.all() == [other, sibling, newest_unverified, recent, old]
    # The cached order follows later additions.
    newer = verified(run_id=6, at=T0 + hour)
    ledger.add(newer)
    assert ledger.recent(CANDIDATE, T0 - 2 * hour) == [newer, newest_unverified]


def test_ledger_holds_a_hundred_thousand_attempts() -> None:
    families = [f"configs/nvidia-master.yaml:family-{n}" for n in range(200)]
    candidates = [candidate_id(f, "img:1") for f in families]
    attempts = [
        Attempt(
            candidate=candidates[n % 200], family=families[n % 200], run_id=n + 1,
            run_attempt=1, base=None, completed_at=T0 - timedelta(minutes=n),
            verified=n % 3 != 0, outcome="failed" if n % 3 else None, phase=None,
            pull_request=None, reason_code=None, error=None if n % 3 else "download-failed",
        )
        for n in range(100_000)
    ]

    ledger = OutcomeLedger(attempts)

    assert len(ledger) == 100_000
    history = ledger.for_candidate(candidates[7])
    assert len(history) == 500
    assert history[0].run_id == 8
    assert ledger.recent(candidates[7], T0 - timedelta(minutes=1000)) == history[:5]


# --- retry schedule ----------------------------------------------------------------------


class FixedRandom(random.Random):
    """Always draws the low (`at=0`) or high (`at=1`) end of a uniform range."""

    def __init__(self, at: float) -> None:
        super().__init__(0)
        self.at = at

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.at


@pytest.mark.parametrize(
    ("failures", "nominal"),
    [
        (1, timedelta(minutes=1)),
        (2, timedelta(minutes=2)),
        (3, timedelta(minutes=4)),
        (9, timedelta(minutes=256)),
        (10, timedelta(hours=6)),
        (10_000, timedelta(hours=6)),
    ],
)
def test_retry_delay_doubles_up_to_six_hours_with_jitter(
    failures: int, nominal: timedelta
) -> None:
    now = T0 + timedelta(hours=1)

    earliest = next_retry_at(T0, failures, now, rng=FixedRandom(0.0))
    latest = next_retry_at(T0, failures, now, rng=FixedRandom(1.0))

    assert earliest == now + nominal / 2
    assert latest == now + nominal


def test_seeded_retries_stay_within_bounds() -> None:
    rng = random.Random(7)
    now = T0 + timedelta(minutes=5)
    waits = [next_retry_at(T0, n, now, rng=rng) - now for n in range(1, 30)]

    assert all(timedelta(seconds=30) <= wait <= timedelta(hours=6) for wait in waits)
    assert len(set(waits)) == len(waits)


def test_retries_go_on_while_a_candidates_artifact_is_kept_14_days() -> None:
    # DESIGN §4: "retried with backoff while the artifact can still exist"; they gave up
    # after 3 days, with 11 days of the artifact's retention left.
    rng = random.Random(1)

    assert next_retry_at(T0, 20, T0 + timedelta(days=10), rng=rng) is not None
    assert next_retry_at(T0, 20, T0 + timedelta(days=14), rng=rng) is None
    assert next_retry_at(T0, 20, T0 + timedelta(days=15), rng=rng) is None
    last = next_retry_at(T0, 20, T0 + timedelta(days=14) - timedelta(minutes=1), rng=rng)
    assert last == T0 + timedelta(days=14)


def test_retry_needs_a_failure() -> None:
    with pytest.raises(ValueError):
        next_retry_at(T0, 0, T0, rng=random.Random(1))


# --- check conclusions -------------------------------------------------------------------


@pytest.mark.parametrize("outcome", get_args(Outcome))
def test_check_conclusion(outcome: str) -> None:
    expected = {
        "validated": "success",
        "capacity-deferred": "neutral",
        "handoff": "neutral",
        "already-updated": "neutral",
        "retired": "neutral",
        "duplicate": "neutral",
    }.get(outcome, "failure")

    assert check_conclusion(outcome) == expected  # type: ignore[arg-type]
    assert (expected == "neutral") == (outcome in NEUTRAL_OUTCOMES)


def test_an_archive_of_too_many_entries_is_refused_before_it_is_parsed() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(MEMBER, diagnostics(outcome_doc()))
        for n in range(1500):
            archive.writestr(f"padding/{n}", b"")
    error = artifact_error(buffer.getvalue())
    assert error.code == "too-many-entries" and "over 1000 entries" in error.detail


def test_an_end_record_understating_its_entries_is_no_bound_on_the_directory() -> None:
    # Found by a hostile-input review: zipfile reads the central directory by its size, so
    # an end record saying 1 entry let a directory of a million through the count check.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(MEMBER, diagnostics(outcome_doc()))
        for n in range(MAX_ENTRIES):
            archive.writestr(f"padding/{n}", b"")
    data = bytearray(buffer.getvalue())
    at = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", data, at + 8, 1, 1)  # entries on this disk, entries in total
    assert len(zipfile.ZipFile(io.BytesIO(bytes(data))).infolist()) == MAX_ENTRIES + 1
    error = artifact_error(bytes(data))
    assert error.code == "too-many-entries" and "central directory" in error.detail
    # An archive of exactly MAX_ENTRIES entries whose count lies the same way is read.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(MEMBER, diagnostics(outcome_doc()))
        for n in range(MAX_ENTRIES - 1):
            archive.writestr(f"padding/{n}", b"")
    data = bytearray(buffer.getvalue())
    struct.pack_into("<HH", data, data.rfind(b"PK\x05\x06") + 8, 1, 1)
    assert read_outcome_artifact(bytes(data)).outcome == "failed"


def test_a_zip64_archive_is_bounded_by_the_directory_its_record_says_not_its_count() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", allowZip64=True) as archive:
        archive.writestr(MEMBER, diagnostics(outcome_doc()))
    data = bytearray(buffer.getvalue())
    # Rewrite the archive's end as zip64 with an absurd count, like a hostile tool would.
    at = data.rfind(b"PK\x05\x06")
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 10**6, 10**6, 0, 0)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, at, 1)
    eocd = bytearray(data[at:])
    eocd[8:12] = b"\xff\xff\xff\xff"
    hostile = bytes(data[:at]) + record + locator + bytes(eocd)
    # The count costs nothing: zipfile reads the directory by the size the record gives (0).
    assert artifact_error(hostile).code == "member-missing"


# --- receipts (domain §6.3: the payload is JSON until "\n-->") -------------------------


def test_an_unclosed_receipt_is_refused_even_when_the_rest_is_valid_json() -> None:
    # The existing "no closing" case still carries text after the JSON, so it fails as
    # invalid JSON whether or not the closing line is checked.
    with pytest.raises(ReceiptError, match="never closed"):
        parse_receipt(f"<!-- klaud-outcome:28123456789:{CANDIDATE}\n{VALID_PAYLOAD}\n")


# --- failures before an outcome (DESIGN §4: naming the first failed job and step) ------


def test_a_failed_run_names_its_first_failed_job_and_that_jobs_first_failed_step() -> None:
    jobs = [
        Job(name="plan", conclusion="success", steps=(Step(name="checkout", conclusion="success"),)),
        Job(name="get-jobs", conclusion="failure", steps=(
            Step(name="Set up job", conclusion="success"),
            Step(name="Validate matrix", conclusion="failure"),
            Step(name="Upload", conclusion="cancelled"),
        )),
        Job(name="later", conclusion="cancelled", steps=(Step(name="x", conclusion="failure"),)),
    ]
    assert first_failure(jobs) == ("get-jobs", "Validate matrix")
    attempt = run_failed_attempt(CANDIDATE, FAMILY, run(), jobs)
    assert (attempt.error, attempt.failed_job, attempt.failed_step, attempt.verified) == (
        "run-failed", "get-jobs", "Validate matrix", False
    )
    assert first_failure([Job(name="timed", conclusion="timed_out")]) == ("timed", None)
    assert first_failure([Job(name="ok", conclusion="success")]) == (None, None)


# --- archive bounds: "at most" the cap, not below it -----------------------------------


def test_a_member_of_exactly_the_member_cap_is_read() -> None:
    content = diagnostics(outcome_doc())
    for method in (zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED):
        archive = zip_of({MEMBER: content}, method)
        assert read_outcome_artifact(archive, max_member_bytes=len(content)).outcome == "failed"
        assert artifact_error(archive, max_member_bytes=len(content) - 1).code == "member-too-large"


def test_an_archive_of_exactly_the_download_cap_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    archive = zip_of({MEMBER: diagnostics(outcome_doc())})
    monkeypatch.setattr(outcomes, "MAX_ARCHIVE_BYTES", len(archive))
    assert read_outcome_artifact(archive).outcome == "failed"
    monkeypatch.setattr(outcomes, "MAX_ARCHIVE_BYTES", len(archive) - 1)
    assert artifact_error(archive).code == "download-too-large"


# --- hostile archive structure (DESIGN §4 "Outcomes": archives are untrusted) ----------


def test_a_member_whose_local_header_is_not_one_is_refused() -> None:
    content = diagnostics(outcome_doc())
    archive = bytearray(hand_made_zip(MEMBER, deflated(content), crc=zlib.crc32(content), declared_size=len(content)))
    assert read_outcome_artifact(bytes(archive)).outcome == "failed"
    archive[0:4] = b"PK\x03\x05"  # the central directory still points here
    error = artifact_error(bytes(archive))
    assert error.code == "not-a-zip" and "no valid local header" in error.detail


def test_an_end_record_claiming_zip64_without_a_zip64_record_is_no_crash() -> None:
    # 0xFFFF entries in the classic end record means "see the zip64 record". Without a
    # zip64 locator before it the archive is read by its directory; a locator pointing
    # past the archive's end is a broken archive: an ArtifactError, never a struct.error.
    data = bytearray(zip_of({MEMBER: diagnostics(outcome_doc())}))
    at = data.rfind(b"PK\x05\x06")
    data[at + 8 : at + 12] = struct.pack("<HH", 0xFFFF, 0xFFFF)
    assert read_outcome_artifact(bytes(data)).outcome == "failed"
    for record_at in (len(data) * 4, 2**40):
        locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, record_at, 1)
        hostile = bytes(data[:at]) + locator + bytes(data[at:])
        assert artifact_error(hostile).code == "not-a-zip"


# --- the ledger forgets what no wave can use ------------------------------------------


def test_forget_before_drops_older_attempts_and_empty_candidates() -> None:
    old = verified(run_id=1, at=T0 - timedelta(days=5))
    kept = unverified(run_id=2, at=T0)
    gone = verified(NEXT_CANDIDATE, run_id=3, at=T0 - timedelta(days=4))
    ledger = OutcomeLedger([old, kept, gone])
    assert ledger.for_candidate(CANDIDATE) == [kept, old]  # builds the cached order
    assert ledger.forget_before(T0 - timedelta(days=3)) == 2
    assert len(ledger) == 1
    assert ledger.for_candidate(CANDIDATE) == [kept]
    assert ledger.for_candidate(NEXT_CANDIDATE) == []
    assert ledger.recent_for([CANDIDATE, NEXT_CANDIDATE], T0 - timedelta(days=10)) == {CANDIDATE: [kept]}
    assert not ledger.knows_run(NEXT_CANDIDATE, 3)
    assert ledger.forget_before(T0 - timedelta(days=3)) == 0


def test_a_zip64_archive_with_few_entries_is_read() -> None:
    # The existing zip64 test declares 10**6 entries, which the classic end record's 0xFFFF
    # already exceeds; here only the zip64 record tells the real count.
    data = zip_of({MEMBER: diagnostics(outcome_doc())})
    at = data.rfind(b"PK\x05\x06")
    size_cd, offset_cd = struct.unpack_from("<LL", data, at + 12)
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, size_cd, offset_cd)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, at, 1)
    eocd = bytearray(data[at:])
    eocd[8:12] = b"\xff\xff\xff\xff"
    assert read_outcome_artifact(data[:at] + record + locator + bytes(eocd)).outcome == "failed"


def test_knows_run_is_any_attempt_of_that_run_of_that_candidate() -> None:
    # The claim keeper skips runs whose outcome is already recorded when it looks up an
    # unlinked dispatch's run by title (bot/services/claims.py `_runs_by_candidate`).
    ledger = OutcomeLedger([unverified(run_id=7, run_attempt=2)])
    assert ledger.knows_run(CANDIDATE, 7)
    assert not ledger.knows_run(CANDIDATE, 2)
    assert not ledger.knows_run(CANDIDATE, 8)
    assert not ledger.knows_run(NEXT_CANDIDATE, 7)


def test_the_directory_bound_finds_the_end_record_where_zipfile_does() -> None:
    # Found by a review of the bound above: a zip64 locator with no zip64 record before it
    # (the last 20 bytes of an entry's comment) made the bound find no directory, while
    # zipfile ignores such a locator and reads the directory by the end record's size; and
    # an end record whose counts spell its own signature (0x4b50, 0x0605) was found at that
    # false signature, with no room for a record. MAX_ENTRIES + 1 entries passed both ways.
    def padded(count: int, last_comment: bytes = b"") -> bytearray:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr(MEMBER, diagnostics(outcome_doc()))
            for n in range(count):
                info = zipfile.ZipInfo(f"padding/{n}")
                info.comment = last_comment if n == count - 1 else b""
                archive.writestr(info, b"")
        return bytearray(buffer.getvalue())

    stray_locator = padded(MAX_ENTRIES, struct.pack("<4sLQL", b"PK\x06\x07", 0, 0, 1))
    struct.pack_into("<HH", stray_locator, stray_locator.rfind(b"PK\x05\x06") + 8, 1, 1)
    spelled = padded(MAX_ENTRIES + 500)
    struct.pack_into("<HH", spelled, len(spelled) - 22 + 8, 0x4B50, 0x0605)
    for hostile in (stray_locator, spelled):
        assert len(zipfile.ZipFile(io.BytesIO(bytes(hostile))).infolist()) > MAX_ENTRIES
        assert artifact_error(bytes(hostile)).code == "too-many-entries"
