"""`/klaud` commands answered by CommandResponder, against an in-memory repository."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from bot.core.commands import MAX_STATUS_FAMILIES
from bot.core.events import IssueCommentEvent, PullFile
from bot.services.permissions import Permissions
from bot.services.responder import CommandResponder
from tests.services.conftest import NOW, REPO, Kit
from tests.services.fakes import pull_event
from tests.services.test_pulls import H200, NVIDIA

TP_CHANGE = [PullFile(filename=NVIDIA, patch="@@ -14,3 +14,3 @@ dsr1-fp8-h200-trt:\n-  tp: 8\n+  tp: 4\n")]


async def status_reply(kit: Kit, number: int) -> str:
    responder = CommandResponder(kit.live, kit.waves, Permissions(kit.clock), kit.clock)
    event = IssueCommentEvent.model_validate({
        "action": "created", "comment": {"id": 5, "body": "/klaud status", "user": {"login": "bob", "type": "User"}},
        "issue": {"number": number, "pull_request": {}}, "repository": {"full_name": REPO}, "installation": {"id": 1},
    })
    await responder.handle(kit.state, event)
    return kit.repo.comments_on[number][-1].body


async def test_status_on_an_active_pr_answers_for_the_families_it_overlaps(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[12] = TP_CHANGE
    await kit.pulls.on_pull_request(kit.state, pull_event("opened", 12, updated_at=NOW - timedelta(days=1)))
    assert f"Status of `{H200}`" in await status_reply(kit, 12)


async def test_status_on_an_idle_pr_says_it_overlaps_nothing(kit: Kit) -> None:
    # What this catches: DESIGN §4 says an idle PR overlaps nothing, yet `/klaud status` on
    # it answered for the families its diff touches, as if it blocked them.
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[12] = TP_CHANGE
    await kit.pulls.on_pull_request(kit.state, pull_event("opened", 12, updated_at=NOW - timedelta(days=30)))
    assert kit.state.overlap.overlaps(kit.state.catalog.get(H200), NOW, 7) == []
    reply = await status_reply(kit, 12)
    assert "Status of" not in reply
    assert "PR #12 has not been updated since" in reply and "overlaps no family" in reply


async def test_status_on_a_pr_changing_the_real_configs_whole_plans_once_and_answers_for_a_few(
    kit: Kit, fixtures: Path
) -> None:
    # What this catches: a plan of the whole repository per overlapped family, each a table:
    # one `/klaud status` (anyone may ask) on a PR listed without patches, as GitHub lists a
    # large diff, held the event loop for seconds, 208 plans for the real configs.
    configs = fixtures / "inferencex" / "configs"
    files = {f"configs/{name}": (configs / name).read_text()
             for name in ("nvidia-master.yaml", "amd-master.yaml", "runners.yaml")}
    kit.repo.files[kit.repo.head].update(files)
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[12] = [PullFile(filename=name) for name in files if name.endswith("-master.yaml")]
    await kit.pulls.on_pull_request(kit.state, pull_event("opened", 12, updated_at=NOW - timedelta(hours=1)))
    overlapped = len(kit.state.overlap.touches(12))
    assert overlapped == len(kit.state.catalog) > MAX_STATUS_FAMILIES
    plans = 0
    preview = kit.waves.preview_state

    async def counted(state, now):  # type: ignore[no-untyped-def]
        nonlocal plans
        plans += 1
        return await preview(state, now)

    kit.waves.preview_state = counted  # type: ignore[method-assign]
    reply = await status_reply(kit, 12)
    assert plans == 1
    assert reply.count("Status of `") == MAX_STATUS_FAMILIES
    assert f"PR #12 overlaps {overlapped - MAX_STATUS_FAMILIES} more families." in reply
