"""The hunk rule on real patches, PR -> family touches, and the overlap index."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.core import events
from bot.core.catalog import Catalog, parse_runners, read_master
from bot.core.domain import (
    Family,
    FileChange,
    Overlap,
    PullRequest,
    candidate_id,
)
from bot.core.overlap import (
    MAX_CHANGED_KEYS,
    OverlapIndex,
    _FamilyFiles,
    family_indents,
    file_change_from_contents,
    file_change_from_patch,
    is_idle,
    is_klaud_own,
    pull_record,
    pull_touches,
    top_level_key,
    touched_keys,
)
from bot.sandbox.gitdiff import unified_diff
from bot.store.codec import ADAPTERS
from tests.builders import family

NOW = datetime(2026, 8, 21, 12, 0, tzinfo=UTC)
NV = "configs/nvidia-master.yaml"
AMD = "configs/amd-master.yaml"
BOTS = ("klaud-cold[bot]", "Klaud-Cold")


# --- helpers --------------------------------------------------------------------


def candidate_branch(candidate: str) -> str:
    """The branch the agent opens a candidate's pull request from."""
    return f"klaud/auto-{candidate}"


def load_patch(fixtures: Path, commit: str) -> dict[str, dict[str, Any]]:
    data = json.loads((fixtures / "inferencex" / "patches" / f"{commit}.json").read_text())
    return {file["filename"]: file for file in data["files"]}


def base_catalog(fixtures: Path, files: dict[str, dict[str, Any]]) -> Catalog:
    """The live families the PR was opened against: its master configs' base contents."""
    runners = parse_runners((fixtures / "inferencex" / "configs" / "runners.yaml").read_text())
    families: list[Family] = []
    for name, file in files.items():
        if name in (NV, AMD):
            families.extend(read_master(name, file["base_content"], runners).families)
    return Catalog(families)


def hunks(patch: str) -> list[str]:
    """The patch cut into its hunks, each a patch of its own."""
    pieces: list[str] = []
    for line in patch.splitlines(keepends=True):
        if line.startswith("@@"):
            pieces.append("")
        pieces[-1] += line
    return pieces


def pull(
    number: int,
    changes: tuple[FileChange, ...] = (),
    *,
    updated_at: datetime = NOW - timedelta(hours=1),
    klaud_own: bool = False,
    own_family_hash: str | None = None,
    files_complete: bool = True,
    head_ref: str = "topic",
    author: str = "bob",
) -> PullRequest:
    return PullRequest(
        number=number,
        title=f"PR {number}",
        author=author,
        head_ref=head_ref,
        head_sha=f"{number:040x}",
        base_ref="main",
        draft=False,
        labels=(),
        created_at=updated_at,
        updated_at=updated_at,
        klaud_own=klaud_own,
        own_family_hash=own_family_hash,
        changes=changes,
        files_complete=files_complete,
        files_sha=f"{number:040x}",
    )


def changes_of(files: dict[str, dict[str, Any]]) -> tuple[FileChange, ...]:
    """FileChanges as a handler builds them: master configs parsed, other files plain."""
    return tuple(
        file_change_from_patch(name, file["patch"], file.get("previous_filename"), file["status"])
        if name in (NV, AMD)
        else FileChange(name, file.get("previous_filename"))
        for name, file in files.items()
    )


# --- the hunk rule on real patches ------------------------------------------------

# Worked out by hand from each patch (see the notes per commit).
EXPECTED_KEYS: dict[tuple[str, str], dict[str, str]] = {
    # Flag change in one family; an added family (comment lines first) in a second hunk.
    ("056876ec1", NV): {
        "kimik3-fp4-gb200-dynamo-vllm-agentic-mooncake-dcp16-agg": "flags",
        "kimik3-fp4-gb200-dynamo-vllm-agentic-dspark-mooncake-tp8pp2": "image",
    },
    # Two conc-list edits; the first hunk's trailing context shows the next key untouched.
    ("16f273c8e", NV): {
        "qwen3.5-fp4-b300-sglang-agentic-mtp": "flags",
        "qwen3.5-fp4-b200-sglang-agentic-mtp": "flags",
    },
    ("843c6254f", NV): {"dsv4-fp4-b200-vllm-agentic-mtp": "flags"},
    # Two families added between others; the neighbours are context only.
    ("bd171877c", NV): {
        "glm5.2-fp4-gb300-dynamo-trt-agentic-agg-mtp": "image",
        "glm5.2-fp4-gb300-dynamo-trt-agentic-disagg-mtp": "image",
    },
    # Image bumps on the first line after a key whose hunk header names the block above.
    ("d4363bd7f", NV): {"dsr1-fp4-b200-sglang": "image", "dsr1-fp4-b200-sglang-mtp": "image"},
    ("d658eac9a", AMD): {"qwen3.5-fp4-mi355x-sglang-agentic-mtp": "image"},
    # Families deleted whole (their image lines go too); comment-only hunks touch nothing.
    ("de493d859", AMD): {
        "dsv4-fp4-mi355x-vllm-agentic": "image",
        "dsv4-fp4-mi355x-sglang-agentic-hicache": "image",
        "dsv4-fp4-mi355x-sglang-disagg-agentic-hicache": "image",
    },
    ("de493d859", NV): {
        "dsv4-fp4-b200-vllm-agentic": "image",
        "dsv4-fp4-b300-vllm-agentic": "image",
        "dsv4-fp4-b200-sglang-agentic-hicache": "image",
        "dsv4-fp4-b300-sglang-agentic-hicache": "image",
        "glm5.2-fp4-b300-sglang-agentic": "image",
    },
    ("edcc6032f", AMD): {
        "qwen3.5-fp8-mi355x-sglang-agentic": "image",
        "qwen3.5-fp8-mi355x-sglang-agentic-hicache": "image",
        "minimaxm3-fp8-mi300x-vllm-agentic": "image",
        "minimaxm3-fp8-mi325x-vllm-agentic": "image",
        "minimaxm3-fp4-mi355x-vllm-agentic": "image",
    },
    ("edcc6032f", NV): {
        "qwen3.5-fp8-b200-sglang-agentic": "image",
        "kimik3-fp4-b300-vllm-agentic": "image",
        "dsv4-fp8-h200-vllm-agentic": "image",
        "qwen3.5-fp8-b300-sglang-agentic-hicache": "image",
        "dsv4-fp4-gb300-dynamo-vllm-agentic": "image",
        "qwen3.5-fp8-h100-sglang-agentic": "image",
        "minimaxm3-fp8-h100-vllm-agentic": "image",
        "minimaxm3-fp8-h200-vllm-agentic": "image",
        "dsv4-fp4-gb200-dynamo-vllm-agentic-3p2d-tep8-tp8": "image",
        "dsv4-fp4-gb200-dynamo-vllm-agentic-2p1d-dep8-dep8": "image",
    },
    # A `model:` line changed in four families: settings, not the image.
    ("f4eaa3981", NV): {
        "qwen3.5-fp4-b200-sglang": "flags",
        "qwen3.5-fp4-b200-sglang-mtp": "flags",
        "qwen3.5-fp4-b300-sglang": "flags",
        "qwen3.5-fp4-b300-sglang-mtp": "flags",
    },
    # Image bump and a flag edit in the same family: image wins.
    ("fbb480e5f", NV): {"dsv4-fp4-b200-sglang-agentic-hicache-mtp": "image"},
}


