"""Plain-data builders shared by the unit tests."""

from __future__ import annotations

from datetime import datetime

from bot.core.domain import Attempt, Family
from bot.store.deliveries import Delivery
from bot.web.envelope import envelope_of


def family(
    key: str, image: str = "img:1", path: str = "configs/x-master.yaml", **fields: object
) -> Family:
    values: dict[str, object] = {
        "id": f"{path}:{key}",
        "path": path,
        "key": key,
        "image": image,
        "runner": "b200",
        "clusters": ("b200-nb",),
        "model_prefix": "dsr1",
        "precision": "fp4",
        "framework": "sglang",
        "line_start": 1,
        "line_end": 5,
    }
    values.update(fields)
    return Family(**values)  # type: ignore[arg-type]


def delivery(delivery_id: str, event: str, body: bytes) -> Delivery:
    """A delivery as the webhook stores it: routed by the fields its body carries."""
    envelope = envelope_of(body)
    return Delivery(delivery_id, event, body, action=envelope.action, repo=envelope.repo,
                    installation=envelope.installation)


def attempt(
    candidate: str, family: str, run_id: int, at: datetime, *, outcome: str | None = "failed",
    error: str | None = None, job: str | None = None,
) -> Attempt:
    verified = outcome is not None
    return Attempt(
        candidate, family, run_id, 1, "a" * 40, at, verified, outcome,  # type: ignore[arg-type]
        "targeted" if verified else None, None, None, error,
        failed_job=job, failed_step="run" if job else None,
    )


def run_failed(candidate: str, family: str, run_id: int, at: datetime) -> Attempt:
    return attempt(candidate, family, run_id, at, outcome=None, error="run-failed", job="benchmark")
