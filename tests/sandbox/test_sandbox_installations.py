"""Installing the App, choosing its repositories, suspending it: the events GitHub sends
and the API answering as the installation now allows."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.sandbox import Sandbox
from tests.sandbox.test_sandbox_payloads import example, key_mismatches
from tests.sandbox.test_sandbox_support import (
    Hub,
    Receiver,
    events,
    repo_of,
    serve,
    small_scenario,
)


def scenario() -> dict[str, Any]:
    """acme/bench installed; acme/extra on the same account, not given to the App yet;
    globex/lab on an account without the App."""
    made = small_scenario()
    bench = repo_of(made)
    extra = {"full_name": "acme/extra", "installation_id": 1, "installed": False,
             "files": {"README.md": "extra\n"}, "collaborators": {"alice": "admin"}}
    lab = {"full_name": "globex/lab", "installation_id": 2, "installed": False, "owner_type": "User",
           "files": {"README.md": "lab\n"}, "collaborators": {"gus": "admin"}}
    made["repositories"] = [bench, extra, lab]
    return made


@pytest.fixture
async def app(receiver: Receiver) -> AsyncIterator[Hub]:
    async for served in serve(Sandbox(scenario(), deliver_to=receiver.url)):
        yield served


async def token(hub: Hub, installation_id: int) -> str:
    made = await hub.json("POST", f"/app/installations/{installation_id}/access_tokens", status=201)
    return f"token {made['token']}"


async def status(hub: Hub, path: str, credential: str, method: str = "GET") -> int:
    response = await hub.api(method, path, headers={"Authorization": credential})
    return response.status


async def listed(hub: Hub, credential: str) -> list[str]:
    response = await hub.api("GET", "/installation/repositories", headers={"Authorization": credential})
    return [r["full_name"] for r in (await response.json())["repositories"]]


async def installation_event_of(hub: Hub, receiver: Receiver, action: str, sent: str, **fields: Any) -> dict[str, Any]:
    """The one event the sandbox sends for the control `action`: `installation` `sent`."""
    await hub.act(action=action, **fields)
    [(name, payload)] = events(receiver)
    assert (name, payload["action"]) == ("installation", sent)
    return payload


def assert_githubs_shape(payload: dict[str, Any], fixture: dict[str, Any]) -> None:
    """Our installation has every key of the example (which predates `client_id` and some
    others); the rest has the example's keys exactly."""
    ours, theirs = dict(payload), dict(fixture)
    installation, example_installation = ours.pop("installation"), theirs.pop("installation")
    assert set(installation) >= set(example_installation)
    assert key_mismatches(installation["account"], example_installation["account"]) == []
    assert key_mismatches(ours, theirs) == []


async def test_a_repository_given_to_the_app_is_reachable_and_heard_from(
    app: Hub, receiver: Receiver, fixtures: Path
) -> None:
    credential = await token(app, 1)
    assert await status(app, "/repos/acme/extra", credential) == 404
    assert await listed(app, credential) == ["acme/bench"]
    await app.act(action="dispatch", repo="acme/extra", event_type="x")
    assert app.sandbox.deliveries[-1].reason == "the App is not installed on the repository"

    await app.act(action="add_repositories", repos=["acme/extra"], user="alice")
    [(name, payload)] = events(receiver)
    assert (name, payload["action"]) == ("installation_repositories", "added")
    assert [r["full_name"] for r in payload["repositories_added"]] == ["acme/extra"]
    assert payload["installation"]["id"] == 1 and payload["sender"]["login"] == "alice"
    assert_githubs_shape(payload, example(fixtures, "installation_repositories/added.payload.json"))
    assert await status(app, "/repos/acme/extra", credential) == 200
    assert sorted(await listed(app, credential)) == ["acme/bench", "acme/extra"]


async def test_a_repository_taken_away_is_404_to_the_apps_tokens(
    app: Hub, receiver: Receiver, fixtures: Path
) -> None:
    await app.act(action="add_repositories", repos=["acme/extra"])
    credential = await token(app, 1)
    receiver.received.clear()
    await app.act(action="remove_repositories", repos=["acme/extra"])
    [(name, payload)] = events(receiver)
    assert (name, payload["action"]) == ("installation_repositories", "removed")
    assert [r["full_name"] for r in payload["repositories_removed"]] == ["acme/extra"]
    assert_githubs_shape(payload, example(fixtures, "installation_repositories/removed.payload.json"))
    assert await status(app, "/repos/acme/extra/pulls", credential) == 404
    assert await listed(app, credential) == ["acme/bench"]
    await app.json("GET", "/repos/acme/extra/installation", status=404)


