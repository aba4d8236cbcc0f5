"""Cluster capacity gate (domain §4.5, DESIGN §4 "Clusters").

Klaud fails closed: a missing, unreachable or malformed feed makes every cluster count as
busy, and each capacity decision says why. The feed's numbers are private, so nothing here
logs or returns them; a reading only says which clusters are known and which may take work.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from bot.core.domain import CapacityReading, parse_time

FEED_KIND = "inferencex.status.clusters"
MAX_AGE = timedelta(seconds=120)
CLOCK_SKEW = timedelta(seconds=5)
USABLE_STATUSES = frozenset({"operational", "degraded"})
NODE_COUNTS = ("allocatedNodes", "mixedNodes", "idleNodes", "downNodes", "otherNodes")


class FeedUnusable(Exception):
    """The feed cannot be used at all; `code` is the short reason shown to people."""

    def __init__(self, code: str, *, retryable: bool = False) -> None:
        super().__init__(code)
        self.code = code
        self.retryable = retryable


def evaluate_feed(document: Any, *, now: datetime, retrieved_at: datetime) -> CapacityReading:
    """Apply the payload and per-cluster gates of domain §4.5 to a parsed feed document."""
    try:
        generated_at, clusters = _usable_clusters(document, now=now, retrieved_at=retrieved_at)
    except FeedUnusable as problem:
        return closed_reading(retrieved_at, problem.code)
    invalid = frozenset(c["id"] for c in clusters if not _well_formed(c))
    formed = [c for c in clusters if c["id"] not in invalid]
    unavailable = frozenset(c["id"] for c in formed if not _in_service(c, generated_at))
    return CapacityReading(
        eligible=frozenset(c["id"] for c in formed if c["id"] not in unavailable and _has_capacity(c)),
        known=frozenset(c["id"] for c in clusters),
        at=retrieved_at,
        invalid=invalid,
        unavailable=unavailable,
    )


def usable_until(document: Any, retrieved_at: datetime) -> datetime:
    """The last moment a reading of `document` may be used: its own age limit (from
    `generatedAt`, when it has one) and the retrieval's, whichever comes first."""
    generated_at = _time(document.get("generatedAt")) if isinstance(document, dict) else None
    oldest = retrieved_at if generated_at is None else min(generated_at, retrieved_at)
    return oldest + MAX_AGE + CLOCK_SKEW


def closed_reading(at: datetime, error: str) -> CapacityReading:
    """A reading in which no cluster may take work, with the reason why."""
    return CapacityReading(eligible=frozenset(), known=frozenset(), at=at, error=error)


def _usable_clusters(
    document: Any, *, now: datetime, retrieved_at: datetime
) -> tuple[datetime, list[dict[str, Any]]]:
    if not _fresh(retrieved_at, now):
        raise FeedUnusable("stale-retrieval")
    if not isinstance(document, dict):
        raise FeedUnusable("invalid-response")
    if document.get("kind") != FEED_KIND:
        raise FeedUnusable("invalid-kind")
    generated_at = _time(document.get("generatedAt"))
    if generated_at is None:
        raise FeedUnusable("invalid-generated-at")
    if not _fresh(generated_at, now):
        raise FeedUnusable("stale-feed")
    data = document.get("data")
    if not isinstance(data, dict):
        raise FeedUnusable("invalid-response")
    if data.get("available") is not True:
        raise FeedUnusable("feed-unavailable")
    clusters = data.get("clusters")
    if not isinstance(clusters, list) or not all(isinstance(c, dict) for c in clusters):
        raise FeedUnusable("invalid-response")
    ids = [c.get("id") for c in clusters]
    if not all(isinstance(i, str) and i for i in ids) or len(set(ids)) != len(ids):
        raise FeedUnusable("invalid-cluster-ids")
    return generated_at, clusters


def _fresh(moment: datetime, now: datetime) -> bool:
    age = now - moment
    return -CLOCK_SKEW <= age <= MAX_AGE + CLOCK_SKEW


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


def _well_formed(cluster: dict[str, Any]) -> bool:
    """Whether a cluster's entry has the shape of domain §4.5: a malformed one is never
    eligible, and its families are told the feed entry is at fault, not that it is busy."""
    # Checked as text first: a list or an object is not a status (and not hashable).
    if not isinstance(cluster.get("stale"), bool) or not isinstance(cluster.get("status"), str):
        return False
    if _time(cluster.get("observedAt")) is None or _time(cluster.get("receivedAt")) is None:
        return False
    summary = cluster.get("summary")
    if not isinstance(summary, dict):
        return False
    total = _node_count(summary.get("totalNodes"))
    counts = [_node_count(summary.get(name)) for name in NODE_COUNTS]
    if total is None or total <= 0 or any(c is None for c in counts):
        return False
    return sum(c or 0 for c in counts) == total


