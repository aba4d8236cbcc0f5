"""Runner labels to declared clusters (DESIGN §4 "Clusters"), on the real runners.yaml and on
the newer `clusters:` layout, and where an unresolvable runner shows (config errors, reasons)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.core.capacity import target_eligibility
from bot.core.catalog import CatalogError, Runners, parse_runners, read_master
from bot.core.domain import CapacityReading, Family
from bot.services.catalog_sync import CatalogSync
from bot.services.repo_state import RepoMeta, RepoState
from tests.services.fakes import FakeRepo

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
RUNNERS_PATH = "configs/runners.yaml"

# The cluster ids the real runners.yaml declares: the `cluster:<id>` keys of `hardware:`.
REAL_DECLARED = {
    "b200-dgxc", "b200-nscale", "b300-nv", "gb200-nv", "gb300-nv", "h100-cw", "h100-dgxc",
    "h200-cw", "h200-dgxc", "h200-nb", "mi300x-amds", "mi300x-tw", "mi325x-amds", "mi355x-amds",
    "rtx6000pro-lat",
}
B200_UNRESOLVED = ("b200-cw_00", "b200-cw_01", "b200-nb_0", "b200-nb_1")

NEWER = """\
clusters:
  h100:
    gpus-per-node: 8
  h100-dgxc:
    gpus-per-node: 8
  b200-nscale: {}
  mi355x-amds: {}
labels:
  h100:
    - h100_3
    - h100-dgxc-slurm_07
  b200:
    - b200-nscale-slurm_00
    - b200-cw_00
  b200-lost:
    - b200-cw_00
    - b200-cw_01
  mi355x-amds:
    - mi355x-amds_00
  empty:
hardware:
  cluster:only-in-hardware: {}