@pytest.mark.parametrize(("commit", "path"), sorted(EXPECTED_KEYS))
def test_real_patch_touches_exactly(fixtures: Path, commit: str, path: str) -> None:
    patch = load_patch(fixtures, commit)[path]["patch"]
    assert touched_keys(patch) == EXPECTED_KEYS[(commit, path)]


@pytest.mark.parametrize(("commit", "path"), sorted(EXPECTED_KEYS))
def test_local_diff_fallback_gives_the_same_touches(fixtures: Path, commit: str, path: str) -> None:
    file = load_patch(fixtures, commit)[path]
    change = file_change_from_contents(path, file["base_content"], file["content"])
    assert change == FileChange(path, keys=EXPECTED_KEYS[(commit, path)])  # type: ignore[arg-type]


def test_change_on_first_line_after_a_key_is_not_the_header_family(fixtures: Path) -> None:
    patch = load_patch(fixtures, "d4363bd7f")[NV]["patch"]
    first = hunks(patch)[0]
    assert first.startswith("@@ -860,7 +860,7 @@ dsr1-fp8-b300-dynamo-trt:\n")
    assert touched_keys(first) == {"dsr1-fp4-b200-sglang": "image"}


def test_hunk_spanning_two_families(fixtures: Path) -> None:
    # The last hunk deletes two neighbouring families at once.
    patch = load_patch(fixtures, "edcc6032f")[NV]["patch"]
    last = hunks(patch)[-1]
    assert touched_keys(last) == {
        "dsv4-fp4-gb200-dynamo-vllm-agentic-3p2d-tep8-tp8": "image",
        "dsv4-fp4-gb200-dynamo-vllm-agentic-2p1d-dep8-dep8": "image",
    }
    # Here the edit is in one family and the next key is trailing context only.
    first = hunks(load_patch(fixtures, "16f273c8e")[NV]["patch"])[0]
    assert "\n qwen3.5-fp8-h200-sglang-agentic-mtp:\n" in first
    assert touched_keys(first) == {"qwen3.5-fp4-b300-sglang-agentic-mtp": "flags"}


def test_added_family_does_not_touch_its_neighbour(fixtures: Path) -> None:
    added = hunks(load_patch(fixtures, "056876ec1")[NV]["patch"])[1]
    assert added.startswith(
        "@@ -8181,6 +8181,123 @@ kimik3-fp4-gb200-dynamo-vllm-agentic-mooncake-dcp16-agg:"
    )
    assert touched_keys(added) == {
        "kimik3-fp4-gb200-dynamo-vllm-agentic-dspark-mooncake-tp8pp2": "image"
    }


def test_comment_only_hunk_touches_nothing(fixtures: Path) -> None:
    patch = load_patch(fixtures, "de493d859")[NV]["patch"]
    comments = hunks(patch)[-1]
    assert comments.startswith("@@ -7665,12 +7548,12 @@ glm5.2-fp4-b300-sglang-agentic:")
    assert touched_keys(comments) == {}


def test_blank_and_comment_lines_touch_nothing() -> None:
    patch = (
        "@@ -1,5 +1,7 @@ alpha:\n"
        "   image: a:1\n"
        "   runner: b200\n"
        "+  # explain the runner\n"
        "+\n"
        "-\n"
        "+    \n"
        " beta:\n"
        "   image: b:1\n"
    )
    assert touched_keys(patch) == {}


def test_blank_padded_keys_read_as_their_names_and_long_padded_lines_parse_at_once() -> None:
    # Any PR author controls these lines. With a lazy `[^:]*?\s*:` key pattern, four such
    # 40,000-blank lines stalled the event loop for 12 s; matched greedily they cost ms.
    pad = " " * 200_000
    patch = (
        "@@ -1,3 +1,6 @@\n"
        " alpha   :\n"
        "-  image   : a:1\n"
        "+  image   : a:2\n"
        f"+  x{pad}\n"
        f"+y{pad}\n"
        f'+"gamma" {pad}: 1\n'
    )
    assert touched_keys(patch) == {"alpha": "image", "gamma": "flags"}  # `y…` opens no key
    assert top_level_key(f"key{pad}: v") == "key" and top_level_key(f"key{pad}") is None


def test_old_and_new_sides_keep_their_own_key() -> None:
    # `beta` is renamed to `gamma`; the next changed lines belong to beta (old) and gamma (new).
    patch = (
        "@@ -4,6 +4,6 @@ alpha:\n"
        "   precision: fp4\n"
        " \n"
        "-beta:\n"
        "-  runner: b200\n"
        "+gamma:\n"
        "+  runner: b300\n"
        "   image: b:1\n"
    )
    assert touched_keys(patch) == {"beta": "flags", "gamma": "flags"}


def test_removed_family_and_added_line_of_the_block_above() -> None:
    old = "alpha:\n  image: a:1\n  model: m\nbeta:\n  image: b:1\n  model: m\ngamma:\n  image: c:1\n"
    new = "alpha:\n  image: a:1\n  model: m\n  runner: b300\ngamma:\n  image: c:1\n"
    patch = unified_diff(old, new)
    # beta's removal comes before the added line, which still belongs to alpha on the new side.
    assert "-beta:\n-  image: b:1\n-  model: m\n+  runner: b300\n" in patch
    assert touched_keys(patch) == {"beta": "image", "alpha": "flags"}


