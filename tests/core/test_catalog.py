"""Families from master configs, clusters from runners.yaml, and the per-repo catalog."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from bot.core import catalog
from bot.core.catalog import (
    Catalog,
    CatalogError,
    Runners,
    family_file_patterns,
    glob_match,
    glob_pattern,
    hardware_of,
    is_master_config,
    parse_runners,
    read_master,
)
from bot.core.domain import FAMILY_RE, Family
from tests.builders import family

RUNNERS = """\
labels:
  h100:
    - h100-cw_00
    - h100-cw_01
    - h100-dgxc-slurm_16
    - h100-dgxc-slurm_7
  b200:
    - b200-nb_0
    - b200-dgxc_00
    - b200-nb_1
    - b200-cw_00
  empty:
hardware:
  cluster:h100-cw:
    gpus-per-node: 8
  cluster:h100-dgxc:
    gpus-per-node: 8
  cluster:b200-dgxc: {}
  cluster:b200-nb: {}
  b200-cw: {}
"""

MASTER = """\
# Leading comment about the file.
alpha-fp4-b200-sglang:
  image: lmsysorg/sglang:v0.5.12
  model: org/alpha
  model-prefix: alpha
  runner: b200
  precision: fp4
  framework: sglang
  scenarios:
    fixed-seq-len:
    - isl: 1024
      osl: 1024
    # a comment inside the block

# Introduces beta.
beta-fp8-h100-vllm:
  image: vllm/vllm-openai:v0.25.0
  model-prefix: beta
  runner: cluster:h100-dgxc
  precision: fp8
  framework: vllm

gamma-no-image:
  runner: b200
  model-prefix: gamma

delta-unknown-label:
  image: x:1
  runner: z900
last-block:
  image: nvcr.io#nvidia/last:1
  runner: h100
