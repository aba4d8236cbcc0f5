"""GitHub's own example payloads (octokit/webhooks) of every event Klaud subscribes to, sent
for a repository Klaud keeps: each is handled without an error."""

from __future__ import annotations

import json
from pathlib import Path

from bot.core.errors import is_permanent
from bot.github.errors import GitHubError
from bot.web.events import KLAUD_EVENTS
from tests import scenarios as sc
from tests.builders import delivery
from tests.harness import sandbox_stack

# Last: `installation` deleted and suspended forget or stop the repository.
LAST = "installation"


def as_an_app_delivery(payload: dict) -> bytes:
    """The example aimed at the sandbox's repository, with the installation an App's
    deliveries always carry (the repository-webhook examples have none)."""
    if isinstance(payload.get("repository"), dict):
        payload["repository"].update(full_name="acme/bench", name="bench")
    payload["installation"] = {**payload.get("installation", {}), "id": 1}
    return json.dumps(payload).encode()


async def test_every_example_payload_of_a_subscribed_event_is_handled(tmp_path, fixtures: Path) -> None:
    # What this catches: a field GitHub sends that a typed event model refuses (a null, a
    # missing key), or a handler failing on a real shape, where hand-made payloads pass.
    examples = [path for event in [*sorted(KLAUD_EVENTS - {LAST}), LAST]
                for path in sorted((fixtures / "octokit-webhooks" / event).glob("*.json"))]
    assert len(examples) > 40
    failed = []
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        for number, path in enumerate(examples):
            body = as_an_app_delivery(json.loads(path.read_text()))
            try:
                await run.klaud.handle(delivery(f"example-{number}", path.parent.name, body))
            except (GitHubError, ValueError) as exc:
                failed.append(f"{path.parent.name}/{path.name}: {type(exc).__name__} (permanent={is_permanent(exc)}): {exc}")
    assert failed == []
