"""Image ages from the history of the master configs (DESIGN §4 "Image age")."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.core.events import BlameRange
from bot.github.errors import Unavailable
from bot.metrics import REGISTRY
from tests import scenarios as sc
from tests.services.conftest import NOW, REPO, Kit

NVIDIA = "configs/nvidia-master.yaml"
H200 = f"{NVIDIA}:dsr1-fp8-h200-trt"
B200 = f"{NVIDIA}:dsr1-fp4-b200-sglang"


def line_of(text: str, key: str) -> int:
    lines = text.split("\n")
    start = lines.index(f"{key}:")
    return next(i for i in range(start, len(lines)) if lines[i].strip().startswith("image:")) + 1


async def test_a_full_reconcile_dates_every_image_from_one_blame_per_config(kit: Kit) -> None:
    h200_image = line_of(sc.NVIDIA, "dsr1-fp8-h200-trt")
    kit.repo.blames[NVIDIA] = [
        BlameRange(startingLine=1, endingLine=h200_image - 1, committed=NOW - timedelta(days=90)),
        BlameRange(startingLine=h200_image, endingLine=h200_image, committed=NOW - timedelta(days=3)),
        BlameRange(startingLine=h200_image + 1, endingLine=10_000, committed=NOW - timedelta(days=90)),
    ]
    await kit.reconciler.reconcile(REPO, 1)
    assert [c for c in kit.repo.calls if c[0] == "blame"] == [
        ("blame", "configs/amd-master.yaml", kit.repo.head), ("blame", NVIDIA, kit.repo.head),
    ]
    h200, b200 = kit.state.catalog.get(H200), kit.state.catalog.get(B200)
    assert h200 is not None and b200 is not None
    assert h200.image_changed_at == NOW - timedelta(days=3)
    assert b200.image_changed_at == NOW - timedelta(days=90)
    # Stalest first: the wave's order shows the ages.
    preview = await kit.waves.preview(REPO)
    assert preview is not None
    order = [d.family for d in preview.decisions]
    assert order.index(B200) < order.index(H200)


async def test_an_unanswered_blame_leaves_ages_unknown_until_the_next_light_reconcile(kit: Kit) -> None:
    kit.repo.fail("blame", Unavailable(502, "Bad Gateway"), times=2)
    await kit.reconciler.reconcile(REPO, 1)
    assert all(f.image_changed_at is None for f in kit.state.catalog)
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert all(f.image_changed_at is not None for f in kit.state.catalog)
    kit.repo.calls.clear()
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert [c for c in kit.repo.calls if c[0] == "blame"] == []  # nothing left to ask


def image_age_sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(f"klaud_family_image_age_days_{name}", {"repo": REPO, **labels})


async def test_the_image_age_histogram_counts_each_wave_and_follows_a_newly_dated_image(kit: Kit) -> None:
    kit.repo.fail("blame", Unavailable(502, "Bad Gateway"), times=1)  # the amd config stays undated
    everything_old = [BlameRange(startingLine=1, endingLine=10_000, committed=NOW - timedelta(days=90))]
    kit.repo.blames[NVIDIA] = everything_old
    await kit.reconciler.reconcile(REPO, 1)
    dated = [f for f in kit.state.catalog if f.image_changed_at is not None]
    assert 0 < len(dated) < len(kit.state.catalog)

    await kit.waves.run(REPO, trigger="test")
    assert image_age_sample("count") == len(dated)
    assert image_age_sample("bucket", le="60.0") == 0 and image_age_sample("bucket", le="90.0") == len(dated)
    assert image_age_sample("sum") == pytest.approx(90 * len(dated))

    # The light reconcile dates the rest (2 days old): the next wave counts them too.
    kit.repo.blames["configs/amd-master.yaml"] = [
        BlameRange(startingLine=1, endingLine=10_000, committed=NOW - timedelta(days=2))]
    await kit.reconciler.reconcile(REPO, 1, light=True)
    kit.clock.advance(86400)
    await kit.waves.run(REPO, trigger="test")
    total, recent = len(kit.state.catalog), len(kit.state.catalog) - len(dated)
    assert image_age_sample("count") == total
    assert image_age_sample("bucket", le="3.0") == recent and image_age_sample("bucket", le="1.0") == 0
    assert image_age_sample("sum") == pytest.approx(91 * len(dated) + 3 * recent)


async def test_a_block_that_repeats_its_image_key_is_dated_by_the_line_that_wins(kit: Kit) -> None:
    # YAML (PyYAML, as Klaud and the benchmark's own tooling read it) keeps the later of two
    # `image:` keys of one block: the image that runs is the one on the later line, so that
    # line's blame dates it, not the overridden line above.
    text = sc.NVIDIA.replace(
        "  framework: trt\n", "  framework: trt\n  image: nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc1\n", 1)
    kit.repo.files[kit.repo.head][NVIDIA] = text
    first, winner = line_of(sc.NVIDIA, "dsr1-fp8-h200-trt"), text.split("\n").index(
        "  image: nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc1") + 1
    kit.repo.blames[NVIDIA] = [
        BlameRange(startingLine=1, endingLine=winner - 1, committed=NOW - timedelta(days=90)),
        BlameRange(startingLine=winner, endingLine=winner, committed=NOW - timedelta(days=3)),
        BlameRange(startingLine=winner + 1, endingLine=10_000, committed=NOW - timedelta(days=90)),
    ]
    assert first < winner
    await kit.reconciler.reconcile(REPO, 1)
    h200 = kit.state.catalog.get(H200)
    assert h200 is not None and h200.image == "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc1"
    assert h200.image_changed_at == NOW - timedelta(days=3), h200.image_changed_at