def test_new_side_key_carries_over_to_the_next_hunk() -> None:
    body = "".join(f"  k{i}: {i}\n" for i in range(12))
    old = "alpha:\n" + body
    # `beta:` splits alpha's block; a line added far below now belongs to beta.
    new = "alpha:\n" + body.replace("  k1: 1\n", "  k1: 1\nbeta:\n") + "  k12: 12\n"
    patch = unified_diff(old, new)
    assert [line for line in patch.splitlines() if line.startswith("@@")] == [
        "@@ -1,6 +1,7 @@",
        "@@ -11,3 +12,4 @@ alpha:",
    ]
    assert touched_keys(patch) == {"beta": "flags"}


def test_image_is_only_the_first_level_image_line() -> None:
    patch = (
        "@@ -1,8 +1,8 @@\n"
        " alpha:\n"
        "   runner: b200\n"
        "   scenarios:\n"
        "-    image: nested:1\n"
        "+    image: nested:2\n"
        " beta:\n"
        "-  image: top:1\n"
        "+  image: top:2\n"
    )
    assert touched_keys(patch) == {"alpha": "flags", "beta": "image"}


def test_first_level_indent_is_learned_from_the_patch() -> None:
    patch = (
        "@@ -1,4 +1,4 @@\n"
        " alpha:\n"
        "     runner: b200\n"
        "-    image: a:1\n"
        "+    image: a:2\n"
    )
    assert touched_keys(patch) == {"alpha": "image"}


FOUR_SPACES = (
    "fam-a:\n    model: x\n    runner: h100\n    precision: fp8\n    framework: vllm\n"
    "    image: repo/img:a\n    tp: 8\n    extra:\n        image: side/car:1\n"
)


@pytest.mark.parametrize(("old", "new", "kind"), [("repo/img:a", "repo/img:b", "image"),
                                                    ("side/car:1", "side/car:2", "flags")])
def test_a_hunk_inside_a_four_space_block_knows_its_indentation_from_the_catalog(old: str, new: str, kind: str) -> None:
    # git starts this hunk below the key line (the header names the key), so the patch
    # alone never shows how deep the block indents its keys.
    head = FOUR_SPACES.replace(old, new)
    patch = unified_diff(FOUR_SPACES, head)
    assert patch.startswith("@@ -") and " @@ fam-a:" in patch.splitlines()[0] and "\n fam-a:" not in patch
    families = read_master(NV, FOUR_SPACES, None).families
    assert [f.child_indent for f in families] == [4]
    change = file_change_from_patch(NV, patch, known_keys=family_indents(families))
    assert change.keys == {"fam-a": kind} == file_change_from_contents(NV, FOUR_SPACES, head).keys


def test_a_block_repeating_its_image_key_changes_its_image_by_the_later_line() -> None:
    # YAML keeps the later of a repeated key: that line is the image that runs. Compared by
    # contents, a change of it was read as the first line's block settings (`flags`).
    base = "fam-a:\n  image: repo/img:a\n  model: m\n  runner: h100\n  image: repo/img:b\n"
    head = base.replace("repo/img:b", "repo/img:c")
    assert read_master(NV, base, None).families[0].image == "repo/img:b"
    patch = unified_diff(base, head)
    assert file_change_from_contents(NV, base, head).keys == {"fam-a": "image"}
    assert file_change_from_patch(NV, patch).keys == {"fam-a": "image"}


def test_hunk_at_the_top_without_a_key_and_no_newline_marker() -> None:
    patch = (
        "@@ -1,3 +1,3 @@\n"
        "-# header comment\n"
        "+# new header comment\n"
        " alpha:\n"
        "-  image: a:1\n"
        "\\ No newline at end of file\n"
        "+  image: a:2\n"
        "\\ No newline at end of file\n"
    )
    assert touched_keys(patch) == {"alpha": "image"}


def test_lines_before_the_first_hunk_are_ignored() -> None:
    patch = (
        "--- a/configs/x-master.yaml\n+++ b/configs/x-master.yaml\n"
        "@@ -1,2 +1,2 @@ alpha:\n-  x: 1\n+  x: 2\n"
    )
    assert touched_keys(patch) == {"alpha": "flags"}


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("dsr1-fp4-b200-sglang:", "dsr1-fp4-b200-sglang"),
        ("key: value # note", "key"),
        ('"quoted": 1', "quoted"),
        ("  indented:", None),
        ("# comment:", None),
        ("- item:", None),
        ("no colon", None),
        ("url: http://x", "url"),
        ("", None),
    ],
)
def test_top_level_key(line: str, key: str | None) -> None:
    assert top_level_key(line) == key


def test_file_change_from_patch_variants() -> None:
    assert file_change_from_patch(NV, None) == FileChange(NV, unavailable=True)
    assert file_change_from_patch(NV, "") == FileChange(NV)
    renamed = file_change_from_patch("configs/new-master.yaml", "", NV, "renamed")
    assert renamed.previous_filename == NV
    # A copy leaves its source untouched, so the source is not kept.
    assert file_change_from_patch("configs/new-master.yaml", "", NV, "copied").previous_filename is None


def test_a_diff_of_more_keys_than_the_cap_is_kept_as_unavailable() -> None:
    # Found by a hostile-input review: without a patch every differing key was kept, and a
    # master config appended with two million keys kept them all in the PR's record.
    base = "alpha:\n  image: a:1\n  runner: h100\n"
    at_cap = base + "".join(f"k{i}: 1\n" for i in range(MAX_CHANGED_KEYS))
    kept = file_change_from_contents(NV, base, at_cap)
    assert len(kept.keys) == MAX_CHANGED_KEYS and not kept.unavailable
    over = file_change_from_contents(NV, base, at_cap + "one-more: 1\n", AMD, "renamed")
    assert over == FileChange(NV, AMD, unavailable=True, oversized=True)
    patch = "@@ -1,0 +1,0 @@\n" + "".join(f"+k{i}: 1\n" for i in range(MAX_CHANGED_KEYS + 1))
    assert file_change_from_patch(NV, patch) == FileChange(NV, unavailable=True, oversized=True)
    assert len(file_change_from_patch(NV, patch.rsplit("+", 1)[0]).keys) == MAX_CHANGED_KEYS
    catalog = Catalog([make_family("alpha"), make_family("beta")])
    assert pull_touches(pull(7, (over,)), catalog) == {
        f"{NV}:alpha": "patch-unavailable", f"{NV}:beta": "patch-unavailable"
    }