"""


def real_runners(fixtures: Path) -> Runners:
    return parse_runners((fixtures / "inferencex" / "configs" / "runners.yaml").read_text())


def real_families(fixtures: Path, runners: Runners) -> tuple[list[Family], list[str]]:
    families: list[Family] = []
    problems: list[str] = []
    for name in ("nvidia-master.yaml", "amd-master.yaml"):
        text = (fixtures / "inferencex" / "configs" / name).read_text()
        parsed = read_master(f"configs/{name}", text, runners)
        families.extend(parsed.families)
        problems.extend(parsed.problems)
    return families, problems


# --- the older layout: the real runners.yaml --------------------------------------


def test_real_runners_declare_the_cluster_keys_of_hardware(fixtures: Path) -> None:
    runners = real_runners(fixtures)
    # `hardware: b200-nscale:` (no prefix) declares nothing; `cluster:b200-nscale` does.
    assert runners.declared == REAL_DECLARED


@pytest.mark.parametrize(
    ("name", "cluster"),
    [
        ("h100-dgxc-slurm_07", "h100-dgxc"),  # longest declared id followed by `-`
        ("h100-dgxc-slurm_16", "h100-dgxc"),
        ("b200-nscale-slurm_00", "b200-nscale"),
        ("b200-nscale-slurm_0", "b200-nscale"),
        ("b200-dgxc-slurm_7", "b200-dgxc"),
        ("h200-dgxc-slurm_13", "h200-dgxc"),
        ("b200-dgxc_00", "b200-dgxc"),  # the name without `_<digits>` is a declared id
        ("h200-nb_1", "h200-nb"),
        ("mi355x-amds_19", "mi355x-amds"),
        ("rtx6000pro-lat_00", "rtx6000pro-lat"),
        ("b200-cw_00", None),
        ("b200-nb_0", None),
    ],
)
def test_real_runner_names_resolve_to_declared_clusters(fixtures: Path, name: str, cluster: str | None) -> None:
    assert real_runners(fixtures).cluster_of(name) == cluster


def test_every_real_family_resolves_to_declared_ids_or_is_listed_as_an_error(fixtures: Path) -> None:
    runners = real_runners(fixtures)
    families, problems = real_families(fixtures, runners)
    assert len(families) == 208

    # runners.yaml: four runners of label b200 name no declared cluster.
    assert runners.problems == tuple(
        f"runner {name} (label b200) resolves to no declared cluster" for name in B200_UNRESOLVED
    )
    # The master configs: two families run on `cluster:mi325x-tw`, which is not declared.
    assert problems == [
        f"configs/amd-master.yaml:{line}: `{key}` runner `cluster:mi325x-tw` names "
        "cluster mi325x-tw, which runners.yaml does not declare"
        for line, key in ((1624, "dsv4-fp8-mi325x-vllm"), (1646, "dsv4-fp8-mi325x-vllm-mtp"))
    ]

    clean = [f for f in families if f.clusters and set(f.clusters) <= REAL_DECLARED and not f.unresolved]
    undeclared = [f for f in families if not set(f.clusters) <= REAL_DECLARED]
    partly = [f for f in families if f.unresolved and f not in undeclared]
    assert (len(clean), len(partly), len(undeclared)) == (192, 14, 2)
    # Every family is one of the three: no family targets nothing, none is left unexplained.
    assert all(f.clusters for f in families)
    for family in partly:
        # Label b200 keeps the cluster its resolved runners are on, and lists the others.
        assert (family.runner, family.clusters, family.unresolved) == ("b200", ("b200-dgxc",), B200_UNRESOLVED)
        assert all(f"runner {name} (label {family.runner})" in "\n".join(runners.problems) for name in family.unresolved)
    for family in undeclared:
        assert family.runner == "cluster:mi325x-tw" and family.clusters == ("mi325x-tw",)
        assert any(f"`{family.key}` runner `{family.runner}`" in p for p in problems)
        # Its decisions name the configuration error, whatever the feed says of the cluster.
        assert family.unresolved == ("cluster:mi325x-tw",)
        for known in (frozenset(), frozenset({"mi325x-tw"})):
            reading = CapacityReading(eligible=known, known=known, at=datetime(2026, 11, 30, tzinfo=UTC))
            _, reason = target_eligibility(family.clusters, reading, "all", runner=family.runner,
                                           unresolved=family.unresolved)
            assert "runner cluster:mi325x-tw names a cluster runners.yaml does not declare" in reason

    # No family waits on an id the old rule made up (`h100-dgxc-slurm`, `b200-nscale-slurm`, ...).
    targeted = Counter(c for f in families for c in f.clusters)
    assert set(targeted) == (REAL_DECLARED - {"mi300x-tw"}) | {"mi325x-tw"}
    by_key = {f.key: f for f in families}
    assert by_key["dsr1-fp8-h200-dynamo-sglang"].clusters == ("h200-dgxc",)  # h200-multinode
    assert by_key["dsr1-fp8-h100-dynamo-trt"].clusters == ("h100-dgxc",)  # h100-multinode: ..._16 to _19
    assert by_key["dsv4-fp8-h200-sglang"].clusters == ("h200-dgxc",)  # a declared id used as a label


# --- the newer layout: a `clusters:` mapping ----------------------------------------


def test_newer_layout_declares_the_keys_of_clusters() -> None:
    runners = parse_runners(NEWER)
    # `clusters:` wins: `hardware:` is not read for declarations then.
    assert runners.declared == {"h100", "h100-dgxc", "b200-nscale", "mi355x-amds"}
    assert dict(runners) == {
        "h100": ("h100", "h100-dgxc"),  # `h100_3` by its exact id, `h100-dgxc-slurm_07` by the longest prefix
        "b200": ("b200-nscale",),
        "b200-lost": (),
        "mi355x-amds": ("mi355x-amds",),
        "empty": (),
    }
    assert runners.problems == (
        "runner b200-cw_00 (label b200) resolves to no declared cluster",
        "runner b200-cw_00 (label b200-lost) resolves to no declared cluster",
        "runner b200-cw_01 (label b200-lost) resolves to no declared cluster",
    )


def test_newer_layout_targets_of_every_kind_of_runner() -> None:
    runners = parse_runners(NEWER)
    assert runners.targets("cluster:h100-dgxc").clusters == ("h100-dgxc",)
    assert runners.targets("b200-nscale").clusters == ("b200-nscale",)  # declared, not a label
    assert runners.targets("mi355x-amds").clusters == ("mi355x-amds",)  # declared and a label: the label
    partly = runners.targets("b200")
    assert (partly.clusters, partly.unresolved, partly.problem) == (("b200-nscale",), ("b200-cw_00",), None)
    lost = runners.targets("b200-lost")
    assert (lost.clusters, lost.unresolved, lost.problem) == ((), ("b200-cw_00", "b200-cw_01"), None)
    undeclared = runners.targets("cluster:only-in-hardware")
    assert undeclared.clusters == ("only-in-hardware",)
    assert undeclared.problem == (
        "runner `cluster:only-in-hardware` names cluster only-in-hardware, which runners.yaml does not declare"
    )
    assert runners.targets("empty").problem == "runner `empty` is a label that lists no runner in runners.yaml"
    unknown = runners.targets("z900")
    assert (unknown.clusters, unknown.problem) == (
        (),
        "runner `z900` is not cluster:<id>, a declared cluster or a label in runners.yaml",
    )


def test_newer_layout_families_keep_resolved_clusters_and_name_the_rest() -> None:
    master = (
        "partly:\n  image: a:1\n  runner: b200\n"
        "lost:\n  image: a:1\n  runner: b200-lost\n"
        "unknown:\n  image: a:1\n  runner: z900\n"
        "fine:\n  image: a:1\n  runner: h100\n"
    )
    parsed = read_master("configs/x-master.yaml", master, parse_runners(NEWER))
    by_key = {f.key: f for f in parsed.families}
    assert (by_key["partly"].clusters, by_key["partly"].unresolved) == (("b200-nscale",), ("b200-cw_00",))
    assert (by_key["lost"].clusters, by_key["lost"].unresolved) == ((), ("b200-cw_00", "b200-cw_01"))
    assert (by_key["unknown"].clusters, by_key["unknown"].unresolved) == ((), ())
    assert (by_key["fine"].clusters, by_key["fine"].unresolved) == (("h100", "h100-dgxc"), ())
    # Unresolved runner names are runners.yaml's errors; an unknown label is the family's.
    assert parsed.problems == (
        (
            "configs/x-master.yaml:7: `unknown` runner `z900` is not cluster:<id>, a declared cluster "
            "or a label in runners.yaml"
        ),
    )


def test_without_runners_only_cluster_runners_have_clusters_and_labels_are_not_reported() -> None:
    master = "a:\n  image: a:1\n  runner: cluster:h100-dgxc\nb:\n  image: a:1\n  runner: h100\n"
    parsed = read_master("configs/x-master.yaml", master, None)
    assert [f.clusters for f in parsed.families] == [("h100-dgxc",), ()]
    assert parsed.problems == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("labels: {h100: [h100_0]}\n", "declares no cluster"),
        ("labels: {h100: [h100_0]}\nhardware: {h100: {gpus-per-node: 8}}\n", "declares no cluster"),
        ("clusters: {}\n", "declares no cluster"),
        ("clusters: [h100]\n", "`clusters:` must be a mapping"),
        ("clusters: {h100: {}, 'cluster:': {}}\n", "a declared cluster id is empty"),
    ],
)
def test_a_runners_yaml_in_neither_layout_is_an_error(text: str, message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        parse_runners(text)


def test_labels_are_optional_when_clusters_are_declared() -> None:
    runners = parse_runners("clusters: {h100-dgxc: {}}\n")
    assert (dict(runners), runners.targets("h100-dgxc").clusters, runners.problems) == ({}, ("h100-dgxc",), ())


# --- the stored form -----------------------------------------------------------------


def test_the_stored_document_reads_back_and_an_older_mapping_is_not_taken_for_it() -> None:
    runners = parse_runners(NEWER)
    assert Runners.from_document(runners.document()) == runners
    assert Runners.from_document({}) is None
    # What an older version stored: label -> cluster ids.
    assert Runners.from_document({"h100": ["h100-cw", "h100-dgxc-slurm"], "labels": ["x"]}) is None
    RepoMeta(installation=1, runners={"h100": ["h100-cw", "h100-dgxc-slurm"]})  # still loads


# --- what the catalog records and the state document shows ------------------------


def b200_repo(runners_yaml: str) -> FakeRepo:
    repo = FakeRepo("acme/bench")
    repo.put_files(
        {
            RUNNERS_PATH: runners_yaml,
            "configs/x-master.yaml": (
                "partly:\n  image: a:1\n  runner: b200\nunknown:\n  image: a:1\n  runner: z900\n"
            ),
        }
    )
    return repo


async def test_unresolved_runners_and_unknown_labels_are_config_errors_in_the_state_document() -> None:
    repo = b200_repo(NEWER)
    state = RepoState("acme/bench", RepoMeta(installation=1))
    sync = CatalogSync(live=None)  # type: ignore[arg-type]  # reading configs needs no live state
    assert await sync.refresh_runners(state, repo, repo.head)
    await sync.refresh_config(state, repo, "configs/x-master.yaml", repo.head, None)

    family = state.catalog.get("configs/x-master.yaml:partly")
    assert family is not None and family.unresolved == ("b200-cw_00",)
    assert state.state_document(NOW)["config_errors"] == [
        {"path": "configs/runners.yaml", "detail": "runner b200-cw_00 (label b200) resolves to no declared cluster"},
        {"path": "configs/runners.yaml", "detail": "runner b200-cw_00 (label b200-lost) resolves to no declared cluster"},
        {"path": "configs/runners.yaml", "detail": "runner b200-cw_01 (label b200-lost) resolves to no declared cluster"},
        {
            "path": "configs/x-master.yaml",
            "detail": "configs/x-master.yaml:4: `unknown` runner `z900` is not cluster:<id>, "
            "a declared cluster or a label in runners.yaml",
        },
    ]

    # Fixed runners.yaml and master config: the errors go away.
    repo.put_files({RUNNERS_PATH: "clusters: {b200-nscale: {}}\nlabels: {b200: [b200-nscale_0]}\n"})
    repo.put_files({"configs/x-master.yaml": "partly:\n  image: a:1\n  runner: b200\n"})
    assert await sync.refresh_runners(state, repo, repo.head)
    await sync.refresh_config(state, repo, "configs/x-master.yaml", repo.head, None)
    assert state.state_document(NOW)["config_errors"] == []
    family = state.catalog.get("configs/x-master.yaml:partly")
    assert family is not None and (family.clusters, family.unresolved) == (("b200-nscale",), ())


async def test_a_runners_yaml_in_neither_layout_keeps_the_last_good_runners() -> None:
    repo = b200_repo(NEWER)
    state = RepoState("acme/bench", RepoMeta(installation=1))
    sync = CatalogSync(live=None)  # type: ignore[arg-type]
    assert await sync.refresh_runners(state, repo, repo.head)
    good = dict(state.meta.runners)
    repo.put_files({RUNNERS_PATH: "labels: {b200: [b200-nscale_0]}\n"})
    assert not await sync.refresh_runners(state, repo, repo.head)
    assert state.meta.runners == good
    [error] = state.state_document(NOW)["config_errors"]
    assert error["path"] == RUNNERS_PATH and "declares no cluster" in error["detail"]


async def test_runners_stored_by_an_older_version_are_read_again() -> None:
    repo = b200_repo(NEWER)
    state = RepoState("acme/bench", RepoMeta(installation=1, runners={"b200": ["b200-cw", "b200-nscale-slurm"]}))
    sync = CatalogSync(live=None)  # type: ignore[arg-type]
    await sync.refresh_config(state, repo, "configs/x-master.yaml", repo.head, None)
    assert Runners.from_document(state.meta.runners) == parse_runners(NEWER)
    family = state.catalog.get("configs/x-master.yaml:partly")
    assert family is not None and family.clusters == ("b200-nscale",)


# --- the decision ---------------------------------------------------------------------


def test_the_capacity_reason_names_the_real_runners_that_resolve_to_no_cluster(fixtures: Path) -> None:
    families, _ = real_families(fixtures, real_runners(fixtures))
    b200 = next(f for f in families if f.key == "dsr1-fp4-b200-sglang")
    busy = CapacityReading(eligible=frozenset(), known=frozenset({"b200-dgxc"}), at=NOW)
    eligible, reason = target_eligibility(
        b200.clusters, busy, "all", runner=b200.runner, unresolved=b200.unresolved
    )
    assert not eligible
    assert reason == (
        "cluster b200-dgxc is busy; runner label b200 lists b200-cw_00, b200-cw_01, b200-nb_0, b200-nb_1, "
        "which name no cluster declared in runners.yaml"
    )


def test_runners_without_labels_are_still_runners() -> None:
    # A Runners without labels is an empty mapping, so falsy: it must not read as "unknown".
    master = "a:\n  image: a:1\n  runner: b200\nb:\n  image: a:1\n  runner: h100\n"
    parsed = read_master("configs/x-master.yaml", master, parse_runners("clusters: {b200: {}}\n"))
    assert [f.clusters for f in parsed.families] == [("b200",), ()]
    assert parsed.problems == (
        "configs/x-master.yaml:4: `b` runner `h100` is not cluster:<id>, a declared cluster or a label in runners.yaml",
    )


class _Touched(str):
    """A declared cluster id that counts how often it is concatenated or compared."""

    touches = 0

    def _touch(self) -> None:
        type(self).touches += 1

    def __add__(self, other: str) -> str:
        self._touch()
        return str.__add__(self, other)

    def __eq__(self, other: object) -> bool:
        self._touch()
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_resolving_runner_names_does_not_test_each_name_against_every_declared_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Found by a hostile-input review: each name was tried against every declared id
    # (`name.startswith(c + "-")`), so a runners.yaml of N clusters and N runner names took
    # N² steps on the event loop. A name's own prefixes are looked up instead.
    monkeypatch.setattr(_Touched, "touches", 0)
    n = 1000
    declared = [_Touched(f"c{i}") for i in range(n)] + [_Touched("h100"), _Touched("h100-dgxc")]
    names = [f"x{i}" for i in range(n)] + ["h100-dgxc-slurm_07", "h100-cw_00", "c7-a-b", "c7_3", "h100-dgxc_2"]
    runners = Runners(declared, {"l": names})
    assert runners.targets("l").clusters == ("c7", "h100", "h100-dgxc")
    assert runners.targets("l").unresolved == tuple(f"x{i}" for i in range(n))
    assert runners.cluster_of("h100-dgxc-slurm_07") == "h100-dgxc"  # the longest declared prefix
    assert runners.cluster_of("h100-cw_00") == "h100"
    assert runners.cluster_of("h100-dgxc_2") == "h100-dgxc"  # the exact id first
    assert runners.cluster_of("h100x-1") is None  # a declared id followed by `-`, not any prefix
    # At most a few touches per name that resolves, none for the N that do not.
    assert _Touched.touches <= 20
