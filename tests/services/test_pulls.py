"""The overlap index kept current from pull_request events, against an in-memory repository."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.core.events import PullFile, PullRequestEvent
from bot.github.errors import BadRequest, Unavailable
from tests import scenarios as sc
from tests.core.test_overlap import FOUR_SPACES, LONG_KEY
from tests.services.conftest import NOW, REPO, Kit
from tests.services.fakes import pull, pull_event

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
NVIDIA = "configs/nvidia-master.yaml"


def event(action: str, number: int = 12, **changes: object) -> PullRequestEvent:
    data = pull(number, updated_at=NOW, **changes).model_dump(mode="json")  # type: ignore[arg-type]
    return PullRequestEvent.model_validate(
        {"action": action, "pull_request": data, "repository": {"full_name": REPO}, "installation": {"id": 1}}
    )


async def test_files_are_read_once_per_head(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[12] = [PullFile(filename=NVIDIA, patch="@@ -14,3 +14,3 @@ dsr1-fp8-h200-trt:\n-  tp: 8\n+  tp: 4\n")]
    kit.repo.calls.clear()
    families = await kit.pulls.on_pull_request(kit.state, event("opened"))
    assert families == {H200} and kit.state.overlap.touches(12) == {H200: "flags"}
    for action in ("edited", "labeled", "synchronize"):  # same head: nothing to read
        await kit.pulls.on_pull_request(kit.state, event(action))
    assert kit.repo.calls == [("pull_files", 12)]


async def test_an_omitted_patch_is_compared_from_base_and_head_contents(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    head = "c" * 40
    amd = sc.AMD.replace("\n", "\n\n", 1)  # a blank line added: touches nothing
    kit.repo.put_files({NVIDIA: sc.NVIDIA.replace("release:1.2.0rc4", "release:1.2.1"), "configs/amd-master.yaml": amd},
                       ref=head)
    kit.repo.pull_files_of[12] = [PullFile(filename=NVIDIA, patch=None), PullFile(filename="configs/amd-master.yaml", patch=None)]
    kit.repo.calls.clear()
    await kit.pulls.on_pull_request(kit.state, event("opened", head_sha=head))
    assert kit.state.overlap.touches(12) == {H200: "image"}
    assert [c[0] for c in kit.repo.calls].count("merge_base") == 1, "asked once a read, not once a file"


async def test_an_omitted_patch_without_contents_blocks_the_whole_file(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[13] = [PullFile(filename=NVIDIA, patch=None)]
    kit.repo.fail("file_text", BadRequest(403, "Forbidden"), times=2)
    await kit.pulls.on_pull_request(kit.state, event("opened", 13, head_sha="d" * 40))
    touches = kit.state.overlap.touches(13)
    assert set(touches) == {f for f in sc.FAMILIES if f.startswith(NVIDIA)}
    assert set(touches.values()) == {"patch-unavailable"}


async def test_a_closed_pr_leaves_the_index_and_unblocks_its_families(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[12] = [PullFile(filename=NVIDIA, patch="@@ -14,3 +14,3 @@ dsr1-fp8-h200-trt:\n-  tp: 8\n+  tp: 4\n")]
    await kit.pulls.on_pull_request(kit.state, event("opened"))
    kit.repo.calls.clear()
    assert await kit.pulls.on_pull_request(kit.state, event("closed")) == {H200}
    assert kit.state.overlap.get(12) is None and kit.repo.calls == []


async def test_a_comment_makes_an_idle_pr_active_without_hiding_its_pull_request_events(kit: Kit) -> None:
    # The comment's time is kept apart from the PR's `updated_at`, which orders its events: a
    # close (or new head) sent before the comment and delivered after it still counts.
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[12] = [PullFile(filename=NVIDIA, patch="@@ -14,3 +14,3 @@ dsr1-fp8-h200-trt:\n-  tp: 8\n+  tp: 4\n")]
    month_ago = NOW - timedelta(days=30)
    await kit.pulls.on_pull_request(kit.state, pull_event("opened", 12, updated_at=month_ago))
    family = kit.state.catalog.get(H200)
    assert kit.state.overlap.overlaps(family, NOW, 7) == []  # idle
    await kit.pulls.on_comment(kit.state, 12, NOW - timedelta(seconds=5))
    assert [o.pr for o in kit.state.overlap.overlaps(family, NOW, 7)] == [12]
    await kit.pulls.on_comment(kit.state, 99, NOW)  # an issue, not a PR: nothing to do
    await kit.pulls.on_pull_request(kit.state, pull_event("labeled", 12, updated_at=month_ago + timedelta(days=1)))
    assert [o.pr for o in kit.state.overlap.overlaps(family, NOW, 7)] == [12], "an older event undid the comment"
    restored = await kit.live.load_repo(REPO)  # stored, as a restart or takeover reads it
    assert restored is not None and [o.pr for o in restored.overlap.overlaps(family, NOW, 7)] == [12]
    closed = pull_event("closed", 12, updated_at=NOW - timedelta(seconds=10))
    await kit.pulls.on_pull_request(kit.state, closed)
    assert kit.state.overlap.get(12) is None, "a close sent before the comment was taken for old news"


async def test_a_new_head_of_a_klaud_pr_asks_for_its_check_run_once(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    told: list[tuple[set[str], set[int]]] = []

    async def listener(state, families, pulls):  # type: ignore[no-untyped-def]
        told.append((families, pulls))

    kit.live.listeners.append(listener)
    cand = sc.candidate(H200)
    await kit.pulls.on_pull_request(kit.state, event("opened", 40, head_ref=f"klaud/auto-{cand}"))
    await kit.pulls.on_pull_request(kit.state, event("edited", 40, head_ref=f"klaud/auto-{cand}"))
    assert told == [({H200}, {40}), ({H200}, set())]


def at(action: str, minutes: int, **changes: object) -> PullRequestEvent:
    """A `pull_request` event whose PR was last updated `minutes` after NOW."""
    return pull_event(action, 12, updated_at=NOW + timedelta(minutes=minutes), **changes)


async def test_events_delivered_late_do_not_roll_the_index_back(kit: Kit) -> None:
    # GitHub does not deliver in order: the last event to arrive is not always the newest.
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[12] = [PullFile(filename=NVIDIA, patch="@@ -14,3 +14,3 @@ dsr1-fp8-h200-trt:\n-  tp: 8\n+  tp: 4\n")]
    await kit.pulls.on_pull_request(kit.state, at("opened", 0, head_sha="a" * 40))
    await kit.pulls.on_pull_request(kit.state, at("synchronize", 2, head_sha="b" * 40))
    assert await kit.pulls.on_pull_request(kit.state, at("synchronize", 1, head_sha="c" * 40)) == set()
    record = kit.state.overlap.get(12)
    assert record is not None and record.head_sha == "b" * 40  # the older head did not come back
    await kit.pulls.on_pull_request(kit.state, at("closed", 3))
    await kit.pulls.on_pull_request(kit.state, at("edited", 2))  # sent before the close
    assert kit.state.overlap.get(12) is None  # a closed PR blocks nothing
    await kit.pulls.on_pull_request(kit.state, at("reopened", 3))  # the same second: news
    assert kit.state.overlap.get(12) is not None
    await kit.pulls.on_pull_request(kit.state, at("closed", 2))  # the first close, late
    assert kit.state.overlap.touches(12) == {H200: "flags"}


PATCH = "@@ -14,3 +14,3 @@ dsr1-fp8-h200-trt:\n-  tp: 8\n+  tp: 4\n"


async def test_a_renamed_master_config_overlaps_the_families_of_its_old_path(kit: Kit) -> None:
    # DESIGN §4 Overlap index: a rename changes two paths; the families of the old one are
    # touched (else a PR moving a config away blocks nothing and its families are dispatched).
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[21] = [
        PullFile(filename="configs/nvidia-old.yaml", previous_filename=NVIDIA, status="renamed", patch=PATCH)
    ]
    await kit.pulls.on_pull_request(kit.state, event("opened", 21))
    assert kit.state.overlap.touches(21) == {H200: "flags"}


def docs(count: int) -> list[PullFile]:
    return [PullFile(filename=f"docs/page-{i}.md", patch="@@ -1 +1 @@\n-a\n+b\n") for i in range(count)]


async def test_a_pr_listing_3000_files_may_hide_more_and_overlaps_every_family(kit: Kit) -> None:
    # GitHub lists at most 3,000 files: a listing of exactly 3,000 may be truncated, and what
    # it left out may touch any family (bot/core/overlap.py `files_complete`).
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[22] = docs(3000)
    await kit.pulls.on_pull_request(kit.state, event("opened", 22))
    touches = kit.state.overlap.touches(22)
    assert set(touches) == set(sc.FAMILIES) and set(touches.values()) == {"patch-unavailable"}


async def test_a_pr_listing_2999_files_is_complete_and_its_docs_overlap_nothing(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[23] = docs(2999)
    await kit.pulls.on_pull_request(kit.state, event("opened", 23))
    assert kit.state.overlap.touches(23) == {}


async def test_a_shared_file_without_a_patch_is_not_read_and_overlaps_nothing(kit: Kit) -> None:
    # Shared files never overlap (DESIGN §4): a large non-config diff is not compared from
    # base and head contents (two reads per file, and a transient error would fail the event).
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[24] = [PullFile(filename="docs/huge.md", patch=None),
                                  PullFile(filename="configs/notes.yaml", patch=None)]
    kit.repo.calls.clear()
    await kit.pulls.on_pull_request(kit.state, event("opened", 24))
    assert kit.repo.calls == [("pull_files", 24)]
    assert kit.state.overlap.touches(24) == {}


@pytest.mark.parametrize(
    ("patch", "unavailable", "keys"), [(PATCH, False, {"dsr1-fp8-h200-trt": "flags"}), (None, True, {})]
)
async def test_a_yaml_file_outside_config_globs_keeps_what_its_patch_says(
    kit: Kit, patch: str | None, unavailable: bool, keys: dict[str, str]
) -> None:
    # pulls.py: a YAML file's keys are kept (nothing read when GitHub omits its patch: it is
    # kept as unavailable), so that a push widening `config_globs` to it makes the PR
    # overlap its families (every one, as `patch-unavailable`, without a patch) without a
    # re-read.
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[25] = [PullFile(filename="configs/extra.yaml", patch=patch)]
    await kit.pulls.on_pull_request(kit.state, event("opened", 25))
    record = kit.state.overlap.get(25)
    assert record is not None
    [change] = record.changes
    assert (change.unavailable, change.keys) == (unavailable, keys)


async def test_a_transient_error_reading_contents_fails_the_event_so_a_later_delivery_reads_again(kit: Kit) -> None:
    # Files are read once per head: recorded as `patch-unavailable` after a mere 502, the PR
    # would block every family of the file until its next push. Raised, the head stays unread.
    await kit.reconciler.reconcile(REPO, 1)
    head = "c" * 40
    kit.repo.put_files({NVIDIA: sc.NVIDIA.replace("release:1.2.0rc4", "release:1.2.1")}, ref=head)
    kit.repo.pull_files_of[27] = [PullFile(filename=NVIDIA, patch=None)]
    kit.repo.fail("file_text", Unavailable(502, "Bad Gateway"))
    with pytest.raises(Unavailable):
        await kit.pulls.on_pull_request(kit.state, event("opened", 27, head_sha=head))
    await kit.pulls.on_pull_request(kit.state, event("opened", 27, head_sha=head))  # redelivered
    assert kit.state.overlap.touches(27) == {H200: "image"}


async def test_a_config_whose_diff_could_not_be_had_is_read_again_until_it_can(kit: Kit) -> None:
    # DESIGN §4: `patch-unavailable` "until a later refresh succeeds". The record of the head
    # was reused as it was, so a contents read refused once (a 403) blocked every family of
    # the file until the author pushed again, whatever event or reconcile came.
    await kit.reconciler.reconcile(REPO, 1)
    head = "d" * 40
    kit.repo.put_files({NVIDIA: sc.NVIDIA.replace("release:1.2.0rc4", "release:1.2.1")}, ref=head)
    kit.repo.pull_files_of[28] = [PullFile(filename=NVIDIA, patch=None)]
    kit.repo.fail("file_text", BadRequest(403, "Forbidden"), times=1)
    await kit.pulls.on_pull_request(kit.state, event("opened", 28, head_sha=head))
    assert set(kit.state.overlap.touches(28).values()) == {"patch-unavailable"}
    await kit.pulls.on_pull_request(kit.state, event("edited", 28, head_sha=head))  # same head
    assert kit.state.overlap.touches(28) == {H200: "image"}
    kit.repo.calls.clear()
    await kit.pulls.on_pull_request(kit.state, event("edited", 28, head_sha=head))
    assert ("pull_files", 28) not in kit.repo.calls  # read once it could be: then kept again


async def test_a_config_diff_too_large_to_keep_is_not_read_again_for_the_same_head(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A diff of more keys than a FileChange keeps is kept as unavailable; read again at
    # every event and reconcile, a hostile PR's 22 MB config was fetched and diffed each time.
    monkeypatch.setattr("bot.core.overlap.MAX_CHANGED_KEYS", 2)
    await kit.reconciler.reconcile(REPO, 1)
    head = "e" * 40
    kit.repo.put_files({NVIDIA: sc.NVIDIA + "".join(f"k{n}:\n  image: x\n" for n in range(3))}, ref=head)
    kit.repo.pull_files_of[29] = [PullFile(filename=NVIDIA, patch=None)]
    await kit.pulls.on_pull_request(kit.state, event("opened", 29, head_sha=head))
    assert set(kit.state.overlap.touches(29).values()) == {"patch-unavailable"}
    kit.repo.calls.clear()
    await kit.pulls.on_pull_request(kit.state, event("edited", 29, head_sha=head))
    assert kit.repo.calls == []


async def test_a_pr_retargeted_to_another_base_is_read_again(kit: Kit) -> None:
    # What this catches: files were read once per head, and retargeting changes the base,
    # not the head: the PR kept its old base's overlaps (or none where it now had some).
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pull_files_of[12] = [PullFile(filename=NVIDIA, patch="@@ -14,3 +14,3 @@ dsr1-fp8-h200-trt:\n-  tp: 8\n+  tp: 4\n")]
    await kit.pulls.on_pull_request(kit.state, event("opened"))
    assert kit.state.overlap.touches(12) == {H200: "flags"}
    kit.repo.pull_files_of[12] = []  # the new base already holds the change
    retargeted = event("edited")
    retargeted = retargeted.model_copy(update={"pull_request": retargeted.pull_request.model_copy(
        update={"base": retargeted.pull_request.base.model_copy(update={"ref": "release"})})})
    await kit.pulls.on_pull_request(kit.state, retargeted)
    assert kit.state.overlap.touches(12) == {}


# A family key of 80+ characters (LONG_KEY): git cuts a hunk header's context to 80 bytes,
# so the header of a hunk inside its block names the key without its `:`.
# As `git diff` prints it for a tp change of that family in `sc.NVIDIA`.
LONG_TP_PATCH = (
    "@@ -26,7 +26,7 @@ " + LONG_KEY[:80] + "\n"
    "     - isl: 8192\n       osl: 1024\n       search-space:\n"
    "-      - { tp: 8, conc-start: 4, conc-end: 32 }\n+      - { tp: 4, conc-start: 4, conc-end: 32 }\n"
    " \n gptoss-fp4-b200-vllm:\n   image: vllm/vllm-openai:v0.11.2\n"
)


async def reconciled_with_long_keys(kit: Kit, *keys: str) -> str:
    """The H200 family renamed to the first of `keys`, copies of it under the others; its text."""
    text = sc.NVIDIA.replace("dsr1-fp8-h200-trt:", f"{keys[0]}:")
    block = text[text.index(f"{keys[0]}:") : text.index("gptoss-fp4-b200-vllm:")]
    text += "".join("\n" + block.replace(f"{keys[0]}:", f"{key}:", 1) for key in keys[1:])
    kit.repo.put_files({NVIDIA: text})
    await kit.reconciler.reconcile(REPO, 1)
    assert {f"{NVIDIA}:{key}" for key in keys} <= {f.id for f in kit.state.catalog}
    return text


async def test_a_patch_whose_hunk_header_cuts_a_long_family_key_touches_that_family(kit: Kit) -> None:
    await reconciled_with_long_keys(kit, LONG_KEY)
    kit.repo.pull_files_of[31] = [PullFile(filename=NVIDIA, patch=LONG_TP_PATCH)]
    kit.repo.calls.clear()
    await kit.pulls.on_pull_request(kit.state, event("opened", 31))
    assert kit.state.overlap.touches(31) == {f"{NVIDIA}:{LONG_KEY}": "flags"}
    assert kit.repo.calls == [("pull_files", 31)]  # the patch sufficed


async def test_a_cut_key_two_families_begin_is_decided_from_the_contents(kit: Kit) -> None:
    other = LONG_KEY[:80] + "-other"
    text = await reconciled_with_long_keys(kit, LONG_KEY, other)
    head = "c" * 40
    kit.repo.put_files({NVIDIA: text.replace("tp: 8, conc-start: 4, conc-end: 32", "tp: 4, conc-start: 4, conc-end: 32", 1)}, ref=head)
    kit.repo.pull_files_of[32] = [PullFile(filename=NVIDIA, patch=LONG_TP_PATCH)]
    await kit.pulls.on_pull_request(kit.state, event("opened", 32, head_sha=head))
    assert kit.state.overlap.touches(32) == {f"{NVIDIA}:{LONG_KEY}": "flags"}


@pytest.mark.parametrize(("written", "key"), [("405b-fp8-h200-trt", "405b-fp8-h200-trt"),
                                              ('"quoted-fp8-h200-trt"', "quoted-fp8-h200-trt")])
async def test_a_change_deep_in_a_family_whose_key_line_git_passes_over_blocks_that_family(
    kit: Kit, written: str, key: str
) -> None:
    # git heads a hunk with the nearest line above it that begins with a letter, `_` or `$`:
    # a change deep in `405b-…`'s (or `"quoted…"`'s) block came headed by the key above, whose
    # family it blocked while the one changed stayed free for the next wave. Such a file is
    # read from its contents.
    from bot.sandbox.gitdiff import unified_diff

    text = sc.NVIDIA.replace("dsr1-fp8-h200-trt:", f"{written}:")
    kit.repo.put_files({NVIDIA: text})
    await kit.reconciler.reconcile(REPO, 1)
    assert f"{NVIDIA}:{key}" in {f.id for f in kit.state.catalog}
    changed = text.replace("tp: 8, conc-start: 4, conc-end: 32", "tp: 4, conc-start: 4, conc-end: 32", 1)
    head = "c" * 40
    kit.repo.put_files({NVIDIA: changed}, ref=head)
    patch = unified_diff(text, changed)
    assert key not in patch.split("\n", 1)[0]  # as git heads it: the key above
    kit.repo.pull_files_of[33] = [PullFile(filename=NVIDIA, patch=patch)]
    await kit.pulls.on_pull_request(kit.state, event("opened", 33, head_sha=head))
    assert kit.state.overlap.touches(33) == {f"{NVIDIA}:{key}": "flags"}


async def test_an_image_bump_in_a_four_space_config_is_read_as_an_image_change(kit: Kit) -> None:
    four = "configs/four-master.yaml"
    kit.repo.put_files({four: FOUR_SPACES})
    await kit.reconciler.reconcile(REPO, 1)
    patch = "@@ -3,7 +3,7 @@ fam-a:\n     framework: vllm\n-    image: repo/img:a\n+    image: repo/img:b\n     tp: 8\n"
    kit.repo.pull_files_of[12] = [PullFile(filename=four, patch=patch)]
    await kit.pulls.on_pull_request(kit.state, event("opened"))
    assert kit.state.overlap.touches(12) == {f"{four}:fam-a": "image"}


async def test_a_transient_merge_base_failure_does_not_charge_the_pr_with_the_base_branch_changes(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    head, branch_point = "c" * 40, "e" * 40
    # Main bumped B200's image after the PR branched off: at the branch point it was older.
    old = sc.NVIDIA.replace("lmsysorg/sglang:v0.5.16-cu130", "lmsysorg/sglang:v0.5.15-cu130")
    kit.repo.put_files({NVIDIA: old}, ref=branch_point)
    kit.repo.put_files({NVIDIA: old.replace("release:1.2.0rc4", "release:1.2.1")}, ref=head)
    kit.repo.merge_bases[(kit.repo.head, head)] = branch_point
    kit.repo.pull_files_of[12] = [PullFile(filename=NVIDIA, patch=None)]
    kit.repo.pulls[12] = pull(12, head_sha=head, updated_at=NOW)
    kit.repo.fail("merge_base", Unavailable(502, "Bad Gateway"), times=1)  # one blip
    with pytest.raises(Unavailable):  # retried: the delivery, or the next light reconcile
        await kit.pulls.on_pull_request(kit.state, pull_event("opened", 12, head_sha=head, updated_at=NOW))
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert kit.state.overlap.touches(12) == {H200: "image"}, "charged with what main got since its branch point"
