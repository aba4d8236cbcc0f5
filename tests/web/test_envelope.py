"""The routing fields decoded at ack time (bot/web/envelope.py) at their bounds."""

from __future__ import annotations

import pytest

from tests.harness import running_klaud
from tests.web.test_hostile_input import stored
from tests.web.test_ingest import PR_PAYLOAD, make_klaud


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
