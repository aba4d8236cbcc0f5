"""Prometheus metrics, one registry per process (served by GET /metrics on the admin listener).

Label values must come from bounded sets (event names through `bot.web.events.event_label`,
route templates, repositories Klaud has state for): a value taken from an unauthenticated
request would let anyone grow /metrics without limit.
"""

from __future__ import annotations

import bisect
import contextlib
import math
from collections.abc import Iterable, Iterator, Mapping
from importlib import metadata
from typing import TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)

# Memory, CPU, open files and start time of this process; Python's version and build.
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)


def klaud_version() -> str:
    try:
        return metadata.version("klaud")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


BUILD_INFO = Gauge(
    "klaud_build_info",
    "The running Klaud's version (always 1; the version is the label).",
    ["version"],
    registry=REGISTRY,
)
BUILD_INFO.labels(klaud_version()).set(1)

DELIVERIES = Counter(
    "klaud_deliveries_total",
    "Webhook deliveries by event and result (accepted, duplicate, rejected, done, failed, retry, moved).",
    ["event", "result"],
    registry=REGISTRY,
)
INBOX_BACKLOG = Gauge(
    "klaud_inbox_backlog",
    "Deliveries acknowledged but not yet done or failed.",
    registry=REGISTRY,
)
PROCESSING_SECONDS = Histogram(
    "klaud_delivery_processing_seconds",
    "Time spent processing one delivery through the handlers.",
    ["event"],
    registry=REGISTRY,
)
GITHUB_REQUESTS = Counter(
    "klaud_github_requests_total",
    "GitHub API requests by method, route template and status.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
GITHUB_RATE_LIMIT_REMAINING = Gauge(
    "klaud_github_rate_limit_remaining",
    "x-ratelimit-remaining of the latest GitHub response, per installation.",
    ["installation"],
    registry=REGISTRY,
)
WAVE_SECONDS = Histogram(
    "klaud_wave_seconds",
    "Duration of one planning wave (planning and dispatch).",
    registry=REGISTRY,
)
CANDIDATES = Counter(
    "klaud_candidates_total",
    "Candidates decided by planning waves, by decision.",
    ["decision"],
    registry=REGISTRY,
)
LAST_WAVE_CANDIDATES = Gauge(
    "klaud_last_wave_candidates",
    "Families of the repository's last planning wave, by decision (every decision kind, 0 when none).",
    ["repo", "decision"],
    registry=REGISTRY,
)
LAST_WAVE_TIMESTAMP = Gauge(
    "klaud_last_wave_timestamp_seconds",
    "Unix time at which the repository's last planning wave finished.",
    ["repo"],
    registry=REGISTRY,
)
DISPATCH_PAUSED = Gauge(
    "klaud_dispatch_paused",
    "1 while the repository's dispatch is paused, blocked by a setup error or turned off by its policy, else 0.",
    ["repo"],
    registry=REGISTRY,
)


class ImageAges(Collector):
    """`klaud_family_image_age_days`: per repository, a histogram of its families' image ages.

    Computed at each scrape as of the last wave, so it shows the current spread (p50 and
    p90 with `histogram_quantile`) in a dozen series per repository, however many families
    there are.
    """

    BUCKETS = (1.0, 3.0, 7.0, 14.0, 30.0, 60.0, 90.0, 180.0, 365.0)
    DAY = 86400.0

    def __init__(self) -> None:
        self._changes: dict[str, tuple[list[float], float]] = {}

    def set(self, repo: str, changed: list[float], at: float) -> None:
        """`changed`: when each family's image last changed (epoch seconds, ascending);
        `at`: the wave's time, which the ages are counted to."""
        self._changes[repo] = (changed, at)

    def forget(self, repo: str) -> None:
        self._changes.pop(repo, None)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "klaud_family_image_age_days",
            "Days since each family's image line last changed on the default branch (families of known age).",
            labels=["repo"],
        )
        for repo, (changed, at) in sorted(self._changes.items()):
            # At most `le` days old: changed at or after `at - le` days.
            buckets = [(str(le), len(changed) - bisect.bisect_left(changed, at - le * self.DAY)) for le in self.BUCKETS]
            ages = (len(changed) * at - math.fsum(changed)) / self.DAY
            family.add_metric([repo], [*buckets, ("+Inf", len(changed))], sum_value=ages)
        yield family


FAMILY_IMAGE_AGES = ImageAges()
REGISTRY.register(FAMILY_IMAGE_AGES)

REPO_GAUGES = (LAST_WAVE_TIMESTAMP, DISPATCH_PAUSED)
Kind = TypeVar("Kind", bound=str)  # a decision kind


def show_wave(repo: str, at: float, counts: Mapping[Kind, int], kinds: Iterable[Kind], image_times: list[float]) -> None:
    """What /metrics shows of a repository's last wave (finished at `at`): its decisions of
    every kind, zeros included (a decision that disappears reads 0, not its old count),
    and its families' image ages then (`image_times`: when each image last changed)."""
    LAST_WAVE_TIMESTAMP.labels(repo).set(at)
    for kind in kinds:
        LAST_WAVE_CANDIDATES.labels(repo, kind).set(counts.get(kind, 0))
    FAMILY_IMAGE_AGES.set(repo, image_times, at)


def forget_repo(repo: str, decisions: Iterable[str]) -> None:
    """Remove the repository's series (`decisions`: every decision kind): it is uninstalled,
    renamed or kept by another replica now, and its last values would otherwise be exported
    for as long as the process runs."""
    for gauge in REPO_GAUGES:
        with contextlib.suppress(KeyError):
            gauge.remove(repo)
    for decision in decisions:
        with contextlib.suppress(KeyError):
            LAST_WAVE_CANDIDATES.remove(repo, decision)
    FAMILY_IMAGE_AGES.forget(repo)
