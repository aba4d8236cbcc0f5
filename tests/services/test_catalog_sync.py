"""Pushes to the default branch and to claim refs, against an in-memory repository."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bot.core.doctor import config_checks
from bot.core.domain import claim_ref
from bot.core.events import Account, BlameRange, PullFile, PullRequestEvent, PushEvent
from bot.core.policy import POLICY_PATH
from bot.services.catalog_sync import pushed_since_pause
from bot.services.repo_state import RepoMeta, RepoState
from bot.store.change import Change
from tests import scenarios as sc
from tests.services.conftest import NOW, REPO, Kit
from tests.services.fakes import pull

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
PUSHED_AT = datetime(2026, 11, 30, 7, 30, tzinfo=UTC)


def push(ref: str, before: str, after: str, *, deleted: bool = False) -> PushEvent:
    return PushEvent.model_validate(
        {
            "ref": ref, "before": before, "after": after, "deleted": deleted,
            "repository": {"full_name": REPO, "pushed_at": int(PUSHED_AT.timestamp())},
            "installation": {"id": 1},
        }
    )


async def test_a_push_reads_one_compare_and_the_changed_config_only(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    before, after = kit.repo.head, "e" * 40
    nvidia = sc.NVIDIA.replace("release:1.2.0rc4", "release:1.2.0rc5")
    kit.repo.files[after] = {**kit.repo.files[before], "configs/nvidia-master.yaml": nvidia}
    kit.repo.calls.clear()
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    assert kit.repo.calls == [("changed_paths", before, after), ("file_text", "configs/nvidia-master.yaml", after)]
    family = kit.state.catalog.get(H200)
    assert family is not None and family.image.endswith("rc5")
    assert family.image_changed_at == PUSHED_AT  # dated by the push, not the commit
    assert kit.state.meta.head_sha == after


async def test_a_push_whose_base_is_not_the_head_applied_catches_up_from_that_head(kit: Kit) -> None:
    # A push before it was lost: the branch is read where it is, from the head applied.
    await kit.reconciler.reconcile(REPO, 1)
    known, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {**kit.repo.files[known], "configs/nvidia-master.yaml": sc.NVIDIA.replace("1.2.0rc4", "1.2.0rc9")}
    kit.repo.head = after
    kit.repo.calls.clear()
    await kit.catalog.on_push(kit.state, push("refs/heads/main", "9" * 40, after))
    assert ("changed_paths", known, after) in kit.repo.calls
    assert kit.state.meta.head_sha == after and kit.state.catalog.get(H200).image.endswith("rc9")


async def test_a_push_delivered_after_a_later_one_leaves_the_catalog_at_the_later_commit(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    first, second, third = kit.repo.head, "a" * 40, "b" * 40
    kit.repo.files[second] = {**kit.repo.files[first], "configs/nvidia-master.yaml": sc.NVIDIA.replace("1.2.0rc4", "1.2.0rc5")}
    kit.repo.files[third] = {**kit.repo.files[first], "configs/nvidia-master.yaml": sc.NVIDIA.replace("1.2.0rc4", "1.2.0rc6")}
    kit.repo.head = third
    await kit.catalog.on_push(kit.state, push("refs/heads/main", second, third))  # delivered first
    await kit.catalog.on_push(kit.state, push("refs/heads/main", first, second))  # the older one, late
    assert kit.state.meta.head_sha == third and kit.state.catalog.get(H200).image.endswith("rc6")


async def test_claim_refs_made_elsewhere_are_tracked(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    ref = f"refs/heads/{claim_ref(H200)}"
    await kit.catalog.on_push(kit.state, push(ref, "0" * 40, kit.repo.head))
    assert kit.state.claims[H200].wave is None
    await kit.catalog.on_push(kit.state, push(ref, kit.repo.head, "0" * 40, deleted=True))
    assert H200 not in kit.state.claims


async def test_pushes_to_other_branches_read_nothing(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.calls.clear()
    await kit.catalog.on_push(kit.state, push("refs/heads/topic", "1" * 40, "2" * 40))
    assert kit.repo.calls == []


NVIDIA_ONLY = 'config_globs: ["configs/nvidia-master.yaml"]\n'
MI355X = "configs/amd-master.yaml:dsr1-fp8-mi355x-sglang"


async def test_a_push_narrowing_config_globs_drops_the_families_of_the_files_left_out(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    assert kit.state.catalog.get(MI355X) is not None
    before, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {**kit.repo.files[before], ".github/klaud.yml": NVIDIA_ONLY}
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    # They stayed live, and planned, until a full reconcile.
    assert {f.path for f in kit.state.catalog} == {"configs/nvidia-master.yaml"}


BAD_CONFIG = "configs/bad-master.yaml"
RUNNERS = "configs/runners.yaml"
NVIDIA_AND_AMD = 'config_globs: ["configs/nvidia-master.yaml", "configs/amd-master.yaml"]\n'


@pytest.mark.parametrize("seen_by", ["push", "light reconcile", "full reconcile"])
async def test_narrowed_config_globs_drop_the_error_of_a_master_config_no_longer_matched(kit: Kit, seen_by: str) -> None:
    # What this catches: only the paths of families were dropped; a master config that never
    # parsed has none, and its error stayed in the state, check runs and dashboard for good.
    await kit.reconciler.reconcile(REPO, 1)
    first, broken, narrowed = kit.repo.head, "a" * 40, "b" * 40
    unresolved = sc.RUNNERS + "  h100:\n    - h100-gone_0\n"  # a problem of the runners file, which stays
    kit.repo.files[broken] = {**kit.repo.files[first], BAD_CONFIG: "dsr1-x:\n  image: [unclosed\n", RUNNERS: unresolved}
    kit.repo.head = broken
    await kit.catalog.on_push(kit.state, push("refs/heads/main", first, broken))
    assert {BAD_CONFIG, RUNNERS} <= kit.state.meta.config_errors.keys()

    kit.repo.files[narrowed] = {**kit.repo.files[broken], ".github/klaud.yml": NVIDIA_AND_AMD}
    kit.repo.head = narrowed
    if seen_by == "push":
        await kit.catalog.on_push(kit.state, push("refs/heads/main", broken, narrowed))
    else:
        await kit.reconciler.reconcile(REPO, 1, light=seen_by == "light reconcile")

    assert list(kit.state.policy.config_globs) == ["configs/nvidia-master.yaml", "configs/amd-master.yaml"]
    assert kit.state.meta.config_errors.keys() == {RUNNERS}


async def test_a_push_widening_config_globs_makes_open_prs_overlap_the_families_it_adds(kit: Kit) -> None:
    kit.repo.put_files({".github/klaud.yml": NVIDIA_ONLY})
    await kit.reconciler.reconcile(REPO, 1)
    bump = "@@ -1,3 +1,3 @@\n dsr1-fp8-mi355x-sglang:\n-  image: lmsysorg/sglang:v0.5.5-rocm700-mi35x\n+  image: lmsysorg/sglang:v0.5.6-rocm700-mi35x\n"
    kit.repo.pull_files_of[12] = [PullFile(filename="configs/amd-master.yaml", patch=bump)]
    await kit.pulls.on_pull_request(kit.state, PullRequestEvent.model_validate({
        "action": "opened", "pull_request": pull(12, updated_at=NOW).model_dump(mode="json"),
        "repository": {"full_name": REPO}, "installation": {"id": 1},
    }))
    before, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {k: v for k, v in kit.repo.files[before].items() if k != ".github/klaud.yml"}
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    # The PR's files are read once per head: read while the file was no config, it blocked
    # nothing until its next push.
    assert kit.state.overlap.touches(12) == {MI355X: "image"}


async def test_pushes_of_klauds_own_claim_refs_are_skipped_however_late_they_come(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    ref = f"refs/heads/{claim_ref(H200)}"

    def own(before: str, after: str, *, deleted: bool = False) -> PushEvent:
        event = push(ref, before, after, deleted=deleted)
        return event.model_copy(update={"sender": Account(login="klaud-cold[bot]", type="Bot")})

    # The push of a claim Klaud made and has released since: a claim nobody holds.
    await kit.catalog.on_push(kit.state, own("0" * 40, kit.repo.head))
    assert H200 not in kit.state.claims
    # The next wave's claim, then the late deletion push of the one before it.
    await kit.waves.run(REPO, trigger="test")
    assert H200 in kit.state.claims
    await kit.catalog.on_push(kit.state, own(kit.repo.head, "0" * 40, deleted=True))
    assert H200 in kit.state.claims


NVIDIA = "configs/nvidia-master.yaml"


async def test_a_push_deleting_a_master_config_drops_its_families(kit: Kit) -> None:
    # A family whose config is gone must not be planned (and dispatched) any more.
    await kit.reconciler.reconcile(REPO, 1)
    before, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {k: v for k, v in kit.repo.files[before].items() if k != NVIDIA}
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    assert kit.state.catalog.families_of(NVIDIA) == []
    assert {f.path for f in kit.state.catalog} == {"configs/amd-master.yaml"}


async def test_a_full_reconcile_drops_the_families_of_a_config_deleted_meanwhile(kit: Kit) -> None:
    # DESIGN §4 Families: kept from the default branch, re-read at reconcile (a push lost).
    await kit.reconciler.reconcile(REPO, 1)
    after = "e" * 40
    kit.repo.files[after] = {k: v for k, v in kit.repo.files[kit.repo.head].items() if k != NVIDIA}
    kit.repo.head = after
    await kit.reconciler.reconcile(REPO, 1)
    assert {f.path for f in kit.state.catalog} == {"configs/amd-master.yaml"}


async def test_a_push_changing_runners_yaml_retargets_the_families(kit: Kit) -> None:
    # DESIGN §4 Clusters: a runner label targets the clusters `runners.yaml` lists for it.
    await kit.reconciler.reconcile(REPO, 1)
    assert kit.state.catalog.get(H200).clusters == ("h200-nb",)
    before, after = kit.repo.head, "e" * 40
    runners = sc.RUNNERS.replace("    - h200-nb_0\n    - h200-nb_1\n", "    - b200-dgxc_0\n")
    kit.repo.files[after] = {**kit.repo.files[before], "configs/runners.yaml": runners}
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    assert kit.state.catalog.get(H200).clusters == ("b200-dgxc",)


async def test_a_runner_label_that_resolves_to_no_cluster_is_a_config_error_of_its_file(kit: Kit) -> None:
    # DESIGN §4 Clusters: listed in `config_errors`, never silently waiting on a cluster.
    await kit.reconciler.reconcile(REPO, 1)
    before, after = kit.repo.head, "e" * 40
    broken = sc.NVIDIA.replace("  runner: h200\n", "  runner: h100\n", 1)
    kit.repo.files[after] = {**kit.repo.files[before], NVIDIA: broken}
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    assert "h100" in kit.state.meta.config_errors.get(NVIDIA, "")


WORKFLOW = ".github/workflows/klaud-candidate.yml"


async def test_a_push_fixing_only_the_candidate_workflow_lifts_the_setup_error(kit: Kit) -> None:
    # DESIGN §4 Setup errors: waves select nothing "until a push fixes it"; the push that
    # fixes it may change the workflow file alone (no policy change).
    broken = sc.CANDIDATE_WORKFLOW.replace("      wave: {required: true, type: string}\n", "")
    kit.repo.put_files({WORKFLOW: broken})
    await kit.reconciler.reconcile(REPO, 1)
    blocked = kit.state.blocked()
    assert blocked is not None and blocked.code == "setup-error"
    before, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {**kit.repo.files[before], WORKFLOW: sc.CANDIDATE_WORKFLOW}
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    assert kit.state.blocked() is None


async def test_a_push_that_makes_the_policy_invalid_re_renders_every_family(kit: Kit) -> None:
    # DESIGN §4 Check run: a push that makes the policy or a config invalid re-renders every
    # Klaud check run at once.
    await kit.reconciler.reconcile(REPO, 1)
    told: list[set[str]] = []

    async def listener(state, families, pulls):  # type: ignore[no-untyped-def]
        told.append(set(families))

    kit.live.listeners.append(listener)
    before, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {**kit.repo.files[before], ".github/klaud.yml": "max_candidates_per_wave: [\n"}
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    assert kit.state.meta.policy_error
    assert told and told[-1] == {f.id for f in kit.state.catalog}


async def test_a_push_deleting_runners_yaml_keeps_the_last_runners_and_says_why(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    before, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {k: v for k, v in kit.repo.files[before].items() if k != "configs/runners.yaml"}
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    assert "not found" in kit.state.meta.config_errors.get("configs/runners.yaml", "")
    assert kit.state.catalog.get(H200).clusters == ("h200-nb",)


def test_a_push_missed_may_have_come_after_a_pause_begun_in_its_second_or_within_the_skew() -> None:
    # Found by a review: the pause is stamped with microseconds and GitHub's pushed_at is in
    # whole seconds on its own clock: a push at 10:00:00.8, after a pause at 10:00:00.3,
    # read 10:00:00 and was taken for one before the pause (dispatch stayed paused).
    state = RepoState(REPO, RepoMeta(installation=1))
    assert pushed_since_pause(state, None)  # no pause: nothing to judge
    state.meta.pause = {"reason": "r", "since": "2026-11-30T10:00:00.300000Z"}
    assert pushed_since_pause(state, datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC))
    assert pushed_since_pause(state, datetime(2026, 11, 30, 9, 59, 30, tzinfo=UTC))  # a clock behind
    assert not pushed_since_pause(state, datetime(2026, 11, 30, 9, 58, 0, tzinfo=UTC))


async def test_a_missed_push_is_judged_by_the_repository_read_after_the_head_moved(kit: Kit) -> None:
    # A reconcile reads the repository, then the head: a push between the two moves the
    # head with the repository's pushed_at from before it. Found before the pause by the
    # first read, it is read again before the canary is refused.
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.meta.pause = {"reason": "r", "since": "2026-11-30T10:00:00Z"}
    stale = await kit.repo.repository()
    stale = stale.model_copy(update={"pushed_at": datetime(2026, 11, 30, 9, 0, tzinfo=UTC)})
    after = "e" * 40
    kit.repo.files[after] = dict(kit.repo.files[kit.repo.head])
    kit.repo.head, kit.repo.pushed_at = after, datetime(2026, 11, 30, 10, 30, tzinfo=UTC)
    await kit.catalog.catch_up(kit.state, kit.repo, Change(), stale)
    assert kit.state.meta.canary == {"armed": True, "candidate": None, "wave": None}
    kit.state.meta.canary = None
    kit.repo.head, kit.repo.pushed_at = "f" * 40, datetime(2026, 11, 30, 9, 30, tzinfo=UTC)
    kit.repo.files["f" * 40] = dict(kit.repo.files[after])
    await kit.catalog.catch_up(kit.state, kit.repo, Change(), stale)
    assert kit.state.meta.canary is None  # both reads say it came before the pause


NESTED_POLICY = 'config_globs: ["configs/**/*-master.yaml"]\n'
NESTED = "configs/nvidia/nvidia-master.yaml"


@pytest.mark.parametrize("glob", ["configs/**/*-master.yaml", "configs/**-master.yaml"])
async def test_a_glob_reaching_into_folders_finds_their_master_configs_at_install(kit: Kit, glob: str) -> None:
    # Only the glob's fixed folder was listed, not its folders: no family at install.
    kit.repo.put_files({".github/klaud.yml": f'config_globs: ["{glob}"]\n', NESTED: sc.NVIDIA})
    await kit.reconciler.reconcile(REPO, 1)
    assert kit.state.meta.policy_error is None
    assert NESTED in {family.path for family in kit.state.catalog}
    assert ("directory", "configs", kit.repo.head) in kit.repo.calls


async def test_a_full_reconcile_keeps_the_nested_families_a_push_brought_in(kit: Kit) -> None:
    kit.repo.put_files({".github/klaud.yml": NESTED_POLICY})
    await kit.reconciler.reconcile(REPO, 1)
    before, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {**kit.repo.files[before], NESTED: sc.NVIDIA}
    kit.repo.head = after
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    assert NESTED in {family.path for family in kit.state.catalog}
    await kit.reconciler.reconcile(REPO, 1)  # a full reconcile at the same head
    assert NESTED in {family.path for family in kit.state.catalog}


def test_a_glob_spans_folders_when_a_folder_follows_its_fixed_part() -> None:
    from bot.services.catalog_sync import spans_folders

    assert [spans_folders(p) for p in ("configs/*-master.yaml", "*-master.yaml", "configs/**/*-master.yaml",
                                       "configs/*/x-master.yaml", "**/x.yaml", "a/b/*.yaml",
                                       "configs/**-master.yaml", "configs/**")] == \
        [False, False, True, True, True, False, True, True]


MOVED_RUNNERS = "configs/runners-v2.yaml"


async def test_a_policy_push_naming_another_runners_file_reads_that_file(kit: Kit) -> None:
    # Runners were read again only when the push changed the runners file itself: the
    # configs were parsed again with the old file's clusters, its problems kept.
    moved = sc.RUNNERS.replace("  h200-nb: {}\n", "  h200-nb: {}\n  h200-dgxc: {}\n").replace(
        "    - h200-nb_0\n    - h200-nb_1\n", "    - h200-dgxc_0\n")
    kit.repo.put_files({MOVED_RUNNERS: moved})
    await kit.reconciler.reconcile(REPO, 1)
    assert kit.state.catalog.get(H200).clusters == ("h200-nb",)
    kit.state.meta.config_errors["configs/runners.yaml"] = "runner `x` names no cluster"
    before, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {**kit.repo.files[before], ".github/klaud.yml": f"runners_file: {MOVED_RUNNERS}\n"}
    kit.repo.head = after
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    assert kit.state.policy.runners_file == MOVED_RUNNERS
    assert kit.state.catalog.get(H200).clusters == ("h200-dgxc",)
    assert "configs/runners.yaml" not in kit.state.meta.config_errors


_AMD = "configs/amd-master.yaml"
_OLD = NOW - timedelta(days=200)


async def test_a_push_widening_config_globs_dates_the_families_it_brings_in_by_their_history(kit: Kit) -> None:
    # The amd config has existed, unchanged, for 200 days; only the policy excluded it.
    kit.repo.put_files({".github/klaud.yml": NVIDIA_ONLY})
    kit.repo.blames[_AMD] = [BlameRange(startingLine=1, endingLine=10_000, committed=_OLD)]
    await kit.reconciler.reconcile(REPO, 1)
    assert kit.state.catalog.get(MI355X) is None
    before, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {k: v for k, v in kit.repo.files[before].items() if k != ".github/klaud.yml"}
    kit.repo.head = after
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    # And the next light reconcile asks the history for whatever is still unknown.
    await kit.reconciler.reconcile(REPO, 1, light=True)
    family = kit.state.catalog.get(MI355X)
    assert family is not None
    # The push changed only .github/klaud.yml: no image line of the amd config moved. Dated
    # by the push, the family looked brand new (age 0) and went to the back of every wave.
    assert family.image_changed_at != PUSHED_AT
    assert family.image_changed_at == _OLD


TYPO = 'config_globs: ["config/*-master.yaml"]\n'  # `config/`, not `configs/`: matches no file


async def test_a_push_whose_config_globs_match_no_file_says_why_every_family_left(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    assert len(kit.state.catalog) > 0
    before, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {**kit.repo.files[before], ".github/klaud.yml": TYPO}
    kit.repo.head = after
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    # A valid policy whose globs match nothing: every family left the waves.
    assert kit.state.meta.policy_error is None
    assert len(kit.state.catalog) == 0
    preview = await kit.waves.preview(REPO)
    assert preview is not None and preview.decisions == ()
    # ... and nothing anywhere says why: no config error, no policy error, and the doctor's
    # "master configs" check passes with "0 families parsed".
    document = kit.state.state_document(kit.clock.now())
    assert document["config_errors"] or document["policy_error"], document["config_errors"]
    checks = config_checks(kit.state.meta.config_errors, kit.state.policy.runners_file, len(kit.state.catalog))
    assert not all(check.ok for check in checks), checks
    # A person's text, in a code span: raw in Markdown, two `*` italicise what lies between
    # them, and a glob `@org/team-*` would mention a team.
    assert "(`config/*-master.yaml`)" in kit.state.meta.config_errors[".github/klaud.yml"]
    fixed = "f" * 40  # the typo fixed: the families come back, the error goes
    kit.repo.files[fixed] = {k: v for k, v in kit.repo.files[before].items() if k != ".github/klaud.yml"}
    kit.repo.head = fixed
    await kit.catalog.on_push(kit.state, push("refs/heads/main", after, fixed))
    assert len(kit.state.catalog) > 0 and not kit.state.state_document(kit.clock.now())["config_errors"]


async def test_a_push_adding_the_first_master_config_clears_the_globs_match_no_file_error(kit: Kit) -> None:
    # A fresh install on a repository whose master configs are not there yet.
    before = kit.repo.head
    kit.repo.files[before] = {k: v for k, v in kit.repo.files[before].items() if not k.endswith("-master.yaml")}
    await kit.reconciler.reconcile(REPO, 1)
    assert len(kit.state.catalog) == 0 and POLICY_PATH in kit.state.meta.config_errors
    after = "e" * 40
    kit.repo.files[after] = {**kit.repo.files[before], "configs/nvidia-master.yaml": sc.NVIDIA}
    kit.repo.head = after
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    assert len(kit.state.catalog) > 0  # families are planned now
    document = kit.state.state_document(kit.clock.now())
    assert document["config_errors"] == [], document["config_errors"]
    checks = config_checks(kit.state.meta.config_errors, kit.state.policy.runners_file, len(kit.state.catalog))
    assert all(check.ok for check in checks), checks
    # ... and a light reconcile (head known) does not clear it either.
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert POLICY_PATH not in kit.state.meta.config_errors


async def test_a_push_deleting_the_last_master_config_says_the_globs_match_no_file(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    assert POLICY_PATH not in kit.state.meta.config_errors
    before, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {k: v for k, v in kit.repo.files[before].items() if not k.endswith("-master.yaml")}
    kit.repo.head = after
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    assert len(kit.state.catalog) == 0
    # Said as a fresh install with no config says it (README: not a silent empty wave).
    assert POLICY_PATH in kit.state.meta.config_errors
