"""What every handler is given besides the event: the services it may call.

A Protocol, so handlers depend on what they use rather than on the composition root
(`bot.app` builds the object that satisfies it; tests may pass their own).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import msgspec
from gidgethub import sansio
from pydantic import BaseModel, ValidationError

from bot.services.catalog_sync import CatalogSync
from bot.services.checkruns import CheckPublisher
from bot.services.dashboard import DashboardKeeper
from bot.services.outcomes import OutcomeRecorder
from bot.services.pulls import PullSync
from bot.services.reconcile import Reconciler
from bot.services.responder import CommandResponder
from bot.services.waves import WaveRunner

M = TypeVar("M", bound=BaseModel)


class WebhookEvent(sansio.Event):
    """A stored delivery as its handlers get it.

    It is routed by event and `action`, which the ack stored, so `data` holds only the
    action; the handler parses the body once, straight from its bytes into the typed model
    it reads (pydantic builds no Python object for the fields the model leaves out).
    """

    def __init__(self, body: bytes, *, event: str, delivery_id: str, action: str | None) -> None:
        super().__init__({} if action is None else {"action": action}, event=event, delivery_id=delivery_id)
        self.body = body

    def parsed(self, model: type[M]) -> M:
        """The body as `model`; pydantic's ValidationError (permanent) when it is not one."""
        try:
            return model.model_validate_json(self.body)
        except ValidationError as exc:
            if not _nested_deeper_than_pydantic_reads(exc):
                raise
        # The ack accepted the body (msgspec reads ~1,000 levels, pydantic's parser 200), and a
        # repository_dispatch's client_payload nests as deep as its sender likes: read it the
        # slower way, through Python objects.
        return model.model_validate(msgspec.json.decode(self.body))


def _nested_deeper_than_pydantic_reads(exc: ValidationError) -> bool:
    first = exc.errors()[0]
    return first["type"] == "json_invalid" and "recursion limit" in first["msg"]


class HandlerContext(Protocol):
    @property
    def repos(self) -> Reconciler: ...

    @property
    def catalog(self) -> CatalogSync: ...

    @property
    def pulls(self) -> PullSync: ...

    @property
    def outcomes(self) -> OutcomeRecorder: ...

    @property
    def commands(self) -> CommandResponder: ...

    @property
    def checks(self) -> CheckPublisher: ...

    @property
    def waves(self) -> WaveRunner: ...

    @property
    def dashboard(self) -> DashboardKeeper: ...

    def is_bot(self, login: str | None) -> bool: ...
