"""The catalog, image ages and the schedule stay current (on the real InferenceX configs)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.core.domain import parse_time
from bot.core.events import BlameRange, PushEvent
from bot.services.scheduler import Scheduler
from tests.services.conftest import NOW, REPO, Kit

NVIDIA = "configs/nvidia-master.yaml"
AMD = "configs/amd-master.yaml"
ZERO = "0" * 40
PUSHED_AT = datetime(2026, 11, 30, 7, 30, tzinfo=UTC)
MONTH_AGO = NOW - timedelta(days=30)


def push(before: str, after: str, pushed_at: datetime = PUSHED_AT) -> PushEvent:
    return PushEvent.model_validate({
        "ref": "refs/heads/main", "before": before, "after": after,
        "repository": {"full_name": REPO, "pushed_at": int(pushed_at.timestamp())},
        "installation": {"id": 1},
    })


def real_files(fixtures: Path) -> dict[str, str]:
    root = fixtures / "inferencex" / "configs"
    return {f"configs/{name}": (root / name).read_text() for name in ("nvidia-master.yaml", "amd-master.yaml", "runners.yaml")}


def use_real_configs(kit: Kit, fixtures: Path) -> None:
    kit.repo.files[kit.repo.head].update(real_files(fixtures))


# -- pushes delivered late ------------------------------------------------------------------


async def test_a_late_branch_creation_push_does_not_roll_the_catalog_back(kit: Kit, fixtures: Path) -> None:
    use_real_configs(kit, fixtures)
    first = kit.repo.head
    second = "b" * 40
    bumped = kit.repo.files[first][AMD].replace("v0.5.12-rocm700-mi35x", "v0.5.13-rocm700-mi35x", 1)
    kit.repo.files[second] = {**kit.repo.files[first], AMD: bumped}
    kit.repo.head = second  # a new repository: main created at `first`, then pushed to `second`
    await kit.reconciler.reconcile(REPO, 1)  # state built at `second`
    await kit.catalog.on_push(kit.state, push(first, second))  # nothing new
    await kit.catalog.on_push(kit.state, push(ZERO, first))  # the creation push, delivered last
    family = kit.state.catalog.get(f"{AMD}:dsr1-fp4-mi355x-sglang")
    assert kit.state.meta.head_sha == second, "catalog rolled back to the first commit"
    assert family is not None and family.image.endswith("v0.5.13-rocm700-mi35x")


async def test_a_push_delivered_after_the_force_push_that_undid_it_is_not_applied(kit: Kit, fixtures: Path) -> None:
    use_real_configs(kit, fixtures)
    first = kit.repo.head
    await kit.reconciler.reconcile(REPO, 1)
    bad = "b" * 40
    bumped = kit.repo.files[first][AMD].replace("v0.5.12-rocm700-mi35x", "v0.5.99-broken", 1)
    kit.repo.files[bad] = {**kit.repo.files[first], AMD: bumped}
    # main: first -> bad (push 1), then force-pushed back: bad -> first (push 2).
    kit.repo.head = first
    await kit.catalog.on_push(kit.state, push(bad, first, PUSHED_AT + timedelta(seconds=40)))  # push 2, first
    await kit.catalog.on_push(kit.state, push(first, bad))  # push 1, late
    family = kit.state.catalog.get(f"{AMD}:dsr1-fp4-mi355x-sglang")
    assert family is not None and family.image.endswith("v0.5.12-rocm700-mi35x"), family.image
    assert kit.state.meta.head_sha == first


# -- image ages -----------------------------------------------------------------------------


async def test_renaming_a_master_config_keeps_its_image_ages(kit: Kit, fixtures: Path) -> None:
    use_real_configs(kit, fixtures)
    kit.repo.blames[AMD] = [BlameRange(startingLine=1, endingLine=100_000, committed=MONTH_AGO)]
    await kit.reconciler.reconcile(REPO, 1)
    assert {f.image_changed_at for f in kit.state.catalog.families_of(AMD)} == {MONTH_AGO}
    before, after = kit.repo.head, "e" * 40
    files = dict(kit.repo.files[before])
    files["configs/amd-mi-master.yaml"] = files.pop(AMD)  # `git mv`, nothing else
    kit.repo.files[after] = files
    kit.repo.head = after
    await kit.catalog.on_push(kit.state, push(before, after))
    moved = kit.state.catalog.families_of("configs/amd-mi-master.yaml")
    assert moved and not kit.state.catalog.families_of(AMD)
    # GitHub's blame follows the rename (a full reconcile dates them a month old); the push
    # dated every image of the file "now".
    assert {f.image_changed_at for f in moved} == {MONTH_AGO}


async def test_respelling_an_image_enroot_to_registry_keeps_its_age(kit: Kit, fixtures: Path) -> None:
    use_real_configs(kit, fixtures)
    kit.repo.blames[NVIDIA] = [BlameRange(startingLine=1, endingLine=100_000, committed=MONTH_AGO)]
    await kit.reconciler.reconcile(REPO, 1)
    fid = f"{NVIDIA}:dsr1-fp4-b200-trt"
    old = kit.state.catalog.get(fid)
    assert old is not None and old.image == "nvcr.io#nvidia/tensorrt-llm/release:1.3.0rc14"
    before, after = kit.repo.head, "e" * 40
    text = kit.repo.files[before][NVIDIA]
    kit.repo.files[after] = {**kit.repo.files[before], NVIDIA: text.replace(
        "dsr1-fp4-b200-trt:\n  image: nvcr.io#nvidia/", "dsr1-fp4-b200-trt:\n  image: nvcr.io/nvidia/", 1)}
    kit.repo.head = after
    await kit.catalog.on_push(kit.state, push(before, after))
    new = kit.state.catalog.get(fid)
    assert new is not None and new.candidate == old.candidate  # the same image to Klaud
    assert new.image_changed_at == MONTH_AGO


# -- the schedule ---------------------------------------------------------------------------


class Jitter(random.Random):
    def __init__(self, values: list[float]) -> None:
        super().__init__(0)
        self.values = values

    def uniform(self, a: float, b: float) -> float:
        return self.values.pop(0) if self.values else 30.0


async def test_a_clock_set_back_two_seconds_after_a_wave_does_not_run_the_same_slot_again(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    ticks = Scheduler(kit.live, kit.waves, kit.reconciler, kit.outcomes, kit.clock, rng=Jitter([0.0, 60.0]))
    await ticks.tick()  # next wave: 10:00:00
    kit.clock.set(datetime(2026, 11, 30, 10, 0, tzinfo=UTC))
    assert await ticks.tick() == [REPO]  # the 10:00 wave; the next at 12:01:00
    assert parse_time(kit.state.meta.next_wave_at) == datetime(2026, 11, 30, 12, 1, tzinfo=UTC)
    kit.clock.advance(-2)  # NTP steps the clock back two seconds
    again = []
    for _ in range(100):
        if await ticks.tick():
            again.append(kit.clock.now())
        kit.clock.advance(60)
    assert again == [], f"the 10:00 slot ran again at {again}"


async def test_a_light_reconcile_that_finds_a_missed_push_also_dates_the_unknown_ages(kit: Kit, fixtures: Path) -> None:
    from bot.github.errors import Unavailable

    use_real_configs(kit, fixtures)
    kit.repo.blames[AMD] = [BlameRange(startingLine=1, endingLine=100_000, committed=MONTH_AGO)]
    kit.repo.blames[NVIDIA] = [BlameRange(startingLine=1, endingLine=100_000, committed=MONTH_AGO)]
    kit.repo.fail("blame", Unavailable(502, "Bad Gateway"), times=2)  # install: GitHub did not answer
    await kit.reconciler.reconcile(REPO, 1)
    assert all(f.image_changed_at is None for f in kit.state.catalog)
    # A push of an unrelated file whose webhook was lost: the light reconcile sees a moved head.
    before, after = kit.repo.head, "e" * 40
    kit.repo.files[after] = {**kit.repo.files[before], "README.md": "hello\n"}
    kit.repo.head = after
    await kit.reconciler.reconcile(REPO, 1, light=True)
    unknown = [f.id for f in kit.state.catalog if f.image_changed_at is None]
    assert unknown == [], f"{len(unknown)} families still of unknown age (picked first) until the next light reconcile"


TEAM_A, TEAM_B = "configs/team-a-master.yaml", "configs/team-b-master.yaml"
YEAR_AGO = NOW - timedelta(days=365)


async def test_two_renamed_files_sharing_a_key_never_take_each_others_age(kit: Kit, fixtures: Path) -> None:
    # Two master configs that both define the key `dsr1-fp4-b200-trt` with the same image (ids
    # differ by path): one image a month old, the other a year. Both files renamed in one push.
    use_real_configs(kit, fixtures)
    files = kit.repo.files[kit.repo.head]
    text = files.pop(NVIDIA)
    files[TEAM_A], files[TEAM_B] = text, text
    kit.repo.blames[TEAM_A] = [BlameRange(startingLine=1, endingLine=100_000, committed=MONTH_AGO)]
    kit.repo.blames[TEAM_B] = [BlameRange(startingLine=1, endingLine=100_000, committed=YEAR_AGO)]
    await kit.reconciler.reconcile(REPO, 1)
    assert kit.state.catalog.get(f"{TEAM_A}:dsr1-fp4-b200-trt").image_changed_at == MONTH_AGO
    assert kit.state.catalog.get(f"{TEAM_B}:dsr1-fp4-b200-trt").image_changed_at == YEAR_AGO
    before, after = kit.repo.head, "e" * 40
    moved = dict(kit.repo.files[before])
    moved["configs/team-a2-master.yaml"] = moved.pop(TEAM_A)  # `git mv` both, nothing else
    moved["configs/team-b2-master.yaml"] = moved.pop(TEAM_B)
    kit.repo.files[after] = moved
    kit.repo.head = after
    await kit.catalog.on_push(kit.state, push(before, after))
    ages = {f.path: f.image_changed_at for f in kit.state.catalog if f.key == "dsr1-fp4-b200-trt"}
    # Whose is whose cannot be told from the families alone: both restart at the push, rather
    # than one taking the other's age (both took YEAR_AGO).
    assert ages == {"configs/team-a2-master.yaml": PUSHED_AT, "configs/team-b2-master.yaml": PUSHED_AT}, ages


async def test_one_push_dated_far_ahead_does_not_cost_every_later_push_a_branch_read(kit: Kit, fixtures: Path) -> None:
    # A push whose pushed_at read a year ahead (an Enterprise Server's clock set wrong, then
    # fixed; any value up to year 9000 is accepted): last_push_at keeps it, with no end, and
    # every later push from the known head is "no later than the last" -> one GET each.
    use_real_configs(kit, fixtures)
    await kit.reconciler.reconcile(REPO, 1)
    head = kit.repo.head
    shas = [c * 40 for c in "cdef"]
    previous = head
    for n, sha in enumerate(shas):
        kit.repo.files[sha] = {**kit.repo.files[previous], "README.md": f"{n}\n"}
        previous = sha
    kit.repo.head = shas[0]
    await kit.catalog.on_push(kit.state, push(head, shas[0], NOW + timedelta(days=365)))
    kit.repo.calls.clear()
    for n, sha in enumerate(shas[1:], start=1):  # ordinary pushes, each from the known head
        kit.repo.head = sha
        await kit.catalog.on_push(kit.state, push(shas[n - 1], sha, NOW + timedelta(minutes=n)))
        assert kit.state.meta.head_sha == sha
    reads = [c for c in kit.repo.calls if c[0] == "head_sha"]
    assert reads == [], f"{len(reads)} branch reads for {len(shas) - 1} in-order pushes"


async def test_two_renamed_files_one_of_unknown_age_do_not_both_take_the_known_age(kit: Kit, fixtures) -> None:
    # 97f74da: "such a move is ambiguous and restarts at the push". An unknown age is another age.
    from bot.core.events import BlameRange
    from tests.services.test_catalog_freshness import (
        MONTH_AGO,
        NVIDIA,
        PUSHED_AT,
        use_real_configs,
    )
    from tests.services.test_catalog_freshness import push as push_at

    team_a, team_b = "configs/team-a-master.yaml", "configs/team-b-master.yaml"
    use_real_configs(kit, fixtures)
    files = kit.repo.files[kit.repo.head]
    text = files.pop(NVIDIA)
    files[team_a], files[team_b] = text, text
    kit.repo.blames[team_a] = [BlameRange(startingLine=1, endingLine=100_000, committed=MONTH_AGO)]
    kit.repo.blames.pop(team_b, None)  # GitHub could not answer: unknown
    await kit.reconciler.reconcile(REPO, 1)
    assert kit.state.catalog.get(f"{team_a}:dsr1-fp4-b200-trt").image_changed_at == MONTH_AGO
    assert kit.state.catalog.get(f"{team_b}:dsr1-fp4-b200-trt").image_changed_at is None
    before, after = kit.repo.head, "e" * 40
    moved = dict(kit.repo.files[before])
    moved["configs/team-a2-master.yaml"] = moved.pop(team_a)
    moved["configs/team-b2-master.yaml"] = moved.pop(team_b)
    kit.repo.files[after] = moved
    kit.repo.head = after
    await kit.catalog.on_push(kit.state, push_at(before, after))
    ages = {f.path: f.image_changed_at for f in kit.state.catalog if f.key == "dsr1-fp4-b200-trt"}
    assert list(ages.values()).count(MONTH_AGO) <= 1, ages
    assert ages == {"configs/team-a2-master.yaml": PUSHED_AT, "configs/team-b2-master.yaml": PUSHED_AT}, ages
