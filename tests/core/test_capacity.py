"""Capacity gate: the feed document rules (domain §4.5) and the HTTP reader."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot.core.capacity import (
    CLOCK_SKEW,
    MAX_AGE,
    evaluate_feed,
    target_eligibility,
    usable_until,
)
from bot.core.domain import CapacityReading, stamp

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def cluster(cluster_id: str, at: datetime = NOW, **changes: Any) -> dict[str, Any]:
    """A cluster with capacity, observed and received just before `at` (generatedAt)."""
    summary = {
        "totalNodes": 8,
        "allocatedNodes": 2,
        "mixedNodes": 0,
        "idleNodes": 6,
        "downNodes": 0,
        "otherNodes": 0,
    }
    summary.update(changes.pop("summary", {}))
    entry = {
        "id": cluster_id,
        "stale": False,
        "status": "operational",
        "observedAt": stamp(at - timedelta(seconds=30)),
        "receivedAt": stamp(at - timedelta(seconds=29)),
        "summary": summary,
    }
    entry.update(changes)
    return entry


def feed(*clusters: dict[str, Any], at: datetime = NOW) -> dict[str, Any]:
    return {
        "kind": "inferencex.status.clusters",
        "generatedAt": stamp(at),
        "data": {"available": True, "clusters": list(clusters) or [cluster("b200-nscale")]},
    }


def evaluate(document: Any, *, retrieved_at: datetime = NOW) -> CapacityReading:
    return evaluate_feed(document, now=NOW, retrieved_at=retrieved_at)


DELETE = object()


def with_change(path: str, value: Any) -> dict[str, Any]:
    """A valid feed with one value (dotted path; `DELETE` removes it) changed."""
    document = copy.deepcopy(feed())
    keys: list[Any] = path.split(".")
    target: Any = document
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = int(keys[-1]) if isinstance(target, list) else keys[-1]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return document


def test_valid_feed_lists_eligible_and_known_clusters() -> None:
    reading = evaluate(
        feed(
            cluster("b200-nscale"),
            cluster("h200-nb", status="degraded"),
            cluster("mi355x-amd", summary={"allocatedNodes": 7, "idleNodes": 1}),
        )
    )
    assert reading.error is None
    assert reading.eligible == {"b200-nscale", "h200-nb"}
    assert reading.known == {"b200-nscale", "h200-nb", "mi355x-amd"}
    assert reading.at == NOW


@pytest.mark.parametrize(
    ("document", "code"),
    [
        ([], "invalid-response"),
        ("text", "invalid-response"),
        (with_change("kind", "inferencex.status.images"), "invalid-kind"),
        (with_change("kind", DELETE), "invalid-kind"),
        (with_change("generatedAt", DELETE), "invalid-generated-at"),
        (with_change("generatedAt", "yesterday"), "invalid-generated-at"),
        (with_change("generatedAt", "2026-11-30T08:00:00"), "invalid-generated-at"),
        (with_change("generatedAt", 1796025600), "invalid-generated-at"),
        (with_change("generatedAt", stamp(NOW - timedelta(seconds=126))), "stale-feed"),
        (with_change("generatedAt", stamp(NOW + timedelta(seconds=6))), "stale-feed"),
        (with_change("data", DELETE), "invalid-response"),
        (with_change("data", []), "invalid-response"),
        (with_change("data.available", False), "feed-unavailable"),
        (with_change("data.available", "true"), "feed-unavailable"),
        (with_change("data.available", DELETE), "feed-unavailable"),
        (with_change("data.clusters", {"b200-nscale": {}}), "invalid-response"),
        (with_change("data.clusters", DELETE), "invalid-response"),
        (with_change("data.clusters.0", "b200-nscale"), "invalid-response"),
        (with_change("data.clusters.0.id", ""), "invalid-cluster-ids"),
        (with_change("data.clusters.0.id", 7), "invalid-cluster-ids"),
        (with_change("data.clusters.0.id", DELETE), "invalid-cluster-ids"),
        (feed(cluster("b200-nscale"), cluster("b200-nscale")), "invalid-cluster-ids"),
    ],
)
def test_structural_problem_closes_every_cluster(document: Any, code: str) -> None:
    reading = evaluate(document)
    assert reading.error == code
    assert reading.eligible == frozenset()


@pytest.mark.parametrize("age", [125, 0, -5])
def test_feed_ages_within_the_skew_allowance_are_accepted(age: int) -> None:
    generated_at = NOW - timedelta(seconds=age)
    reading = evaluate(feed(cluster("b200-nscale", at=generated_at), at=generated_at))
    assert reading.error is None and reading.eligible == {"b200-nscale"}


def test_retrieval_older_than_allowed_closes_the_feed() -> None:
    reading = evaluate(feed(), retrieved_at=NOW - timedelta(seconds=126))
    assert reading.error == "stale-retrieval" and reading.eligible == frozenset()


def test_duplicate_ids_empty_the_whole_set() -> None:
    reading = evaluate(feed(cluster("a"), cluster("b"), cluster("a")))
    assert reading.eligible == frozenset() and reading.error == "invalid-cluster-ids"


@pytest.mark.parametrize(
    "changes",
    [
        {"stale": True},
        {"stale": None},
        {"status": "down"},
        {"status": "Operational"},
        {"status": ["operational"]},  # not text (nor hashable): raised TypeError
        {"status": {"state": "operational"}},
        {"observedAt": None},
        {"receivedAt": "soon"},
        # observed more than 5 s after it was received
        {"observedAt": stamp(NOW - timedelta(seconds=23))},
        # received more than 5 s after the document was generated
        {"receivedAt": stamp(NOW + timedelta(seconds=6)), "observedAt": stamp(NOW)},
        {"summary": {"totalNodes": 0, "allocatedNodes": 0, "idleNodes": 0}},
        {"summary": {"totalNodes": True}},
        {"summary": {"idleNodes": 6.0}},
        {"summary": {"idleNodes": "6"}},
        {"summary": {"downNodes": -1, "idleNodes": 7}},
        {"summary": {"otherNodes": 1}},  # counts no longer sum to the total
        {"summary": {"allocatedNodes": 8, "idleNodes": 0}},
        # exactly 80 % allocated or mixed: strictly below is required
        {"summary": {"totalNodes": 10, "allocatedNodes": 6, "mixedNodes": 2, "idleNodes": 2}},
    ],
)
def test_cluster_failing_a_gate_is_known_but_not_eligible(changes: dict[str, Any]) -> None:
    summary = changes.pop("summary", None)
    broken = cluster("b200-nscale", **changes)
    if summary is not None:
        broken["summary"].update(summary)
    reading = evaluate(feed(broken, cluster("h200-nb")))
    assert reading.error is None
    assert reading.known == {"b200-nscale", "h200-nb"}
    assert reading.eligible == {"h200-nb"}


def test_cluster_without_summary_is_not_eligible() -> None:
    bare = cluster("b200-nscale")
    del bare["summary"]
    assert evaluate(feed(bare)).eligible == frozenset()


def test_just_below_eighty_percent_busy_is_eligible() -> None:
    summary = {"totalNodes": 10, "allocatedNodes": 5, "mixedNodes": 2, "idleNodes": 1,
               "downNodes": 2}
    assert evaluate(feed(cluster("b200-nscale", summary=summary))).eligible == {"b200-nscale"}


READING = CapacityReading(
    eligible=frozenset({"b200-nscale"}), known=frozenset({"b200-nscale", "b200-dgxc"}), at=NOW
)


@pytest.mark.parametrize(
    ("clusters", "rule", "expected"),
    [
        (["b200-nscale"], "all", (True, "cluster b200-nscale has capacity")),
        (["b200-dgxc"], "all", (False, "cluster b200-dgxc is busy")),
        (["b200-nscale", "b200-dgxc"], "all", (False, "cluster b200-dgxc is busy")),
        (["b200-nscale", "b200-dgxc"], "any", (True, "cluster b200-nscale has capacity")),
        (["mi355x-amd"], "all", (False, "cluster mi355x-amd is not in the capacity feed")),
        (
            ["b200-dgxc", "mi355x-amd"],
            "any",
            (
                False,
                (
                    "no target cluster has capacity: cluster b200-dgxc is busy; "
                    "cluster mi355x-amd is not in the capacity feed"
                ),
            ),
        ),
        ([], "any", (False, "runner has no known target cluster")),
    ],
)
def test_target_eligibility(clusters: list[str], rule: str, expected: tuple[bool, str]) -> None:
    assert target_eligibility(clusters, READING, rule) == expected  # type: ignore[arg-type]


B200_UNRESOLVED = ("b200-cw_00", "b200-cw_01")


@pytest.mark.parametrize(
    ("clusters", "rule", "expected"),
    [
        # No cluster resolved: the runner that could not be is the whole reason.
        (
            [],
            "all",
            (False, "runner label b200 lists b200-cw_00, b200-cw_01, which name no cluster declared in runners.yaml"),
        ),
        # Some resolved: they decide, and the reason still names the runners that did not.
        (
            ["b200-nscale"],
            "all",
            (
                True,
                (
                    "cluster b200-nscale has capacity (runner label b200 lists b200-cw_00, b200-cw_01, "
                    "which name no cluster declared in runners.yaml)"
                ),
            ),
        ),
        (
            ["b200-dgxc"],
            "any",
            (
                False,
                (
                    "cluster b200-dgxc is busy; runner label b200 lists b200-cw_00, b200-cw_01, "
                    "which name no cluster declared in runners.yaml"
                ),
            ),
        ),
    ],
)
def test_target_eligibility_names_the_runners_that_resolve_to_no_cluster(
    clusters: list[str], rule: str, expected: tuple[bool, str]
) -> None:
    got = target_eligibility(clusters, READING, rule, runner="b200", unresolved=B200_UNRESOLVED)  # type: ignore[arg-type]
    assert got == expected


def test_target_eligibility_names_one_unresolved_runner_and_an_unknown_label() -> None:
    assert target_eligibility([], READING, "all", runner="b200", unresolved=["b200-cw_00"]) == (
        False,
        "runner label b200 lists b200-cw_00, which names no cluster declared in runners.yaml",
    )
    assert target_eligibility([], READING, "all", runner="z900") == (
        False,
        "runner z900 targets no cluster declared in runners.yaml",
    )
    # A configuration error is permanent: it is the reason even while the feed is down.
    closed = CapacityReading(frozenset(), frozenset(), NOW, error="http-503")
    assert target_eligibility([], closed, "any", runner="b200", unresolved=["b200-cw_00"])[1].startswith(
        "runner label b200 lists b200-cw_00"
    )


def test_target_eligibility_with_an_unusable_feed_says_why() -> None:
    closed = CapacityReading(frozenset(), frozenset(), NOW, error="http-503")
    assert target_eligibility(["b200-nscale"], closed, "any") == (
        False,
        "capacity feed unavailable (http-503): every cluster counts as busy",
    )


def test_a_node_count_that_is_missing_or_invalid_makes_the_cluster_ineligible_even_if_the_rest_add_up() -> None:
    # §4.5: allocated, mixed, idle, down and other nodes are ints >= 0 summing to total.
    # Here the others still sum to total (2 + 0 + 6 + 0 = 8), so only the count check can refuse.
    for bad in (None, -1, "0", True, 0.0):
        entry = cluster("b200-nscale")
        if bad is None:
            del entry["summary"]["downNodes"]
        else:
            entry["summary"]["downNodes"] = bad
        assert evaluate(feed(entry)).eligible == frozenset(), bad
    assert evaluate(feed(cluster("b200-nscale"))).eligible == {"b200-nscale"}


def test_a_one_node_cluster_with_its_node_idle_is_eligible() -> None:
    # idle > 0 and (0 + 0) * 5 < 1 * 4
    one = cluster("h100-one", summary={"totalNodes": 1, "allocatedNodes": 0, "idleNodes": 1})
    assert evaluate(feed(one)).eligible == {"h100-one"}


def test_no_idle_node_means_no_capacity_however_little_is_busy() -> None:
    # 2 of 8 busy is under 80 %, but idleNodes must be > 0 (the rest are down).
    down = cluster("b200-nscale", summary={"idleNodes": 0, "downNodes": 6})
    assert evaluate(feed(down)).eligible == frozenset()
    assert evaluate(feed(down)).known == {"b200-nscale"}


def test_observed_exactly_the_clock_skew_after_received_is_accepted() -> None:
    # §4.5: observedAt - receivedAt <= 5 s.
    received = NOW - timedelta(seconds=29)
    at_skew = cluster("b200-nscale", observedAt=stamp(received + timedelta(seconds=5)), receivedAt=stamp(received))
    past_skew = cluster("b200-nscale", observedAt=stamp(received + timedelta(seconds=6)), receivedAt=stamp(received))
    assert evaluate(feed(at_skew)).eligible == {"b200-nscale"}
    assert evaluate(feed(past_skew)).eligible == frozenset()


def test_received_exactly_the_clock_skew_after_generated_is_accepted() -> None:
    # §4.5: receivedAt - generatedAt <= 5 s (generatedAt is NOW in these feeds).
    at_skew = cluster("b200-nscale", observedAt=stamp(NOW + timedelta(seconds=5)), receivedAt=stamp(NOW + timedelta(seconds=5)))
    past_skew = cluster("b200-nscale", observedAt=stamp(NOW + timedelta(seconds=6)), receivedAt=stamp(NOW + timedelta(seconds=6)))
    assert evaluate(feed(at_skew)).eligible == {"b200-nscale"}
    assert evaluate(feed(past_skew)).eligible == frozenset()


def test_a_reading_is_usable_until_the_older_of_generation_and_retrieval_ages_out() -> None:
    # §4.5: both the local retrieval and generatedAt must be <= 120 s old (+5 s skew).
    generated = NOW - timedelta(seconds=60)
    assert usable_until(feed(at=generated), NOW) == generated + MAX_AGE + CLOCK_SKEW
    assert usable_until(feed(at=NOW + timedelta(seconds=3)), NOW) == NOW + MAX_AGE + CLOCK_SKEW
    assert usable_until({"kind": "x"}, NOW) == NOW + MAX_AGE + CLOCK_SKEW
    assert usable_until(["not", "a", "document"], NOW) == NOW + MAX_AGE + CLOCK_SKEW


@pytest.mark.parametrize(
    "summary",
    [
        {"idleNodes": "6"},  # a count as text
        {"downNodes": -1, "idleNodes": 7},  # a negative count
        {"idleNodes": 6.0},  # a count that is not whole
        {"otherNodes": 1},  # counts that no longer add up to the total
    ],
)
def test_a_cluster_whose_feed_entry_is_broken_is_not_called_busy(summary: dict[str, Any]) -> None:
    # A feed that keeps reporting a cluster's counts as text (or negative, or not adding up)
    # decides its families `capacity` at every wave: the reason must say the feed entry is
    # the problem, not that the cluster is busy (which only says "wait", forever).
    broken = cluster("b200-nscale")
    broken["summary"].update(summary)
    full = cluster("b200-dgxc", summary={"allocatedNodes": 8, "idleNodes": 0})
    reading = evaluate(feed(broken, full))
    assert reading.eligible == frozenset()
    broken_eligible, broken_reason = target_eligibility(["b200-nscale"], reading, "all")
    _, busy_reason = target_eligibility(["b200-dgxc"], reading, "all")
    assert busy_reason == "cluster b200-dgxc is busy"
    assert not broken_eligible
    assert "b200-nscale" in broken_reason and "invalid" in broken_reason
    assert "busy" not in broken_reason


@pytest.mark.parametrize(
    "changes",
    [
        {"stale": True},  # the feed's own reading of it is stale
        {"status": "maintenance"},  # out of service
        {"observedAt": stamp(NOW + timedelta(seconds=30))},  # observed after it was received
    ],
)
def test_a_cluster_the_feed_reports_stale_or_out_of_service_is_not_called_busy(changes: dict[str, Any]) -> None:
    # A collector that died leaves its cluster `stale: true` for good: its families waited
    # at every wave with "cluster X is busy", which sends people looking at its load.
    reading = evaluate(feed(cluster("b200-nscale", **changes), cluster("b200-dgxc", summary={"allocatedNodes": 8, "idleNodes": 0})))
    assert reading.eligible == frozenset()
    assert target_eligibility(["b200-nscale"], reading, "all") == (
        False, "cluster b200-nscale is stale or out of service in the capacity feed")
    assert target_eligibility(["b200-dgxc"], reading, "all")[1] == "cluster b200-dgxc is busy"