# A family key of 80+ characters (MAX_FAMILY_KEY admits 200): git cuts a hunk header's
# context to 80 bytes, so the header names the key without its `:`.
LONG_KEY = "dsr1-fp8-h200-trt-" + "x" * 70
LONG_BASE = f"""first-family:
  image: a:1
  runner: cluster:h200-nb
  model-prefix: dsr1
{LONG_KEY}:
  image: nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc4
  model: deepseek-r1
  model-prefix: dsr1
  runner: cluster:h200-nb
  precision: fp8
  framework: trt
  tp: 8
  ep: 1
  conc: 4
  other: 1
"""
LONG_HEAD = LONG_BASE.replace("  tp: 8\n", "  tp: 4\n")
# `git diff --no-index` of the two (git 2.39), hunk header as git prints it.
LONG_GIT_PATCH = (
    "@@ -9,7 +9,7 @@ " + LONG_KEY[:80] + "\n"
    "   runner: cluster:h200-nb\n   precision: fp8\n   framework: trt\n-  tp: 8\n+  tp: 4\n"
    "   ep: 1\n   conc: 4\n   other: 1\n"
)


def test_a_hunk_header_cut_inside_a_long_key_names_the_one_family_key_it_begins() -> None:
    assert unified_diff(LONG_BASE, LONG_HEAD) == LONG_GIT_PATCH  # the sandbox's diff agrees
    assert touched_keys(LONG_GIT_PATCH, {"first-family": 2, LONG_KEY: 2}) == {LONG_KEY: "flags"}


def test_a_settings_change_of_a_family_with_a_long_key_blocks_it() -> None:
    catalog = Catalog(read_master(NV, LONG_BASE, None).families)
    assert LONG_KEY in {f.key for f in catalog}  # a live family
    change = file_change_from_patch(NV, LONG_GIT_PATCH, known_keys=family_indents(catalog.families_of(NV)))
    assert pull_touches(pull(7, (change,)), catalog) == {f"{NV}:{LONG_KEY}": "flags"}


@pytest.mark.parametrize(
    "known", [{}, {"first-family": 2}, {LONG_KEY: 2, LONG_KEY[:80] + "-other": 2}], ids=["none", "no match", "two match"]
)
def test_a_cut_key_no_single_family_key_completes_leaves_the_patch_to_the_contents(known: dict[str, int]) -> None:
    # Never a PR that touches a family and silently overlaps nothing: the patch is
    # `unavailable`, as when GitHub omits it, and the contents say which block changed.
    assert touched_keys(LONG_GIT_PATCH, known) is None
    assert file_change_from_patch(NV, LONG_GIT_PATCH, known_keys=known) == FileChange(NV, unavailable=True)
    assert file_change_from_contents(NV, LONG_BASE, LONG_HEAD).keys == {LONG_KEY: "flags"}


# --- PR -> families ---------------------------------------------------------------


def test_pull_touches_live_families_only(fixtures: Path) -> None:
    files = load_patch(fixtures, "056876ec1")
    catalog = base_catalog(fixtures, files)
    # The added family is not live yet; recipes, launch script and changelog are shared files.
    assert pull_touches(pull(1, changes_of(files)), catalog) == {
        f"{NV}:kimik3-fp4-gb200-dynamo-vllm-agentic-mooncake-dcp16-agg": "flags"
    }
    added_only = load_patch(fixtures, "bd171877c")
    assert pull_touches(pull(2, changes_of(added_only)), base_catalog(fixtures, added_only)) == {}


def test_pull_touches_deleted_families(fixtures: Path) -> None:
    files = load_patch(fixtures, "de493d859")
    catalog = base_catalog(fixtures, files)
    expected = {
        f"{path}:{key}": kind
        for path in (NV, AMD)
        for key, kind in EXPECTED_KEYS[("de493d859", path)].items()
    }
    touches = pull_touches(pull(3, changes_of(files)), catalog)
    assert touches == expected
    assert all(family_id in catalog for family_id in touches)


def test_renamed_file_maps_keys_through_the_previous_name(fixtures: Path) -> None:
    file = load_patch(fixtures, "d658eac9a")[AMD]
    catalog = base_catalog(fixtures, {AMD: file})
    renamed = file_change_from_patch("configs/amd-mi355x-master.yaml", file["patch"], AMD, "renamed")
    assert pull_touches(pull(4, (renamed,)), catalog) == {
        f"{AMD}:qwen3.5-fp4-mi355x-sglang-agentic-mtp": "image"
    }
    copied = file_change_from_patch("configs/amd-mi355x-master.yaml", file["patch"], AMD, "copied")
    assert pull_touches(pull(5, (copied,)), catalog) == {}


def test_shared_files_never_touch() -> None:
    catalog = Catalog([make_family("alpha")])
    shared = tuple(
        FileChange(name)
        for name in (
            ".github/workflows/e2e.yml", "utils/lib.py", "perf-changelog.yaml", "docs/README.md"
        )
    )
    assert pull_touches(pull(6, shared), catalog) == {}


def test_unavailable_patch_touches_every_family_of_that_file() -> None:
    catalog = Catalog([make_family("alpha"), make_family("beta"), make_family("gamma", path=AMD)])
    touches = pull_touches(pull(7, (FileChange(NV, unavailable=True),)), catalog)
    assert touches == {f"{NV}:alpha": "patch-unavailable", f"{NV}:beta": "patch-unavailable"}


def test_family_files_touch_settings_of_matching_families(fixtures: Path) -> None:
    files = load_patch(fixtures, "843c6254f")
    catalog = base_catalog(fixtures, files)
    script = "benchmarks/single_node/agentic/dsv4_fp4_b200_vllm_mtp.sh"
    assert script in files
    patterns = ("benchmarks/**/{model-prefix}_{precision}_{hardware}_{framework}_mtp.sh",)
    touches = pull_touches(pull(8, (FileChange(script),)), catalog, patterns)
    expected = {
        f.id
        for f in catalog
        if (f.model_prefix, f.precision, f.framework) == ("dsv4", "fp4", "vllm")
        and f.runner.removeprefix("cluster:").startswith("b200")
    }
    assert expected and f"{NV}:dsv4-fp4-b200-vllm-agentic-mtp" in expected
    assert touches == dict.fromkeys(expected, "flags")


