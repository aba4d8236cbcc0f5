"""What every handler is given besides the event: the services it may call.

A Protocol, so handlers depend on what they use rather than on the composition root
(`bot.app` builds the object that satisfies it; tests may pass their own).
"""

from __future__ import annotations

from typing import Protocol

from bot.services.catalog_sync import CatalogSync
from bot.services.checkruns import CheckPublisher
from bot.services.dashboard import DashboardKeeper
from bot.services.outcomes import OutcomeRecorder
from bot.services.pulls import PullSync
from bot.services.reconcile import Reconciler
from bot.services.responder import CommandResponder
from bot.services.waves import WaveRunner


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
