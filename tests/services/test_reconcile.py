"""Reconcile against an in-memory repository: what it reads, what it rebuilds."""

from __future__ import annotations

from datetime import timedelta

from bot.core.domain import claim_ref
from bot.core.events import PullFile
from tests import scenarios as sc
from tests.services.conftest import NOW, REPO, Kit
from tests.services.fakes import pull

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
IMAGE_PATCH = "@@ -14,7 +14,7 @@ dsr1-fp8-h200-trt:\n-  image: a\n+  image: b\n"


async def test_full_reconcile_builds_the_catalog_the_index_and_the_claims(kit: Kit) -> None:
    kit.repo.pulls[12] = pull(12, updated_at=NOW)
    kit.repo.pull_files_of[12] = [PullFile(filename="configs/nvidia-master.yaml", patch=IMAGE_PATCH)]
    kit.repo.branches_at[claim_ref(H200)] = kit.repo.head
    report = await kit.reconciler.reconcile(REPO, 1)
    assert report["after"] == {"families": 5, "pulls": 1, "attempts": 0, "claims": 1}
    assert {f.id for f in kit.state.catalog} == set(sc.FAMILIES)
    assert kit.state.overlap.touches(12) == {H200: "image"}
    assert set(kit.state.claims) == {H200} and kit.state.claims[H200].wave is None
    assert kit.repo.writes() == []


async def test_light_reconcile_reads_only_heads_and_claim_refs_when_nothing_moved(kit: Kit) -> None:
    kit.repo.pulls[12] = pull(12, updated_at=NOW)
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.calls.clear()
    report = await kit.reconciler.reconcile(REPO, 1, light=True)
    assert kit.repo.calls == [("repository",), ("head_sha", "main"), ("open_pulls",), ("branches", "klaud/claim-")]
    assert report["files_fetched"] == 0


async def test_light_reconcile_reads_a_moved_head_and_a_closed_pr_disappears(kit: Kit) -> None:
    kit.repo.pulls[12] = pull(12, updated_at=NOW)
    kit.repo.pulls[13] = pull(13, updated_at=NOW)
    await kit.reconciler.reconcile(REPO, 1)
    del kit.repo.pulls[13]  # closed while its webhook was lost
    kit.repo.pulls[12] = pull(12, updated_at=NOW + timedelta(minutes=5), head_sha="f" * 40)
    kit.repo.calls.clear()
    report = await kit.reconciler.reconcile(REPO, 1, light=True)
    assert ("pull_files", 12) in kit.repo.calls
    assert report["pulls_removed"] == 1 and kit.state.overlap.get(13) is None


async def test_a_missed_push_is_caught_up_from_the_moved_head(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    new_head = "e" * 40
    nvidia = sc.NVIDIA.replace("release:1.2.0rc4", "release:1.2.0rc5")
    kit.repo.files[new_head] = {**kit.repo.files[kit.repo.head], "configs/nvidia-master.yaml": nvidia}
    kit.repo.head = new_head
    await kit.reconciler.reconcile(REPO, 1, light=True)
    family = kit.state.catalog.get(H200)
    assert family is not None and family.image.endswith("rc5")
    assert family.image_changed_at == NOW  # dated when the missed push was noticed


async def test_state_for_reconciles_a_repository_first_heard_of(kit: Kit) -> None:
    from bot.core.events import RepoEvent

    event = RepoEvent.model_validate({"repository": {"full_name": REPO}, "installation": {"id": 1}})
    state = await kit.reconciler.state_for(event)
    assert state is not None and len(state.catalog) == 5
    kit.repo.calls.clear()
    assert await kit.reconciler.state_for(event) is state
    assert kit.repo.calls == []


async def test_a_stored_repository_not_in_memory_is_reconciled_from_its_stored_state(kit: Kit) -> None:
    # A replica takes a repository over through `admit` (the leader's housekeeping) before
    # a round loaded it: its wave counter, pause and dispatches are in the store only.
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and H200 in kit.state.dispatches
    kit.live.drop(REPO)
    await kit.reconciler.reconcile(REPO, 1)
    assert kit.state.meta.wave == 1 and H200 in kit.state.dispatches
    stored = await kit.live.load_repo(REPO)
    assert stored is not None and stored.meta.wave == 1  # not written over with a fresh record