def test_image_wins_over_flags_and_flags_over_unavailable() -> None:
    catalog = Catalog([make_family("alpha"), make_family("beta")])
    changes = (
        FileChange(NV, keys={"alpha": "flags"}),
        FileChange("recipes/alpha.yaml"),
        FileChange("configs/nvidia-master.yaml", keys={"alpha": "image", "beta": "flags"}),
    )
    touches = pull_touches(pull(9, changes), catalog, ("recipes/{key}.yaml",))
    assert touches == {f"{NV}:alpha": "image", f"{NV}:beta": "flags"}
    mixed = (FileChange("recipes/beta.yaml"), FileChange(NV, unavailable=True))
    assert pull_touches(pull(10, mixed), catalog, ("recipes/{key}.yaml",)) == {
        f"{NV}:alpha": "patch-unavailable",
        f"{NV}:beta": "flags",
    }


def test_incomplete_file_list_assumes_every_family() -> None:
    catalog = Catalog([make_family("alpha"), make_family("beta", path=AMD)])
    incomplete = pull(11, (FileChange(NV, keys={"alpha": "image"}),), files_complete=False)
    touches = pull_touches(incomplete, catalog)
    assert touches == {f"{NV}:alpha": "image", f"{AMD}:beta": "patch-unavailable"}


# --- Klaud's own PRs ----------------------------------------------------------------


def test_is_klaud_own() -> None:
    fam = make_family("alpha")
    branch = candidate_branch(fam.candidate)
    assert is_klaud_own(branch, "someone", True, BOTS) == (True, fam.family_hash)
    legacy = "klaude/" + branch.split("/", 1)[1]
    assert is_klaud_own(legacy, "someone", True, BOTS) == (True, fam.family_hash)
    # Same branch name from a fork: not ours.
    assert is_klaud_own(branch, "someone", False, BOTS) == (False, None)
    assert is_klaud_own("bump-x", "KLAUD-COLD", True, BOTS) == (True, None)
    assert is_klaud_own("bump-x", "klaud-cold[bot]", False, BOTS) == (True, None)
    assert is_klaud_own("klaud/auto-123", "bob", True, BOTS) == (False, None)
    # DESIGN §4 names a prefix: whatever follows the family hash, the branch is Klaud's.
    assert is_klaud_own(branch + "-2", None, True, BOTS) == (True, fam.family_hash)
    assert is_klaud_own(f"klaud/auto-{fam.family_hash}-retry", None, True, BOTS) == (True, fam.family_hash)
    assert is_klaud_own(f"klaud/auto-{fam.family_hash}", None, True, BOTS) == (False, None)
    assert is_klaud_own(f"klaud/auto-{fam.family_hash[:15]}x-retry", None, True, BOTS) == (False, None)


def test_idle_rule() -> None:
    fresh = pull(1, updated_at=NOW - timedelta(days=6, hours=23))
    stale = pull(2, updated_at=NOW - timedelta(days=7))
    own = pull(3, updated_at=NOW - timedelta(days=30), klaud_own=True)
    assert not is_idle(fresh, NOW, 7)
    assert is_idle(stale, NOW, 7)
    assert not is_idle(own, NOW, 7)


# --- the index ------------------------------------------------------------------------


def make_family(key: str, image: str = "img:1", path: str = NV) -> Family:
    return family(key, image, path)


ALPHA, BETA, GAMMA = make_family("alpha"), make_family("beta"), make_family("gamma")


def index_with(*prs: PullRequest, catalog: Catalog | None = None) -> OverlapIndex:
    index = OverlapIndex(catalog or Catalog([ALPHA, BETA, GAMMA]))
    for pr in prs:
        index.upsert(pr)
    return index


def test_overlaps_with_reasons_sorted_by_number() -> None:
    index = index_with(
        pull(4012, (FileChange(NV, keys={"alpha": "image"}),)),
        pull(7, (FileChange(NV, keys={"alpha": "flags", "beta": "flags"}),)),
        pull(9, (FileChange(NV, unavailable=True),)),
    )
    assert index.overlaps(ALPHA, NOW, 7) == [
        Overlap(7, "flags", "PR #7 changes this family's settings"),
        Overlap(
            9,
            "patch-unavailable",
            f"PR #9: patch unavailable for {NV}; assuming it touches this family",
        ),
        Overlap(4012, "image", "PR #4012 changes this family's image line"),
    ]
    assert [o.pr for o in index.overlaps(BETA, NOW, 7)] == [7, 9]
    assert [o.pr for o in index.overlaps(GAMMA, NOW, 7)] == [9]
    assert index.touches(7) == {f"{NV}:alpha": "flags", f"{NV}:beta": "flags"}
    assert index.touches(12345) == {}


def test_incomplete_file_list_reason() -> None:
    # GitHub stops listing at 3,000 files: some are known, the rest may touch any family.
    index = index_with(pull(5, (FileChange("docs/a.md"),), files_complete=False))
    assert index.overlaps(ALPHA, NOW, 7) == [
        Overlap(5, "patch-unavailable", "PR #5: file list incomplete; assuming it touches this family")
    ]


def test_unavailable_file_list_reason() -> None:
    # GitHub refused to list any file (a diff it gives up generating).
    index = index_with(pull(5, (), files_complete=False))
    assert index.overlaps(ALPHA, NOW, 7) == [
        Overlap(5, "patch-unavailable", "PR #5: file list unavailable; assuming it touches this family")
    ]


def test_idle_pr_stays_indexed_but_overlaps_nothing_until_active_again() -> None:
    change = (FileChange(NV, keys={"alpha": "image"}),)
    index = index_with(pull(1, change, updated_at=NOW - timedelta(days=8)))
    assert index.overlaps(ALPHA, NOW, 7) == []
    assert index.overlaps(ALPHA, NOW, 10) != []
    assert index.get(1) is not None and index.touches(1) == {f"{NV}:alpha": "image"}
    index.upsert(pull(1, change, updated_at=NOW))
    assert [o.pr for o in index.overlaps(ALPHA, NOW, 7)] == [1]


