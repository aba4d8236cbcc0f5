"""Prometheus metrics, one registry per process (served by GET /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

DELIVERIES = Counter(
    "klaud_deliveries_total",
    "Webhook deliveries by event and result (accepted, duplicate, rejected, done, failed, retry).",
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
