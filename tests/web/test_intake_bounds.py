"""The webhook intake at its bounds: sizes, encodings, headers, the store's answers, the labels counted."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator

import pytest

from bot.metrics import REGISTRY
from bot.store.deliveries import Delivery
from bot.web.body import MAX_BODY
from bot.web.webhook import INTAKE_KEY, STORAGE_RETRY_AFTER
from tests.harness import headers_for, running_klaud
from tests.web.test_hostile_input import (
    BOGUS_SIGNATURE,
    post_gzip,
    rejected_count,
    stored,
)
from tests.web.test_ingest import PR_PAYLOAD, make_klaud, raw_post

MIB = 1024 * 1024


async def chunks_of(total: int, size: int = MIB) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        piece = min(size, total - sent)
        sent += piece
        yield b" " * piece


async def test_a_body_with_a_wrong_signature_is_401_even_when_it_is_not_json(tmp_path):
    # What this catches: the payload parsed (and its errors answered) before its signature is checked.
    async with running_klaud(make_klaud(tmp_path)) as run:
        headers = headers_for("pull_request", b"{}", delivery="forged") | {"X-Hub-Signature-256": BOGUS_SIGNATURE}
        status, answer = await raw_post(run, b"this is not json", headers)
        assert (status, answer["error"]) == (401, "invalid-signature")
        assert not await stored(run, "forged")


async def test_a_refused_delivery_is_counted_under_its_own_event_label(tmp_path):
    # What this catches: rejections of a known event counted under the shared "other" label.
    async with running_klaud(make_klaud(tmp_path)) as run:
        before = rejected_count("pull_request")
        headers = headers_for("pull_request", b"{}") | {"X-Hub-Signature-256": BOGUS_SIGNATURE}
        assert (await raw_post(run, b"{}", headers))[0] == 401
    assert rejected_count("pull_request") - before == 1


async def test_a_chunked_body_past_25_mib_without_a_length_is_413(tmp_path):
    # What this catches: a body sent without Content-Length read past the 25 MiB cap.
    async with running_klaud(make_klaud(tmp_path)) as run:
        headers = headers_for("pull_request", b"{}", delivery="endless")
        async with run.session.post(f"{run.url}/webhook", data=chunks_of(MAX_BODY + 1), headers=headers) as response:
            assert response.status == 413
            assert (await response.json())["error"] == "payload-too-large"
        assert not await stored(run, "endless")


async def test_a_signed_body_larger_than_the_whole_budget_is_still_stored(tmp_path):
    # What this catches: a body larger than the budget waiting forever for room it can never get.
    async with running_klaud(make_klaud(tmp_path), body_budget=MIB, read_timeout=5) as run:
        body = json.dumps(dict(PR_PAYLOAD, pad="a" * (3 * MIB // 2))).encode()
        status, _ = await raw_post(run, body, headers_for("pull_request", body, delivery="over-budget"))
        assert status == 202
        assert await stored(run, "over-budget")
        assert run.webhook_app[INTAKE_KEY].budget.in_use == 0


async def test_bytes_after_the_gzip_stream_are_400_and_store_nothing(tmp_path):
    # What this catches: trailing bytes after a complete gzip stream accepted and stored.
    async with running_klaud(make_klaud(tmp_path)) as run:
        decoded = json.dumps(PR_PAYLOAD).encode()
        status, answer = await post_gzip(run, decoded, "trailing", gzip.compress(decoded) + b"trailing junk")
        assert (status, answer["error"]) == (400, "invalid-encoding")
        assert not await stored(run, "trailing")




async def test_a_store_that_raises_answers_503_store_unavailable(tmp_path, monkeypatch):
    # What this catches: a delivery the store failed to keep answered with a bare 500 (or a 2xx).
    klaud = make_klaud(tmp_path)
    async with running_klaud(klaud) as run:

        async def failing_put(delivery: Delivery, seconds: float) -> bool | None:
            raise OSError("the disk went away")

        monkeypatch.setattr(klaud.inbox, "put_in_time", failing_put)
        status, answer = await run.post("pull_request", PR_PAYLOAD, delivery="lost")
    assert (status, answer["error"]) == (503, "store-unavailable")


async def test_a_body_holds_its_share_of_the_budget_until_it_is_stored(tmp_path, monkeypatch):
    # What this catches: the body's bytes given back to the budget while the store still holds it.
    klaud = make_klaud(tmp_path)
    async with running_klaud(klaud) as run:
        budget = run.webhook_app[INTAKE_KEY].budget
        held_while_storing: list[int] = []
        put_in_time = klaud.inbox.put_in_time

        async def watched_put(delivery: Delivery, seconds: float) -> bool | None:
            held_while_storing.append(budget.in_use)
            return await put_in_time(delivery, seconds)

        monkeypatch.setattr(klaud.inbox, "put_in_time", watched_put)
        assert (await run.post("pull_request", PR_PAYLOAD, delivery="kept"))[0] == 202
    assert held_while_storing == [len(json.dumps(PR_PAYLOAD))]
    assert budget.in_use == 0


async def test_a_store_that_answers_too_late_asks_for_a_retry_after(tmp_path, monkeypatch):
    # What this catches: a 503 store-slow without the Retry-After that tells GitHub when to come back.
    klaud = make_klaud(tmp_path)
    async with running_klaud(klaud) as run:

        async def late_put(delivery: Delivery, seconds: float) -> bool | None:
            return None

        monkeypatch.setattr(klaud.inbox, "put_in_time", late_put)
        body = json.dumps(PR_PAYLOAD).encode()
        async with run.session.post(f"{run.url}/webhook", data=body, headers=headers_for("pull_request", body)) as response:
            assert response.status == 503
            assert (await response.json())["error"] == "store-slow"
            assert response.headers["Retry-After"] == str(STORAGE_RETRY_AFTER)


async def test_a_stored_delivery_keeps_githubs_audit_headers_but_not_its_signature(tmp_path):
    # What this catches: the X-GitHub-* headers kept for audits dropped before the delivery is stored.
    async with running_klaud(make_klaud(tmp_path)) as run:
        body = json.dumps(PR_PAYLOAD).encode()
        headers = headers_for("pull_request", body, delivery="audited") | {"X-GitHub-Hook-ID": "4242"}
        assert (await raw_post(run, body, headers))[0] == 202
        kept = (await run.klaud.inbox.get("audited")).headers
    assert kept["X-GitHub-Hook-ID"] == "4242" and kept["X-GitHub-Delivery"] == "audited"
    assert "X-Hub-Signature-256" not in kept


async def test_an_empty_content_encoding_is_read_as_identity(tmp_path):
    # What this catches: a blank Content-Encoding header refused as an unknown encoding.
    async with running_klaud(make_klaud(tmp_path)) as run:
        body = json.dumps(PR_PAYLOAD).encode()
        headers = headers_for("pull_request", body) | {"Content-Encoding": " "}
        assert (await raw_post(run, body, headers))[0] == 202


async def test_a_body_of_exactly_25_mib_is_accepted(tmp_path):
    # What this catches: the 25 MiB cap refusing a body of exactly the size GitHub may send.
    async with running_klaud(make_klaud(tmp_path)) as run:
        empty = json.dumps(dict(PR_PAYLOAD, pad="")).encode()
        body = json.dumps(dict(PR_PAYLOAD, pad="a" * (MAX_BODY - len(empty)))).encode()
        assert len(body) == MAX_BODY
        status, _ = await raw_post(run, body, headers_for("pull_request", body, delivery="at-the-cap"))
        assert status == 202


async def test_a_gzip_body_inflating_to_exactly_25_mib_is_stored(tmp_path):
    # What this catches: the cap on decoded bytes refusing a body of exactly 25 MiB once inflated.
    async with running_klaud(make_klaud(tmp_path)) as run:
        empty = json.dumps(dict(PR_PAYLOAD, pad="")).encode()
        decoded = json.dumps(dict(PR_PAYLOAD, pad="a" * (MAX_BODY - len(empty)))).encode()
        assert len(decoded) == MAX_BODY
        status, _ = await post_gzip(run, decoded, "inflated-to-the-cap")
        assert status == 202


@pytest.mark.parametrize("header", ["X-GitHub-Event", "X-GitHub-Delivery"])
async def test_an_event_or_delivery_header_past_200_characters_is_400(tmp_path, header):
    # What this catches: event names and delivery ids of any length stored and used as keys.
    async with running_klaud(make_klaud(tmp_path)) as run:
        body = json.dumps(PR_PAYLOAD).encode()
        headers = headers_for("pull_request", body) | {header: "a" * 201}
        status, answer = await raw_post(run, body, headers)
        assert (status, answer["error"]) == (400, "invalid-header")


async def test_a_gzip_body_is_charged_to_the_budget_for_its_decoded_bytes(tmp_path, monkeypatch):
    # What this catches: a gzip body charged for other than its decoded bytes (inflated bytes uncounted, compressed ones kept).
    klaud = make_klaud(tmp_path)
    async with running_klaud(klaud) as run:
        budget = run.webhook_app[INTAKE_KEY].budget
        held_while_storing: list[int] = []
        put_in_time = klaud.inbox.put_in_time

        async def watched_put(delivery: Delivery, seconds: float) -> bool | None:
            held_while_storing.append(budget.in_use)
            return await put_in_time(delivery, seconds)

        monkeypatch.setattr(klaud.inbox, "put_in_time", watched_put)
        decoded = json.dumps(dict(PR_PAYLOAD, pad="a" * MIB)).encode()
        assert (await post_gzip(run, decoded, "inflated"))[0] == 202
    assert held_while_storing == [len(decoded)]


async def test_content_encoding_is_read_without_regard_to_case(tmp_path):
    # What this catches: a gzip body refused for the letter case of its Content-Encoding.
    async with running_klaud(make_klaud(tmp_path)) as run:
        decoded = json.dumps(PR_PAYLOAD).encode()
        headers = headers_for("pull_request", decoded) | {"Content-Encoding": "GZIP"}
        assert (await raw_post(run, gzip.compress(decoded), headers))[0] == 202


async def test_a_known_event_name_in_other_letter_case_shares_the_other_label(tmp_path):
    # What this catches: case variants of a known event name each becoming a metric label of their own.
    async with running_klaud(make_klaud(tmp_path)) as run:
        before = rejected_count("other")
        headers = headers_for("Pull_Request", b"{}") | {"X-Hub-Signature-256": BOGUS_SIGNATURE}
        assert (await raw_post(run, b"{}", headers))[0] == 401
    assert rejected_count("other") - before == 1
    assert rejected_count("Pull_Request") == 0


async def test_a_redelivery_is_counted_as_a_duplicate(tmp_path):
    # What this catches: redeliveries answered as duplicates but missing from klaud_deliveries_total.
    def duplicates() -> float:
        return REGISTRY.get_sample_value("klaud_deliveries_total", {"event": "pull_request", "result": "duplicate"}) or 0.0

    async with running_klaud(make_klaud(tmp_path)) as run:
        before = duplicates()
        assert (await run.post("pull_request", PR_PAYLOAD, delivery="twice"))[0] == 202
        assert (await run.post("pull_request", PR_PAYLOAD, delivery="twice")) == (200, {"delivery": "twice", "duplicate": True})
    assert duplicates() - before == 1
