"""Faults, strict authentication and the request log of the sandbox REST API."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import aiohttp
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.sandbox import Sandbox
from tests.sandbox.test_sandbox_support import Hub, Receiver, serve, small_scenario

REPO = "/repos/acme/bench"


async def set_faults(hub: Hub, **settings: object) -> None:
    response = await hub.client.post("/_sandbox/faults", json=settings)
    assert response.status == 200, await response.text()


async def test_fault_status_and_count(hub: Hub) -> None:
    await set_faults(hub, rules=[{"method": "GET", "route": r"/pulls/\d+/files$",
                                  "status": 502, "count": 2}])
    statuses = [(await hub.api("GET", f"{REPO}/pulls/12/files")).status for _ in range(3)]
    assert statuses == [502, 502, 200]
    assert (await hub.api("GET", f"{REPO}/pulls/12")).status == 200
    log = hub.sandbox.request_log
    assert [r["status"] for r in log["requests"]] == [502, 502, 200, 200]


async def test_fault_method_filter_and_clearing(hub: Hub) -> None:
    await set_faults(hub, rules=[{"method": "POST", "route": "/git/refs", "status": 500}])
    assert (await hub.api("GET", f"{REPO}/git/matching-refs/heads")).status == 200
    head = hub.state()["head_sha"]
    body = {"ref": "refs/heads/klaud/claim-x", "sha": head}
    failed = await hub.api("POST", f"{REPO}/git/refs", json=body)
    assert failed.status == 500
    assert (await failed.json())["message"] == "Server Error"
    assert "refs/heads/klaud/claim-x" not in hub.state()["refs"]  # the handler never ran
    await set_faults(hub, rules=[])
    assert (await hub.api("POST", f"{REPO}/git/refs", json=body)).status == 201


async def test_fault_retry_after_is_a_secondary_rate_limit(hub: Hub) -> None:
    await set_faults(hub, rules=[{"route": "/comments", "status": 403, "retry_after": 30}])
    response = await hub.api("GET", f"{REPO}/issues/12/comments")
    assert response.status == 403
    assert response.headers["Retry-After"] == "30"
    assert "secondary rate limit" in (await response.json())["message"]


async def test_fault_remaining_zero_answers_with_reset(hub: Hub) -> None:
    await set_faults(hub, rules=[{"route": "/contents/", "ratelimit_remaining_zero": True,
                                  "count": 1}])
    response = await hub.api("GET", f"{REPO}/contents/configs/runners.yaml")
    assert response.status == 403
    assert response.headers["x-ratelimit-remaining"] == "0"
    reset = int(response.headers["x-ratelimit-reset"])
    assert reset > hub.sandbox.clock.now().timestamp()
    assert (await hub.api("GET", f"{REPO}/contents/configs/runners.yaml")).status == 200


async def test_fault_rate_is_seeded() -> None:
    async def pattern(seed: int) -> list[int]:
        async for hub in serve(Sandbox(small_scenario())):
            await set_faults(hub, seed=seed, rules=[{"route": "/pulls$", "status": 503,
                                                     "rate": 0.5}])
            return [(await hub.api("GET", f"{REPO}/pulls")).status for _ in range(24)]
        raise AssertionError("not served")

    first, again = await pattern(3), await pattern(3)
    assert first == again
    assert {503, 200} == set(first)


async def test_fault_latency_provokes_a_client_timeout(hub: Hub) -> None:
    await set_faults(hub, rules=[{"route": "/compare/", "latency_ms": 300, "count": 1}])
    with pytest.raises(asyncio.TimeoutError):
        await hub.api("GET", f"{REPO}/compare/main...bump-sglang",
                      timeout=aiohttp.ClientTimeout(total=0.05))
    # A latency-only rule answers for real once the delay is over.
    compared = await hub.api("GET", f"{REPO}/compare/main...bump-sglang")
    assert compared.status == 200


async def test_invalid_fault_rules_are_rejected(hub: Hub) -> None:
    response = await hub.client.post("/_sandbox/faults", json={"rules": [{"route": "("}]})
    assert response.status == 400
    assert "rules.0.route" in (await response.json())["detail"]


@pytest.mark.parametrize(
    ("rule", "complaint"),
    [
        ({"webhook": "push", "status": 500}, "only webhook, action, rate and count"),
        ({"action": "completed"}, "give webhook too"),
        ({"route": "/git/refs", "lose_answer": True, "status": 502}, "cannot also be an error"),
    ],
)
async def test_fault_rules_of_mixed_kinds_are_rejected(
    hub: Hub, rule: dict[str, object], complaint: str
) -> None:
    response = await hub.client.post("/_sandbox/faults", json={"rules": [rule]})
    assert response.status == 400
    assert complaint in (await response.json())["detail"]


async def deliveries(hub: Hub) -> list[dict[str, object]]:
    listed: list[dict[str, object]] = await (await hub.client.get("/_sandbox/deliveries")).json()
    return listed


async def test_a_dropped_webhook_changes_the_state_but_never_arrives(
    hub: Hub, receiver: Receiver
) -> None:
    hub.sandbox.deliver_to = receiver.url
    await set_faults(hub, rules=[{"webhook": "workflow_run", "action": "completed", "count": 1}])
    first = await hub.act(action="complete_run", repo="acme/bench",
                          run={"workflow": "klaud-plan.yml"})
    assert (first["deliveries"], first["statuses"]) == ([], [])
    assert receiver.received == []
    run = await hub.json("GET", f"{REPO}/actions/runs/{first['run_id']}")
    assert run["status"] == "completed"  # the state changed all the same
    second = await hub.act(action="complete_run", repo="acme/bench",
                           run={"workflow": "klaud-plan.yml"})
    assert second["statuses"] == [202]  # the rule's count is spent
    assert [(d["event"], d["action"], d["outcome"], d["reason"]) for d in await deliveries(hub)] == [
        ("workflow_run", "completed", "dropped", "fault rule"),
        ("workflow_run", "completed", "sent", None)]


async def test_a_webhook_rule_drops_background_deliveries_of_any_action(
    hub: Hub, receiver: Receiver
) -> None:
    hub.sandbox.deliver_to = receiver.url
    await set_faults(hub, rules=[{"webhook": "issue_comment"}])
    made = await hub.api("POST", f"{REPO}/issues/12/comments", json={"body": "Klaud here"})
    assert made.status == 201
    await hub.act(action="comment", repo="acme/bench", number=12, user="bob", body="hi")
    await hub.sandbox.drain()
    assert receiver.received == []
    assert [d["outcome"] for d in await deliveries(hub)] == ["dropped", "dropped"]
    assert [c["body"] for c in hub.state()["comments"]] == ["Klaud here", "hi"]


async def test_a_lost_answer_is_applied_and_then_the_connection_is_cut(
    hub: Hub, receiver: Receiver
) -> None:
    hub.sandbox.deliver_to = receiver.url
    await set_faults(hub, rules=[{"method": "POST", "route": "/comments$", "lose_answer": True,
                                  "count": 1}])
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await hub.api("POST", f"{REPO}/issues/12/comments", json={"body": "Klaud here"})
    await hub.sandbox.drain()
    # Applied: the comment exists and its webhook went out; the client must read to know.
    assert [c["body"] for c in hub.state()["comments"]] == ["Klaud here"]
    assert [d["event"] for d in await deliveries(hub)] == ["issue_comment"]
    listed = await hub.json("GET", f"{REPO}/issues/12/comments")
    assert [c["body"] for c in listed] == ["Klaud here"]
    entries = hub.sandbox.request_log["requests"]
    assert [(e["method"], e["status"], e["lost"]) for e in entries] == [
        ("POST", 201, True), ("GET", 200, False)]


async def test_a_lost_claim_is_found_by_reading(hub: Hub) -> None:
    await set_faults(hub, rules=[{"method": "POST", "route": "/git/refs$", "lose_answer": True,
                                  "count": 1}])
    claim = {"ref": "refs/heads/klaud/claim-0123456789abcdef", "sha": hub.state()["head_sha"]}
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await hub.api("POST", f"{REPO}/git/refs", json=claim)
    again = await hub.api("POST", f"{REPO}/git/refs", json=claim)
    assert again.status == 422 and (await again.json())["message"] == "Reference already exists"
    found = await hub.json("GET", f"{REPO}/git/ref/heads/klaud/claim-0123456789abcdef")
    assert found["object"]["sha"] == claim["sha"]


async def test_request_log_counts_by_route_and_resets(hub: Hub) -> None:
    await hub.api("GET", f"{REPO}/pulls/12/files")
    await hub.api("GET", f"{REPO}/pulls/12/files", params={"page": "2"})
    await hub.api("GET", f"{REPO}/nothing-here")
    log = await (await hub.client.get("/_sandbox/requests")).json()
    assert log["total"] == 3
    assert log["by_route"] == {"GET /repos/{owner}/{repo}/pulls/{pull_number}/files": 2,
                               "GET (unknown route)": 1}
    first = log["requests"][0]
    assert first == {"method": "GET", "path": "/repos/acme/bench/pulls/12/files", "query": "",
                     "route": "GET /repos/{owner}/{repo}/pulls/{pull_number}/files",
                     "status": 200, "at": "2026-11-30T08:00:00Z", "lost": False}
    assert (await hub.client.post("/_sandbox/requests/reset")).status == 200
    assert hub.sandbox.request_log == {"total": 0, "by_route": {}, "requests": []}


# --- strict authentication -------------------------------------------------------------


@pytest.fixture(scope="module")
def app_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def app_jwt(key: rsa.RSAPrivateKey, now: datetime, app_id: int = 42, lifetime: int = 540) -> str:
    issued = int(now.timestamp()) - 60
    return jwt.encode({"iat": issued, "exp": issued + 60 + lifetime, "iss": str(app_id)},
                      key, algorithm="RS256")


@pytest.fixture
async def strict(app_key: rsa.RSAPrivateKey) -> AsyncIterator[Hub]:
    sandbox = Sandbox(small_scenario(), strict_auth=True, app_id=42,
                      app_public_key=public_pem(app_key))
    async for served in serve(sandbox):
        yield served


async def test_strict_auth_wants_an_app_jwt_then_an_installation_token(
    strict: Hub, app_key: rsa.RSAPrivateKey
) -> None:
    now = strict.sandbox.clock.now()
    strict.token = "token not-issued-here"
    assert (await strict.api("GET", REPO)).status == 401
    assert (await strict.api("POST", "/app/installations/1/access_tokens")).status == 401
    strict.token = f"Bearer {app_jwt(app_key, now)}"
    made = await strict.json("POST", "/app/installations/1/access_tokens", status=201)
    refused = await strict.api("GET", REPO)  # a JWT is not an installation token
    assert refused.status == 401
    assert (await refused.json())["message"] == "Bad credentials"
    strict.token = f"token {made['token']}"
    assert (await strict.api("GET", REPO)).status == 200
    strict.sandbox.clock.advance(3600)
    expired = await strict.api("GET", REPO)
    assert expired.status == 401


@pytest.mark.parametrize("problem", ["expired", "too-long", "other-app", "other-key"])
async def test_strict_auth_refuses_bad_jwts(
    strict: Hub, app_key: rsa.RSAPrivateKey, problem: str
) -> None:
    now = strict.sandbox.clock.now()
    token = {
        "expired": lambda: app_jwt(app_key, now, lifetime=-120),
        "too-long": lambda: app_jwt(app_key, now, lifetime=3600),
        "other-app": lambda: app_jwt(app_key, now, app_id=7),
        "other-key": lambda: app_jwt(rsa.generate_private_key(65537, 2048), now),
    }[problem]()
    strict.token = f"Bearer {token}"
    response = await strict.api("GET", "/app/installations")
    assert response.status == 401


async def test_strict_auth_reads_times_from_the_sandbox_clock(
    strict: Hub, app_key: rsa.RSAPrivateKey
) -> None:
    # A JWT minted by a clock a day ahead (as the wall clock may be) has `iat` in the future.
    ahead = strict.sandbox.clock.now() + timedelta(days=1)
    strict.token = f"Bearer {app_jwt(app_key, ahead)}"
    assert (await strict.api("GET", "/app/installations")).status == 401
    strict.sandbox.clock.advance(86400)
    assert (await strict.api("GET", "/app/installations")).status == 200


async def test_a_token_issued_for_one_installation_sees_none_of_anothers_repositories_even_lenient() -> None:
    # What this catches: Klaud reading installation 2's repository with installation 1's
    # token, which GitHub answers with 404, passing against the lenient sandbox.
    scenario = small_scenario()
    other = copy.deepcopy(scenario["repositories"][0]) | {"full_name": "other/lab", "installation_id": 2}
    scenario["repositories"].append(other)
    async for hub in serve(Sandbox(scenario)):
        made = await hub.json("POST", "/app/installations/1/access_tokens", status=201)
        hub.token = f"token {made['token']}"
        assert (await hub.api("GET", REPO)).status == 200
        assert (await hub.api("GET", "/repos/other/lab")).status == 404
        assert (await hub.api("GET", "/repos/other/lab/pulls")).status == 404
        listed = await hub.json("GET", "/installation/repositories")
        assert [r["full_name"] for r in listed["repositories"]] == ["acme/bench"]
        hub.token = "token anything"  # lenient: a credential the sandbox never issued is anyone
        assert (await hub.api("GET", "/repos/other/lab")).status == 200