def test_klaud_pr_always_overlaps_its_family() -> None:
    own = pull(
        50,
        (),
        updated_at=NOW - timedelta(days=90),
        klaud_own=True,
        own_family_hash=ALPHA.family_hash,
        head_ref=candidate_branch(ALPHA.candidate),
        author="Klaud-Cold",
    )
    index = index_with(own)
    assert index.overlaps(ALPHA, NOW, 7) == [
        Overlap(50, "image", "Klaud PR #50 is already working on this family")
    ]
    assert index.overlaps(BETA, NOW, 7) == []
    assert index.klaud_prs() == {ALPHA.id: 50}
    # Its own family is reported once even when its diff also touches it.
    index.upsert(replace(own, changes=(FileChange(NV, keys={"alpha": "image", "beta": "flags"}),)))
    assert [o.reason for o in index.overlaps(ALPHA, NOW, 7)] == [
        "Klaud PR #50 is already working on this family"
    ]
    # Never idle: what else it touches still counts after 90 days.
    assert index.overlaps(BETA, NOW, 7) == [
        Overlap(50, "flags", "PR #50 changes this family's settings")
    ]


def test_klaud_pr_for_a_new_image_of_the_same_family_still_overlaps() -> None:
    # The family hash in the branch names the family whatever image the PR moves to.
    branch = candidate_branch(candidate_id(ALPHA.id, "img:999"))
    own, family_hash = is_klaud_own(branch, "klaud-cold[bot]", True, BOTS)
    index = index_with(pull(51, klaud_own=own, own_family_hash=family_hash, head_ref=branch))
    assert [o.pr for o in index.overlaps(ALPHA, NOW, 7)] == [51]


def test_upsert_replaces_and_remove_forgets() -> None:
    index = index_with(pull(1, (FileChange(NV, keys={"alpha": "image"}),)))
    index.upsert(pull(1, (FileChange(NV, keys={"beta": "flags"}),)))
    assert index.overlaps(ALPHA, NOW, 7) == []
    assert [o.pr for o in index.overlaps(BETA, NOW, 7)] == [1]
    assert len(index) == 1

    own = pull(
        2,
        (FileChange(NV, keys={"beta": "image"}),),
        klaud_own=True,
        own_family_hash=GAMMA.family_hash,
    )
    index.upsert(own)
    assert [p.number for p in index.prs()] == [1, 2]
    removed = index.remove(2)
    assert removed is not None and removed.number == 2
    assert index.remove(2) is None
    assert index.get(2) is None and 2 not in index
    assert [o.pr for o in index.overlaps(BETA, NOW, 7)] == [1]
    assert index.overlaps(GAMMA, NOW, 7) == []
    assert index.klaud_prs() == {}
    index.remove(1)
    assert index.overlaps(BETA, NOW, 7) == [] and len(index) == 0


def test_retouch_after_catalog_and_policy_change() -> None:
    index = index_with(
        pull(1, (FileChange(NV, keys={"delta": "image"}),)),
        pull(2, (FileChange("recipes/alpha.yaml"),)),
    )
    delta = make_family("delta")
    assert index.overlaps(delta, NOW, 7) == []  # not live when the PR arrived
    assert index.overlaps(ALPHA, NOW, 7) == []

    index.retouch(Catalog([ALPHA, BETA, GAMMA, delta]), ("recipes/{key}.yaml",))
    assert [o.pr for o in index.overlaps(delta, NOW, 7)] == [1]
    assert index.overlaps(ALPHA, NOW, 7) == [
        Overlap(2, "flags", "PR #2 changes this family's settings")
    ]

    index.retouch(Catalog([ALPHA, BETA, GAMMA]), ())
    assert index.overlaps(delta, NOW, 7) == []
    assert index.overlaps(ALPHA, NOW, 7) == []
    assert index.touches(1) == {} and index.touches(2) == {}


def test_many_prs_keep_answers_per_family() -> None:
    families = [make_family(f"fam{i}") for i in range(50)]
    index = OverlapIndex(Catalog(families))
    for number in range(1, 1001):
        key = f"fam{number % 50}"
        index.upsert(pull(number, (FileChange(NV, keys={key: "flags"}),)))
    assert [o.pr for o in index.overlaps(families[7], NOW, 7)] == list(range(7, 1001, 50))
    for number in range(7, 1001, 50):
        index.remove(number)
    assert index.overlaps(families[7], NOW, 7) == []
    assert len(index) == 1000 - 20


# --- the hunk rule: which line is the family's own `image:` line (DESIGN §4 "Overlap index")


def test_image_line_in_a_hunk_without_its_key_line_uses_the_usual_indentation() -> None:
    # The header's context names the block; no key line in the hunk shows how deep its
    # children are, so YAML's usual two spaces decide that this is the family's own image.
    patch = "@@ -12,3 +12,3 @@ alpha:\n   runner: b200\n-  image: a:1\n+  image: a:2\n"
    assert touched_keys(patch) == {"alpha": "image"}


def test_only_the_first_line_after_a_key_shows_its_childrens_indentation() -> None:
    # A hunk that starts deep inside a block must not learn its indentation from there.
    patch = "@@ -12,4 +12,4 @@ alpha:\n       - conc: 4\n-  image: a:1\n+  image: a:2\n"
    assert touched_keys(patch) == {"alpha": "image"}


def test_blank_and_comment_lines_after_a_key_do_not_set_its_childrens_indentation() -> None:
    for between in (" ", " # bump below", "   # indented comment"):
        # the first real child line (four spaces) shows the depth, not the blank or comment
        patch = f"@@ -1,5 +1,5 @@\n alpha:\n{between}\n     runner: b200\n-    image: a:1\n+    image: a:2\n"
        assert touched_keys(patch) == {"alpha": "image"}, between


# --- the contents fallback gives what the patch rule gives ------------------------------


def test_contents_fallback_finds_the_image_line_of_a_two_line_block() -> None:
    change = file_change_from_contents(NV, "alpha:\n  image: a:1\n", "alpha:\n  image: a:2\n")
    assert change.keys == {"alpha": "image"}


def test_contents_fallback_finds_an_image_line_that_is_not_the_first_child() -> None:
    base = "alpha:\n  runner: b200\n  image: a:1\n  tp: 8\n"
    assert file_change_from_contents(NV, base, base.replace("a:1", "a:2")).keys == {"alpha": "image"}
    assert file_change_from_contents(NV, base, base.replace("tp: 8", "tp: 4")).keys == {"alpha": "flags"}