def _in_service(cluster: dict[str, Any], generated_at: datetime) -> bool:
    """Whether a well-formed cluster entry is fresh and its cluster in service."""
    if cluster["stale"] is not False or cluster["status"] not in USABLE_STATUSES:
        return False
    observed_at = _time(cluster["observedAt"])
    received_at = _time(cluster["receivedAt"])
    if observed_at is None or received_at is None:
        return False
    return observed_at - received_at <= CLOCK_SKEW and received_at - generated_at <= CLOCK_SKEW


def _has_capacity(cluster: dict[str, Any]) -> bool:
    """Whether a well-formed cluster entry in service has room for work now."""
    summary = cluster["summary"]
    total: int = summary["totalNodes"]
    busy: int = summary["allocatedNodes"] + summary["mixedNodes"]
    idle: int = summary["idleNodes"]
    # Strictly below 80 % busy, in integers so no rounding can let a full cluster through.
    return idle > 0 and busy * 5 < total * 4


def _node_count(value: Any) -> int | None:
    """`value` as a node count, or None when it is not one."""
    # JSON true would pass an isinstance(int) check; a node count is never a boolean.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def target_eligibility(
    clusters: Sequence[str],
    reading: CapacityReading,
    rule: Literal["all", "any"],
    *,
    runner: str | None = None,
    unresolved: Sequence[str] = (),
) -> tuple[bool, str]:
    """Whether a family's target clusters may take work under `rule`, with a reason for people.

    `runner` and `unresolved` are the family's runner label and the runner names under it
    that name no declared cluster (`Family.unresolved`): a configuration error the reason
    names. Only the resolved clusters decide; with none, the family waits on nothing the
    feed could ever report, so the configuration error is the whole reason.
    """
    config_error = _unresolved_reason(runner, unresolved)
    if not clusters:
        if config_error is not None:
            return False, config_error
        if runner is not None:
            return False, f"runner {runner} targets no cluster declared in runners.yaml"
        return False, "runner has no known target cluster"
    eligible, reason = _clusters_eligibility(clusters, reading, rule)
    if config_error is not None:
        reason = f"{reason} ({config_error})" if eligible else f"{reason}; {config_error}"
    return eligible, reason


def _unresolved_reason(runner: str | None, unresolved: Sequence[str]) -> str | None:
    if not unresolved:
        return None
    if runner is not None and tuple(unresolved) == (runner,):
        return f"runner {runner} names a cluster runners.yaml does not declare"
    names = ", ".join(unresolved)
    verb = "names" if len(unresolved) == 1 else "name"
    label = f"runner label {runner}" if runner else "its runner label"
    return f"{label} lists {names}, which {verb} no cluster declared in runners.yaml"


def _clusters_eligibility(
    clusters: Sequence[str], reading: CapacityReading, rule: Literal["all", "any"]
) -> tuple[bool, str]:
    if reading.error is not None:
        return False, f"capacity feed unavailable ({reading.error}): every cluster counts as busy"
    free = [c for c in clusters if c in reading.eligible]
    blocked = [_why_blocked(c, reading) for c in clusters if c not in reading.eligible]
    if rule == "all" and not blocked:
        return True, f"{_cluster_list(free)} {'has' if len(free) == 1 else 'have'} capacity"
    if rule == "any" and free:
        return True, f"{_cluster_list(free)} {'has' if len(free) == 1 else 'have'} capacity"
    if rule == "any" and len(clusters) > 1:
        return False, "no target cluster has capacity: " + "; ".join(blocked)
    return False, "; ".join(blocked)


def _why_blocked(cluster: str, reading: CapacityReading) -> str:
    if cluster in reading.invalid:
        return f"cluster {cluster} has an invalid entry in the capacity feed"
    if cluster in reading.unavailable:
        return f"cluster {cluster} is stale or out of service in the capacity feed"
    if cluster in reading.known:
        return f"cluster {cluster} is busy"
    return f"cluster {cluster} is not in the capacity feed"


def _cluster_list(clusters: Sequence[str]) -> str:
    return ("cluster " if len(clusters) == 1 else "clusters ") + ", ".join(clusters)