async def test_installing_on_a_new_account_sends_installation_created(
    app: Hub, receiver: Receiver, fixtures: Path
) -> None:
    assert [i["id"] for i in await app.json("GET", "/app/installations")] == [1]
    await app.json("POST", "/app/installations/2/access_tokens", status=404)
    answer = await app.act(action="install_app", repos=["globex/lab"])
    assert answer["installation_id"] == 2
    [(name, payload)] = events(receiver)
    assert (name, payload["action"]) == ("installation", "created")
    assert [r["full_name"] for r in payload["repositories"]] == ["globex/lab"]
    assert payload["installation"]["account"]["login"] == "globex"
    assert payload["sender"]["login"] == "gus"
    assert_githubs_shape(payload, example(fixtures, "installation/created.payload.json"))
    assert [i["id"] for i in await app.json("GET", "/app/installations")] == [1, 2]
    assert await listed(app, await token(app, 2)) == ["globex/lab"]


async def test_uninstalling_revokes_the_tokens_and_a_new_install_has_a_new_id(
    app: Hub, receiver: Receiver, fixtures: Path
) -> None:
    credential = await token(app, 1)
    payload = await installation_event_of(app, receiver, "uninstall_app", "deleted", installation_id=1, user="alice")
    assert [r["full_name"] for r in payload["repositories"]] == ["acme/bench"]
    assert_githubs_shape(payload, example(fixtures, "installation/deleted.payload.json"))
    assert await status(app, "/repos/acme/bench", credential) == 401
    await app.json("POST", "/app/installations/1/access_tokens", status=404)
    assert await app.json("GET", "/app/installations") == []
    await app.act(action="comment", repo="acme/bench", number=12, user="bob", body="anyone?")
    assert app.sandbox.deliveries[-1].outcome == "skipped"

    receiver.received.clear()
    answer = await app.act(action="install_app", repos=["acme/bench", "acme/extra"])
    assert answer["installation_id"] not in (1, 2)
    [(_, created)] = events(receiver)
    assert created["installation"]["id"] == answer["installation_id"]
    assert sorted(await listed(app, await token(app, answer["installation_id"]))) == ["acme/bench", "acme/extra"]
    assert await status(app, "/repos/acme/bench", credential) == 401, "a revoked token stays revoked"


async def test_a_suspended_installation_is_refused_and_hears_nothing_until_unsuspended(
    app: Hub, receiver: Receiver, fixtures: Path
) -> None:
    credential = await token(app, 1)
    suspended = await installation_event_of(app, receiver, "suspend_app", "suspend", installation_id=1, user="alice")
    assert "repositories" not in suspended
    assert suspended["installation"]["suspended_by"]["login"] == "alice"
    assert suspended["installation"]["suspended_at"] == "2026-11-30T08:00:00Z"
    assert_githubs_shape(suspended, example(fixtures, "installation/suspend.payload.json"))
    refused = await app.api("POST", "/app/installations/1/access_tokens")
    assert (refused.status, (await refused.json())["message"]) == (403, "This installation has been suspended")
    assert await status(app, "/repos/acme/bench/pulls", credential) == 403
    [listed_installation] = await app.json("GET", "/app/installations")
    assert listed_installation["suspended_at"] == "2026-11-30T08:00:00Z"
    opened = await app.act(action="open_pull", repo="acme/bench", pull={
        "title": "t", "user": "bob", "head_ref": "t", "files": []})
    assert opened["deliveries"] == [] and app.sandbox.deliveries[-1].reason == "the installation is suspended"

    receiver.received.clear()
    await app.act(action="unsuspend_app", installation_id=1)
    [(_, unsuspended)] = events(receiver)
    assert unsuspended["action"] == "unsuspend" and unsuspended["installation"]["suspended_by"] is None
    assert_githubs_shape(unsuspended, example(fixtures, "installation/unsuspend.payload.json"))
    assert await status(app, "/repos/acme/bench/pulls", credential) == 200


@pytest.mark.parametrize(("action", "expected"), [
    ({"action": "install_app", "repos": ["acme/extra"]}, 409),  # the App is on acme already
    ({"action": "install_app", "repos": ["acme/extra", "globex/lab"]}, 422),  # two accounts
    ({"action": "add_repositories", "repos": ["acme/bench"]}, 409),  # given already
    ({"action": "add_repositories", "repos": ["globex/lab"]}, 404),  # no installation there
    ({"action": "remove_repositories", "repos": ["acme/bench"]}, 422),  # its last one
    ({"action": "remove_repositories", "repos": ["acme/bench", "ACME/Bench"]}, 422),  # named twice
    ({"action": "remove_repositories", "repos": ["acme/extra"]}, 409),  # never given
    ({"action": "uninstall_app", "installation_id": 2}, 404),
    ({"action": "unsuspend_app", "installation_id": 1}, 409),
    ({"action": "install_app", "repos": []}, 400),
])
async def test_what_githubs_settings_do_not_allow_is_refused(
    app: Hub, receiver: Receiver, action: dict[str, Any], expected: int
) -> None:
    response = await app.client.post("/_sandbox/act", data=json.dumps(action))
    assert response.status == expected, await response.text()
    assert receiver.received == []