"""

T1 = datetime(2026, 8, 1, tzinfo=UTC)
T2 = datetime(2026, 8, 21, tzinfo=UTC)


def runners() -> Runners:
    return parse_runners(RUNNERS)


# --- runners.yaml (the rule itself: tests/core/test_clusters.py) ----------------


def test_runner_names_resolve_to_declared_clusters_sorted_distinct() -> None:
    table = runners()
    # `b200-cw` under `hardware:` has no `cluster:` prefix: it declares nothing.
    assert table.declared == {"h100-cw", "h100-dgxc", "b200-dgxc", "b200-nb"}
    assert dict(table) == {
        "h100": ("h100-cw", "h100-dgxc"),
        "b200": ("b200-dgxc", "b200-nb"),
        "empty": (),
    }
    assert table.problems == ("runner b200-cw_00 (label b200) resolves to no declared cluster",)


@pytest.mark.parametrize(
    "text",
    [
        "- a\n- b\n",
        "hardware: {}\n",
        "labels: [a, b]\n",
        "labels:\n  h100: h100-cw_00\n",
        "labels: {h: [1]}\n",
        "labels: {h: [h_0]}\n",
        "labels: {h: [h_0]}\nhardware: {h: {}}\n",
        "labels: {h: [h_0]}\nclusters: [h]\n",
    ],
)
def test_runners_with_invalid_structure_are_rejected(text: str) -> None:
    with pytest.raises(CatalogError, match="runners.yaml"):
        parse_runners(text)


def test_runners_that_are_not_yaml_name_the_line() -> None:
    with pytest.raises(CatalogError, match=r"^runners.yaml: not valid YAML at line 3$"):
        parse_runners("labels:\n  h100:\n\t- h100-cw_00\n")
    with pytest.raises(CatalogError, match=r"^runners.yaml: not valid YAML"):
        parse_runners("clusters:\n  h100: " + "1" * 5000 + "\n")  # PyYAML's int() raised ValueError


def test_a_block_that_cannot_be_read_is_a_problem_and_the_next_block_still_counts() -> None:
    text = (
        "a-fp8-h100-vllm:\n  image: x\n  runner: h100\n  model-prefix: " + "1" * 5000 + "\n"
        "b-fp8-h100-vllm:\n  image: y\n  runner: h100\n"
    )
    parsed = read_master("configs/x-master.yaml", text, runners())
    assert [f.key for f in parsed.families] == ["b-fp8-h100-vllm"]
    assert parsed.problems == ("configs/x-master.yaml:1: `a-fp8-h100-vllm` cannot be read",)


def test_clusters_for_cluster_runner_and_labels() -> None:
    table = runners()
    assert table.targets("cluster:h100-dgxc").clusters == ("h100-dgxc",)
    assert table.targets("h100").clusters == ("h100-cw", "h100-dgxc")
    assert table.targets("b200-nb").clusters == ("b200-nb",)  # a declared id that is not a label
    assert table.targets("unknown").clusters == ()


def test_hardware_is_the_gpu_family_of_the_runner() -> None:
    assert hardware_of("cluster:mi355x-amds") == "mi355x"
    assert hardware_of("gb300-nv") == "gb300"
    assert hardware_of("b200") == "b200"


# --- master configs -------------------------------------------------------------


def test_master_families_values_and_spans() -> None:
    parsed = read_master("configs/x-master.yaml", MASTER, runners())
    by_key = {f.key: f for f in parsed.families}
    assert list(by_key) == [
        "alpha-fp4-b200-sglang",
        "beta-fp8-h100-vllm",
        "delta-unknown-label",
        "last-block",
    ]

    alpha = by_key["alpha-fp4-b200-sglang"]
    assert alpha.id == "configs/x-master.yaml:alpha-fp4-b200-sglang"
    assert (alpha.image, alpha.runner) == ("lmsysorg/sglang:v0.5.12", "b200")
    assert alpha.clusters == ("b200-dgxc", "b200-nb")
    assert alpha.unresolved == ("b200-cw_00",)
    assert (alpha.model_prefix, alpha.precision, alpha.framework) == ("alpha", "fp4", "sglang")
    # Trailing comment and blank lines, and the comment introducing beta, belong to neither.
    assert (alpha.line_start, alpha.line_end) == (2, 12)

    beta = by_key["beta-fp8-h100-vllm"]
    assert (beta.clusters, beta.unresolved) == (("h100-dgxc",), ())
    assert (beta.line_start, beta.line_end) == (16, 21)
    assert beta.image_changed_at is None

    delta = by_key["delta-unknown-label"]
    assert delta.clusters == ()
    assert (delta.line_start, delta.line_end) == (27, 29)

    last = by_key["last-block"]
    assert (last.line_start, last.line_end) == (30, 32)
    assert last.normalized_image == "nvcr.io/nvidia/last:1"

    assert parsed.problems == (
        "configs/x-master.yaml:23: `gamma-no-image` has no image",
        (
            "configs/x-master.yaml:27: `delta-unknown-label` runner `z900` is not cluster:<id>, "
            "a declared cluster or a label in runners.yaml"
        ),
    )


def test_blocks_that_cannot_be_families_are_reported_not_fatal() -> None:
    text = (
        "scalar-block: 3\n"
        "no-runner:\n  image: a:1\n"
        "runner-list:\n  image: a:1\n  runner: [b200]\n"
        "'quoted key':\n  image: a:1\n  runner: b200\n"
        "good:\n  image: a:1\n  runner: b200\n"
    )
    parsed = read_master("configs/x-master.yaml", text, runners())
    assert [f.key for f in parsed.families] == ["good"]
    assert parsed.problems == (
        "configs/x-master.yaml:1: `scalar-block` is not a mapping",
        "configs/x-master.yaml:2: `no-runner` has no runner",
        "configs/x-master.yaml:4: `runner-list` has no runner",
        ("configs/x-master.yaml:7: top-level key 'quoted key' cannot name a family "
        "(printable, without spaces or ':', at most 200 characters)"),
    )


def test_a_key_with_a_nul_or_past_200_characters_cannot_name_a_family() -> None:
    # What this catches: keys SQLite stored and PostgreSQL refused (U+0000; a 4 KB key past
    # its index rows), failing the whole catalog's write on one engine only.
    text = (
        '"dsr1\\0-fp8":\n  image: a:1\n  runner: b200\n'
        + "k" * 201 + ":\n  image: a:1\n  runner: b200\n"
        + "k" * 200 + ":\n  image: a:1\n  runner: b200\n"
    )
    parsed = read_master("configs/x-master.yaml", text, runners())
    assert [f.key for f in parsed.families] == ["k" * 200]
    assert [p.split(": ")[0] for p in parsed.problems] == ["configs/x-master.yaml:1", "configs/x-master.yaml:4"]
    assert all("cannot name a family" in p and len(p) < 200 for p in parsed.problems)


def test_duplicate_key_keeps_the_later_block_like_yaml() -> None:
    text = "a:\n  image: one:1\n  runner: b200\na:\n  image: two:2\n  runner: b200\n"
    parsed = read_master("configs/x-master.yaml", text, runners())
    assert [(f.key, f.image, f.line_start) for f in parsed.families] == [("a", "two:2", 4)]
    assert parsed.problems == (
        "configs/x-master.yaml:4: `a` repeats the key of line 1; the later block wins, as in YAML",
    )


def test_anchors_and_merge_keys_resolve() -> None:
    text = (
        "base: &base\n  image: shared:1\n  runner: h100\n  precision: fp8\n"
        "child:\n  <<: *base\n  framework: vllm\n"
    )
    parsed = read_master("configs/x-master.yaml", text, runners())
    child = next(f for f in parsed.families if f.key == "child")
    assert (child.image, child.runner) == ("shared:1", "h100")
    assert (child.precision, child.framework) == ("fp8", "vllm")


def test_a_node_many_blocks_alias_is_built_once_per_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by a hostile-input review: each block had its own loader, which built the anchored
    # node again, so one 2,000-item list aliased by 2,000 blocks (85 KB) took seconds.
    table = runners()
    built: list[int] = []
    construct_sequence = yaml.constructor.SafeConstructor.construct_sequence

    def counted(self: yaml.constructor.SafeConstructor, node: yaml.SequenceNode, deep: bool = False) -> list[object]:
        built.append(len(node.value))
        return construct_sequence(self, node, deep)

    monkeypatch.setattr(yaml.constructor.SafeConstructor, "construct_sequence", counted)
    anchor = "base:\n  image: a\n  runner: h100\n  big: &A [" + ",".join(["1"] * 300) + "]\n"
    blocks = "".join(f"k{i}:\n  image: a\n  runner: h100\n  x: *A\n" for i in range(200))
    parsed = read_master("configs/x-master.yaml", anchor + blocks, table)
    assert len(parsed.families) == 201 and parsed.problems == ()
    assert built == [300]


def test_an_anchor_that_cannot_be_built_fails_each_block_that_aliases_it() -> None:
    # One loader serves the whole file: a block that failed leaves nothing behind for the next.
    text = (
        "a:\n  image: x\n  runner: h100\n  n: &N " + "1" * 5000 + "\n"
        "b:\n  image: y\n  runner: h100\n  n: *N\n"
        "c:\n  image: z\n  runner: h100\n"
    )
    parsed = read_master("configs/x-master.yaml", text, runners())
    assert [f.key for f in parsed.families] == ["c"]
    assert parsed.problems == (
        "configs/x-master.yaml:1: `a` cannot be read",
        "configs/x-master.yaml:5: `b` cannot be read",
    )


def test_merge_keys_that_copy_a_large_mapping_into_every_block_are_a_file_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A merge key copies its mapping into each block that merges it: blocks x mapping size,
    # whatever the loader keeps. The nodes a file's blocks build are bounded by its length.
    monkeypatch.setattr(catalog, "NODE_BUDGET_FLOOR", 1000)
    mapping = "base: &A\n  image: a\n  runner: h100\n" + "".join(f"  k{i}: 1\n" for i in range(300))
    few = "".join(f"m{i}:\n  <<: *A\n  image: b\n" for i in range(3))
    assert len(read_master("configs/x-master.yaml", mapping + few, runners()).families) == 4
    many = "".join(f"m{i}:\n  <<: *A\n  image: b\n" for i in range(300))
    text = mapping + many
    with pytest.raises(CatalogError, match=r"^configs/x-master.yaml:\d+: its blocks build over \d+ YAML nodes"):
        read_master("configs/x-master.yaml", text, runners())
    assert catalog.NODE_BUDGET_FLOOR + catalog.NODE_BUDGET_PER_CHARACTER * len(text) < 300 * 300 * 2


def test_unparseable_master_names_file_and_line() -> None:
    with pytest.raises(CatalogError, match=r"^configs/x-master.yaml: not valid YAML at line 3$"):
        read_master("configs/x-master.yaml", "a:\n  image: x\n  - item\nb: 1\n", runners())


def test_non_mapping_master_is_rejected_and_empty_master_has_no_families() -> None:
    with pytest.raises(CatalogError, match="mapping of families"):
        read_master("configs/x-master.yaml", "- a\n- b\n", runners())
    assert read_master("configs/x-master.yaml", "# nothing yet\n", runners()).families == ()


def test_real_master_configs(fixtures: Path) -> None:
    configs = fixtures / "inferencex" / "configs"
    table = parse_runners((configs / "runners.yaml").read_text())
    families: list[Family] = []
    for name in ("nvidia-master.yaml", "amd-master.yaml"):
        text = (configs / name).read_text()
        parsed = read_master(f"configs/{name}", text, table)
        raw = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        assert [f.key for f in parsed.families] == list(raw), "one family per top-level key, in order"
        lines = text.split("\n")
        for fam in parsed.families:
            assert fam.image == raw[fam.key]["image"]
            assert fam.runner == raw[fam.key]["runner"]
            assert FAMILY_RE.match(fam.id)
            assert lines[fam.line_start - 1] == f"{fam.key}:"
            last = lines[fam.line_end - 1].strip()
            assert last and not last.startswith("#")
        families.extend(parsed.families)
        # The only problems in the real data are runners naming undeclared clusters.
        assert all("which runners.yaml does not declare" in p for p in parsed.problems)
    assert len(families) == 208
    assert len({f.id for f in families}) == 208

    by_id = {f.id: f for f in families}
    dsr1 = by_id["configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"]
    assert dsr1.image == "lmsysorg/sglang:v0.5.16-cu130"
    assert dsr1.candidate == "d92e15065c55779d-555679de269db36f"  # domain §3.3 worked example
    assert dsr1.clusters == ("b200-dgxc",)
    assert dsr1.unresolved == ("b200-cw_00", "b200-cw_01", "b200-nb_0", "b200-nb_1")
    first = by_id["configs/nvidia-master.yaml:dsr1-fp4-b200-dynamo-trt"]
    assert (first.line_start, first.runner, first.model_prefix, first.precision, first.framework) == (
        1, "b200-multinode", "dsr1", "fp4", "dynamo-trt",
    )
    amd = by_id["configs/amd-master.yaml:qwen3.5-fp4-mi355x-sglang-agentic-mtp"]
    assert amd.clusters == ("mi355x-amds",)
    assert amd.image == "lmsysorg/sglang-rocm:v0.5.17-rocm720-mi35x-20260818"
    h200 = by_id["configs/nvidia-master.yaml:dsv4-fp8-h200-sglang"]
    assert (h200.runner, h200.clusters) == ("h200-dgxc", ("h200-dgxc",))  # a declared id, not a label


# --- image changes and the catalog ----------------------------------------------


def test_catalog_lookups_and_sorted_iteration() -> None:
    other = "configs/y-master.yaml"
    catalog = Catalog([family("b", line_start=10), family("a", line_start=20), family("c", path=other)])
    assert [f.id for f in catalog] == [
        "configs/x-master.yaml:a",
        "configs/x-master.yaml:b",
        "configs/y-master.yaml:c",
    ]
    assert len(catalog) == 3
    assert "configs/x-master.yaml:a" in catalog
    assert catalog.get("configs/x-master.yaml:zzz") is None
    assert catalog.find(other, "c") == family("c", path=other)
    assert catalog.find(other, "a") is None
    assert [f.key for f in catalog.families_of("configs/x-master.yaml")] == ["b", "a"]
    assert catalog.paths() == ["configs/x-master.yaml", other]


def test_replace_file_keeps_image_time_unless_image_changed() -> None:
    catalog = Catalog()
    assert catalog.replace_file(
        "configs/x-master.yaml",
        [family("a", "x:1", image_changed_at=T1), family("b", "y:1")],
    ) == {"configs/x-master.yaml:a", "configs/x-master.yaml:b"}
    # Backfill without a push time keeps what the caller found (blame or unknown).
    assert catalog.get("configs/x-master.yaml:a").image_changed_at == T1  # type: ignore[union-attr]
    assert catalog.get("configs/x-master.yaml:b").image_changed_at is None  # type: ignore[union-attr]

    changed = catalog.replace_file(
        "configs/x-master.yaml",
        [family("a", "x:1", line_start=7), family("b", "y:2"), family("n", "z:1")],
        changed_at=T2,
    )
    assert changed == {"configs/x-master.yaml:b", "configs/x-master.yaml:n"}
    a = catalog.get("configs/x-master.yaml:a")
    assert a is not None and a.image_changed_at == T1 and a.line_start == 7
    assert catalog.get("configs/x-master.yaml:b").image_changed_at == T2  # type: ignore[union-attr]
    assert catalog.get("configs/x-master.yaml:n").image_changed_at == T2  # type: ignore[union-attr]


def test_a_key_renamed_with_its_image_line_untouched_keeps_its_image_age() -> None:
    # Dated by the push, it went to the back of the staleness order, and a rebuild from
    # blame (which dates the untouched line) disagreed with the state built from events.
    catalog = Catalog([family("a", "x:1", image_changed_at=T1), family("b", "y:1", image_changed_at=T1)])
    changed = catalog.replace_file(
        "configs/x-master.yaml", [family("a-v2", "x:1"), family("b", "y:1"), family("c", "y:1")], changed_at=T2
    )
    assert changed == {"configs/x-master.yaml:a-v2", "configs/x-master.yaml:c"}
    assert catalog.get("configs/x-master.yaml:a-v2").image_changed_at == T1  # type: ignore[union-attr]
    assert catalog.get("configs/x-master.yaml:c").image_changed_at == T2  # type: ignore[union-attr]  # a new key


def test_replace_file_drops_families_no_longer_in_the_file() -> None:
    catalog = Catalog([family("a"), family("b"), family("c", path="configs/y-master.yaml")])
    catalog.replace_file("configs/x-master.yaml", [family("b")])
    assert [f.id for f in catalog] == ["configs/x-master.yaml:b", "configs/y-master.yaml:c"]
    assert catalog.find("configs/x-master.yaml", "a") is None


def test_replace_file_rejects_families_of_another_file() -> None:
    with pytest.raises(ValueError, match="does not belong"):
        Catalog().replace_file("configs/x-master.yaml", [family("a", path="configs/y-master.yaml")])


def test_remove_file() -> None:
    catalog = Catalog([family("a"), family("c", path="configs/y-master.yaml")])
    assert [f.key for f in catalog.remove_file("configs/x-master.yaml")] == ["a"]
    assert [f.id for f in catalog] == ["configs/y-master.yaml:c"]
    assert catalog.families_of("configs/x-master.yaml") == []
    assert catalog.remove_file("configs/x-master.yaml") == []


# --- globs ----------------------------------------------------------------------


def test_family_file_patterns_fill_placeholders() -> None:
    fam = family(
        "dsv4-fp4-b200-vllm", runner="cluster:b200-dgxc", model_prefix="dsv4", framework="vllm"
    )
    patterns = [
        "benchmarks/**/{model-prefix}_{precision}_{hardware}_{framework}*.sh",
        "recipes/{key}/*.yaml",
        "static/file.txt",
    ]
    assert family_file_patterns(fam, patterns) == [
        "benchmarks/**/dsv4_fp4_b200_vllm*.sh",
        "recipes/dsv4-fp4-b200-vllm/*.yaml",
        "static/file.txt",
    ]


def test_family_file_patterns_skip_missing_values_and_escape_globs() -> None:
    fam = family("odd[key]", precision=None)
    assert family_file_patterns(fam, ["a/{precision}.sh", "b/{key}.sh"]) == ["b/odd[[]key].sh"]
    assert glob_match("b/odd[key].sh", "b/odd[[]key].sh")
    assert not glob_match("b/oddk.sh", "b/odd[[]key].sh")


@pytest.mark.parametrize(
    ("path", "pattern", "expected"),
    [
        ("configs/nvidia-master.yaml", "configs/*-master.yaml", True),
        ("configs/deprecated/nvidia-x-master.yaml", "configs/*-master.yaml", False),
        ("configs/x-master.yaml.bak", "configs/*-master.yaml", False),
        ("benchmarks/a/b/dsv4_fp4.sh", "benchmarks/**/dsv4_*.sh", True),
        ("benchmarks/dsv4_fp4.sh", "benchmarks/**/dsv4_*.sh", True),
        ("benchmarks/a/dsv4_fp4.sh", "benchmarks/*.sh", False),
        ("docs/anything/at/all.md", "docs/**", True),
        ("a/b", "a?b", False),
        ("axb", "a?b", True),
        ("a1b", "a[0-9]b", True),
        ("axb", "a[!0-9]b", True),
        ("a/b", "a[!0-9]b", False),
    ],
)
def test_glob_match(path: str, pattern: str, expected: bool) -> None:
    assert glob_match(path, pattern) is expected


def _reference_match(path: str, glob: str) -> bool:
    """`*` any run without `/`, `?` one character but `/`, anything else itself: by search."""
    if not glob:
        return not path
    if glob[0] == "*":
        return any(_reference_match(path[cut:], glob[1:]) for cut in range(len(path) + 1) if "/" not in path[:cut])
    if not path or (glob[0] == "?" and path[0] == "/") or (glob[0] != "?" and glob[0] != path[0]):
        return False
    return _reference_match(path[1:], glob[1:])


def test_globs_of_many_stars_match_as_a_search_of_every_split_does() -> None:
    # A `*` between two parts takes the first occurrence of the part after it (see
    # glob_pattern): the same answers as trying every way to split the path.
    rng = random.Random(36)
    for _ in range(3000):
        glob = re.sub(r"\*+", "*", "".join(rng.choice("**ab?/") for _ in range(rng.randint(1, 7))))
        for _ in range(10):
            path = "".join(rng.choice("aab/") for _ in range(rng.randint(0, 8)))
            assert glob_match(path, glob) is _reference_match(path, glob), (path, glob)


def test_a_glob_of_many_stars_against_a_long_name_answers_without_trying_every_split() -> None:
    # Found by a hostile-input review: each `*` was `[^/]*`, and a glob of 12 stars tried
    # every split of a 48-character name among them before failing (about two minutes).
    glob = "configs/" + "*a" * 12 + "*b"
    assert not glob_match("configs/" + "a" * 48, glob)
    assert glob_match("configs/" + "a" * 48 + "b", glob)
    assert not glob_match("configs/" + "a" * 24 + "/" + "a" * 24 + "b", glob)
    assert glob_match("configs/x" + "[a]" * 30 + "b", "configs/" + "*[[]a]" * 12 + "*b")


def test_a_glob_with_a_reversed_character_range_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"^glob 'configs/\[z-a\]\.yaml': its character class \[z-a\] is not valid"):
        glob_pattern("configs/[z-a].yaml")
    with pytest.raises(ValueError, match=r"character class \[!z-a\]"):
        glob_match("configs/x.yaml", "configs/[!z-a].yaml")
    assert glob_match("configs/b.yaml", "configs/[a-z].yaml")


def test_is_master_config_uses_policy_globs() -> None:
    globs = ("configs/*-master.yaml",)
    assert is_master_config("configs/amd-master.yaml", globs)
    assert not is_master_config("configs/deprecated/amd-kimik2.5-agentic-master.yaml", globs)
    assert not is_master_config("configs/runners.yaml", globs)
    assert is_master_config("other/a.yaml", ("configs/*-master.yaml", "other/*.yaml"))


def test_family_dataclass_replace_keeps_identity() -> None:
    fam = family("a", "x:1")
    assert replace(fam, line_start=3).candidate == fam.candidate