def test_an_edit_of_only_trailing_blanks_is_a_touch_for_both_rules() -> None:
    # Git conflicts on the line all the same when Klaud's pull request bumps the image.
    base, head = "alpha:\n  image: a:1  \n  tp: 8\n", "alpha:\n  image: a:1\n  tp: 8\n"
    assert file_change_from_contents(NV, base, head).keys == {"alpha": "image"}
    patch = "@@ -1,3 +1,3 @@\n alpha:\n-  image: a:1  \n+  image: a:1\n   tp: 8\n"
    assert touched_keys(patch) == {"alpha": "image"}


def test_contents_fallback_handles_a_one_line_block() -> None:
    assert file_change_from_contents(NV, "alpha: 1\nbeta:\n  image: b\n", "alpha: 2\nbeta:\n  image: b\n").keys == {
        "alpha": "flags"
    }


def test_contents_fallback_keeps_the_previous_name_of_a_rename_only() -> None:
    # As file_change_from_patch does: a renamed master config still touches the families
    # of its old path; a copy leaves its source untouched.
    base, head = "alpha:\n  image: a:1\n", "alpha:\n  image: a:2\n"
    renamed = file_change_from_contents("configs/new-master.yaml", base, head, NV, "renamed")
    assert renamed.previous_filename == NV
    assert pull_touches(pull(1, (renamed,)), Catalog([ALPHA])) == {ALPHA.id: "image"}
    copied = file_change_from_contents("configs/new-master.yaml", base, head, NV, "copied")
    assert copied.previous_filename is None
    assert pull_touches(pull(2, (copied,)), Catalog([ALPHA])) == {}


def test_flags_win_over_patch_unavailable_whatever_the_file_order() -> None:
    # The existing test adds the family_files match first; the rank must decide, not the order.
    catalog = Catalog([make_family("alpha"), make_family("beta")])
    mixed = (FileChange(NV, unavailable=True), FileChange("recipes/beta.yaml"))
    assert pull_touches(pull(10, mixed), catalog, ("recipes/{key}.yaml",)) == {
        f"{NV}:alpha": "patch-unavailable",
        f"{NV}:beta": "flags",
    }


# --- Klaud's own PRs as the index records them ----------------------------------------


def pull_event(head_ref: str, login: str | None, head_repo: str | None) -> events.PullRequest:
    return events.PullRequest.model_validate(
        {
            "number": 77,
            "title": "x",
            "user": {"login": login},
            "head": {"ref": head_ref, "sha": "a" * 40, "repo": None if head_repo is None else {"full_name": head_repo}},
            "base": {"ref": "main", "sha": "b" * 40, "repo": {"full_name": "acme/bench"}},
            "created_at": "2026-08-20T12:00:00Z",
            "updated_at": "2026-08-20T12:00:00Z",
        }
    )


def record(head_ref: str, login: str | None, head_repo: str | None):
    return pull_record("acme/bench", pull_event(head_ref, login, head_repo), BOTS, changes=(), files_complete=True, files_sha=None)


def test_pull_record_klaud_branch_counts_only_in_the_same_repository() -> None:
    # DESIGN §4: Klaud's own when its head branch matches klaud/auto-<fam16>- *in the same
    # repository* (names are case-insensitive) or its author is a bot login.
    branch = candidate_branch(ALPHA.candidate)
    same = record(branch, "bob", "ACME/Bench")
    assert (same.klaud_own, same.own_family_hash) == (True, ALPHA.family_hash)
    fork = record(branch, "bob", "mallory/bench")
    assert (fork.klaud_own, fork.own_family_hash) == (False, None)
    deleted_fork = record(branch, "bob", None)
    assert (deleted_fork.klaud_own, deleted_fork.own_family_hash) == (False, None)


def test_pull_record_knows_the_same_repository_by_its_id_under_any_name() -> None:
    # An event sent before a rename names both sides by the old name; a repository that took
    # a freed name is another one all the same.
    def sides(head: dict[str, object], base: dict[str, object]):
        payload = pull_event(candidate_branch(ALPHA.candidate), "bob", None).model_dump(mode="json")
        payload["head"]["repo"], payload["base"]["repo"] = head, base
        pull = events.PullRequest.model_validate(payload)
        return pull_record("acme/bench", pull, BOTS, changes=(), files_complete=True, files_sha=None)

    renamed = sides({"full_name": "acme/old-bench", "id": 1}, {"full_name": "acme/old-bench", "id": 1})
    assert (renamed.klaud_own, renamed.own_family_hash) == (True, ALPHA.family_hash)
    reused_name = sides({"full_name": "acme/bench", "id": 2}, {"full_name": "acme/bench", "id": 1})
    assert (reused_name.klaud_own, reused_name.own_family_hash) == (False, None)


def test_pull_record_by_a_bot_login_is_klaud_own_and_keeps_its_author() -> None:
    bot = record("bump-x", "Klaud-Cold", "acme/bench")
    assert bot.klaud_own and bot.own_family_hash is None and bot.author == "Klaud-Cold"
    human = record("bump-x", "bob", "acme/bench")
    assert not human.klaud_own and human.author == "bob"
    assert record("bump-x", None, "acme/bench").author == ""


def test_closing_one_of_two_klaud_prs_of_a_family_keeps_the_other() -> None:
    def own(number: int):
        return pull(number, klaud_own=True, own_family_hash=ALPHA.family_hash, head_ref=candidate_branch(ALPHA.candidate))

    index = index_with(own(60), own(61))
    assert index.klaud_pr(ALPHA) == 60 and index.klaud_prs() == {ALPHA.id: 60}
    index.remove(60)
    assert index.klaud_pr(ALPHA) == 61 and index.klaud_prs() == {ALPHA.id: 61}
    assert [o.pr for o in index.overlaps(ALPHA, NOW, 7)] == [61]
    index.remove(61)
    assert index.klaud_pr(ALPHA) is None and index.klaud_prs() == {}


def test_overlaps_until_is_when_the_first_active_human_pr_goes_idle() -> None:
    touching = (FileChange(NV, keys={"alpha": "flags"}),)
    index = index_with(
        pull(1, touching, updated_at=NOW - timedelta(days=3)),
        pull(2, touching, updated_at=NOW - timedelta(days=1)),
        pull(3, touching, updated_at=NOW - timedelta(days=9)),  # idle already
    )
    assert index.overlaps_until(ALPHA, NOW, 7) == NOW + timedelta(days=4)
    assert index.overlaps_until(BETA, NOW, 7) is None


