"""The routing fields decoded at ack time (bot/web/envelope.py) at their bounds."""

from __future__ import annotations

import json

import pytest

from bot.core.events import PullRequestEvent
from bot.web.envelope import UnreadableBody, envelope_of
from handlers.context import WebhookEvent
from tests.harness import running_klaud
from tests.web.test_hostile_input import stored, with_unread_field
from tests.web.test_ingest import PR_PAYLOAD, make_klaud, pull_request_event


@pytest.mark.parametrize("name", ["o" * 101 + "/bench", "acme/" + "r" * 101])
async def test_an_owner_or_repository_name_past_100_characters_is_400(tmp_path, name):
    # What this catches: repository names of any length accepted as a queue key.
    async with running_klaud(make_klaud(tmp_path)) as run:
        status, answer = await run.post("pull_request", dict(PR_PAYLOAD, repository={"full_name": name}), delivery="long")
        assert (status, answer["error"]) == (400, "invalid-payload")
        assert not await stored(run, "long")


async def test_owner_and_repository_names_with_underscores_and_dots_are_accepted(tmp_path):
    # What this catches: real GitHub names (EMU logins with '_', repositories with '.') refused with 400.
    async with running_klaud(make_klaud(tmp_path)) as run:
        payload = dict(PR_PAYLOAD, repository={"full_name": "acme_corp.x/bench.js"})
        assert (await run.post("pull_request", payload))[0] == 202


@pytest.mark.parametrize(
    "payload",
    [
        dict(PR_PAYLOAD, installation={"id": 2**63}),
        dict(PR_PAYLOAD, installation={"id": True}),
        dict(PR_PAYLOAD, action=""),
    ],
    ids=["installation-id-2**63", "installation-id-true", "empty-action"],
)
async def test_routing_fields_the_store_cannot_keep_as_given_are_400(tmp_path, payload):
    # What this catches: an id past SQLite's INTEGER, a boolean id or an empty action reaching the store.
    async with running_klaud(make_klaud(tmp_path)) as run:
        status, answer = await run.post("pull_request", payload, delivery="odd")
        assert (status, answer["error"]) == (400, "invalid-payload")
        assert not await stored(run, "odd")


@pytest.mark.parametrize(
    "payload",
    [dict(PR_PAYLOAD, action="a" * 100), dict(PR_PAYLOAD, installation={"id": 2**63 - 1})],
    ids=["100-character-action", "installation-id-2**63-1"],
)
async def test_routing_fields_at_their_limits_are_accepted(tmp_path, payload):
    # What this catches: the longest action GitHub sends or the largest storable id refused with 400.
    async with running_klaud(make_klaud(tmp_path)) as run:
        assert (await run.post("pull_request", payload, delivery="edge"))[0] == 202
        assert await stored(run, "edge")



@pytest.mark.parametrize("depth", [200, 201, 600, 900])
def test_a_body_the_ack_accepts_at_any_depth_its_handler_reads(depth):
    # What this catches: the ack (msgspec, ~1,000 levels) accepting a body the handler's
    # parser (pydantic, 200 levels) refuses, so it is acknowledged, stored, then failed.
    body = json.dumps(pull_request_event(5)).encode()[:-1] + b', "unread": ' + b"[" * depth + b"]" * depth + b"}"
    assert envelope_of(body).repo == "acme/bench"
    event = WebhookEvent(body, event="pull_request", delivery_id="d", action="opened").parsed(PullRequestEvent)
    assert event.pull_request.number == 5


def test_a_body_past_the_acks_depth_is_refused_before_any_handler_sees_it():
    with pytest.raises(UnreadableBody, match="depth"):
        envelope_of(with_unread_field(b"[" * 5_000 + b"]" * 5_000))