def test_families_of_a_pull_request() -> None:
    branch = candidate_branch(ALPHA.candidate)
    index = index_with(
        pull(1, (FileChange(NV, keys={"beta": "flags"}),)),
        pull(2, (FileChange(NV, keys={"beta": "image"}),), klaud_own=True, own_family_hash=ALPHA.family_hash, head_ref=branch),
    )
    assert index.families_of(1) == ({BETA.id}, None)
    assert index.families_of(2) == ({BETA.id}, ALPHA.family_hash)
    assert index.families_of(99) == (set(), None)


def test_blocking_lists_every_family_some_open_pr_blocks_now_and_only_those() -> None:
    # The planner's snapshot input (DESIGN §4 "Overlap index"): an active human PR blocks
    # what it touches, an idle one blocks nothing, a Klaud PR always blocks its family.
    gamma_branch = candidate_branch(make_family("gamma").candidate)
    index = index_with(
        pull(1, (FileChange(NV, keys={"alpha": "flags"}),)),
        pull(2, (FileChange(NV, keys={"beta": "image"}),), updated_at=NOW - timedelta(days=30)),
        pull(3, updated_at=NOW - timedelta(days=30), klaud_own=True,
             own_family_hash=make_family("gamma").family_hash, head_ref=gamma_branch),
    )
    blocking = index.blocking(NOW, 7)
    assert {family_id: [o.pr for o in found] for family_id, found in blocking.items()} == {
        ALPHA.id: [1],
        make_family("gamma").id: [3],
    }


def test_a_key_renamed_with_its_block_unchanged_is_flags_on_both_names_without_a_patch() -> None:
    # What this catches: contents compared without a patch called a rename `image` on both
    # keys, where the patch (only the key line changes) says `flags`; an added family keeps
    # `image`, as its patch adds its image line.
    base = "alpha:\n  image: a:1\n  tp: 8\nbeta:\n  image: b:1\n"
    renamed = base.replace("alpha:", "alpha-next:")
    assert file_change_from_contents(NV, base, renamed).keys == {"alpha": "flags", "alpha-next": "flags"}
    added = base + "gamma:\n  image: a:1\n  tp: 8\n"
    assert file_change_from_contents(NV, base, added).keys == {"gamma": "image"}
    moved_and_bumped = renamed.replace("a:1", "a:2")
    assert file_change_from_contents(NV, base, moved_and_bumped).keys == {"alpha": "image", "alpha-next": "image"}


def test_a_family_files_glob_invalid_for_a_familys_values_matches_nothing_for_it() -> None:
    # A policy read before placeholders inside [...] were refused: `[a-{precision}]` is
    # `[a-z]`-like for one family and a reversed range (`[a-8]`) for another. That family's
    # glob matches nothing; every pull request's event raised instead.
    catalog = Catalog([family("alpha", precision="z"), family("beta", precision="8")])
    touches = pull_touches(pull(9, (FileChange("benchmarks/c.sh"),)), catalog, ("benchmarks/[a-{precision}].sh",))
    assert touches == {"configs/x-master.yaml:alpha": "flags"}


def test_a_long_path_is_looked_up_only_at_the_lengths_of_the_family_files_prefixes(fixtures: Path) -> None:
    # What this catches: a path was sliced at every length to find the globs filed under its
    # prefixes, time in the square of its length for each of a PR's up to 3,000 paths.
    catalog = base_catalog(fixtures, load_patch(fixtures, "843c6254f"))
    lookups = _FamilyFiles(catalog, ("benchmarks/**/{model-prefix}_{precision}_{hardware}_{framework}.sh",
                                     "docs/{model-prefix}.md"))
    asked: list[str] = []

    class Counted(dict):  # type: ignore[type-arg]
        def get(self, key, default=None):  # type: ignore[no-untyped-def]
            asked.append(key)
            return super().get(key, default)

    lookups._by_prefix = Counted(lookups._by_prefix)
    path = "benchmarks/" + "x/" * 2000 + "dsv4_fp4_b200_vllm.sh"
    lookups.families_for(path)
    assert 0 < len(asked) <= len({len(prefix) for prefix in lookups._by_prefix})


def _block(key: str, image: str, pad: int) -> str:
    return (f"{key}:\n    image: {image}\n    model: x\n    runner: h100\n    precision: fp8\n"
            f"    framework: vllm\n" + "".join(f"    k{i}: v\n" for i in range(pad)))


FOUR = _block("fam-a", "a:1", 10) + _block("fam-b", "b:1", 0).replace("    image: b:1\n", "") + "    image: b:1\n    tp: 8\n"


def test_a_family_stored_before_child_indent_does_not_override_what_the_patch_shows() -> None:
    # A family record written before this version has no child_indent (it reads as 2):
    # the patch's first hunk shows this file indents by 4, as the reader learned before.
    fresh = read_master(NV, FOUR, None).families
    assert [f.child_indent for f in fresh] == [4, 4]
    stored = []
    for fam in fresh:
        raw = ADAPTERS["family"].dump_python(fam, mode="json")
        raw.pop("child_indent")
        stored.append(ADAPTERS["family"].validate_python(raw))
    patch = ("@@ -1,3 +1,3 @@\n fam-a:\n-    image: a:1\n+    image: a:2\n     model: x\n"
             "@@ -20,3 +20,3 @@ fam-b:\n     framework: vllm\n-    image: b:1\n+    image: b:2\n     tp: 8\n")
    change = file_change_from_patch(NV, patch, known_keys=family_indents(stored))
    assert change.keys == {"fam-a": "image", "fam-b": "image"}


def test_a_block_repeating_its_image_key_is_touched_alike_with_or_without_a_patch() -> None:
    # An edit of the earlier (overridden) image line: its patch says `image`, and so must the
    # comparison of contents used when GitHub leaves the patch out.
    base = "fam-a:\n  image: repo/img:a\n  model: m\n  runner: h100\n  image: repo/img:b\n"
    head = base.replace("repo/img:a", "repo/img:z")
    by_patch = file_change_from_patch(NV, unified_diff(base, head)).keys
    assert by_patch == {"fam-a": "image"}
    assert file_change_from_contents(NV, base, head).keys == by_patch
