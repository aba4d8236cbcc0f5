"""Keeps each repository's dashboard issue current, and acts on its ticked boxes.

After each wave the dashboard is marked; a coalescer turns a burst of marks into one render,
and a render identical to the issue's body is not sent. A box ticked by a person with write
permission acts like the command (`retry`, `unhold`) and is answered by the re-render. The
issue's marker lets a full reconcile restore holds and pending retries when the store is lost.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import structlog

from bot.core.clock import Clock
from bot.core.dashboard import (
    TITLE,
    BoxVerb,
    DashboardView,
    Remembered,
    parse_marker,
    render_dashboard,
    ticked,
)
from bot.core.domain import Wave, parse_time, stamp
from bot.core.events import EditedIssue, IssuesEvent
from bot.github.errors import GitHubError, NotFound
from bot.services import controls
from bot.services.api import RepoAPI
from bot.services.coalescer import Coalescer
from bot.services.keyed_locks import KeyedLocks
from bot.services.live import GoneRepository, LiveState
from bot.services.permissions import Permissions
from bot.services.repo_state import RepoState
from bot.store.change import Change
from bot.store.errors import StoreError

log = structlog.get_logger("klaud.dashboard")


class DashboardKeeper:
    def __init__(self, live: LiveState, permissions: Permissions, clock: Clock, *, delay_seconds: float = 3.0) -> None:
        self.live = live
        self.permissions = permissions
        self.clock = clock
        # As the check runs': GitHub's and the store's errors wait for the next change, and a
        # repository gone meanwhile is rendered by its new owner (finding the issue by its title).
        self.coalescer: Coalescer[str] = Coalescer(
            self.publish, delay_seconds, errors=(GitHubError, StoreError, GoneRepository)
        )
        self._last_wave: dict[str, Wave] = {}
        live.gone_listeners.append(self._gone)
        # One publish of a repository's dashboard at a time: the answer to a ticked box
        # (forced) was overwritten by a wave's render made before it, still reading GitHub.
        self._publishing: KeyedLocks[str] = KeyedLocks()

    def _gone(self, repo: str) -> None:
        self._last_wave.pop(repo.lower(), None)

    async def wave_done(self, state: RepoState, wave: Wave) -> None:
        self._last_wave[state.name.lower()] = wave
        if state.policy.dashboard:
            self.coalescer.mark(state.name)

    def repository_taken(self, state: RepoState) -> None:
        """This replica took the repository over: the render its last owner had pending after
        a wave left with it, so the last stored wave is rendered again (unchanged, nothing
        is sent)."""
        if state.policy.dashboard and state.meta.wave:
            self.coalescer.mark(state.name)

    def publishing(self, repo: str) -> bool:
        return any(name.lower() == repo for name in self.coalescer.running)

    async def settle(self) -> None:
        await self.coalescer.settle()

    async def close(self, grace: float | None = None) -> None:
        await self.coalescer.close(grace)

    # -- rendering -----------------------------------------------------------------------

    async def publish(self, repo: str, *, force: bool = False) -> None:
        async with self._publishing.hold(repo.lower()):
            await self._publish(repo, force=force)

    async def _publish(self, repo: str, *, force: bool) -> None:
        state = self.live.repo(repo)
        if state is None or not state.policy.dashboard:
            return
        body = render_dashboard(await self._view(state))
        digest = hashlib.sha256(body.encode()).hexdigest()
        known = state.meta.dashboard
        if not force and known.get("digest") == digest:
            return
        api = self.live.api(state)
        # (A forced render answers ticks just taken from their webhook.)
        if not force and known.get("issue") is not None and await self._lost_ticks(state, api, int(known["issue"])):
            body = render_dashboard(await self._view(state))
            digest = hashlib.sha256(body.encode()).hexdigest()
        number = await self._updated(api, known.get("issue"), body)
        if number is None:
            number = await api.create_issue(TITLE, body)
            if number is None:
                return  # a dry run: the write was logged, there is no issue to remember
            log.info("dashboard.created", repo=state.name, issue=number)
        async with self.live.lock(state.name):
            state.meta.dashboard = {"issue": int(number), "digest": digest, "rendered_at": stamp(self.clock.now())}
            await self.live.persist(state.save_meta())

    async def _view(self, state: RepoState) -> DashboardView:
        wave = self._last_wave.get(state.name.lower()) or await self._stored_wave(state)
        cooling = []
        if wave is not None:
            for decision in wave.decisions:
                family = state.catalog.get(decision.family)
                if decision.decision == "cooldown" and family is not None:
                    cooling.append((family, decision.reason, decision.until))
        return DashboardView(
            repo=state.name,
            wave=wave,
            blocked=state.blocked_now(self.clock.now()),
            cooling=cooling,
            holds=list(state.holds.values()),
            retries=list(state.retries.values()),
            families=list(state.catalog),
            config_errors=state.meta.config_errors,
            now=self.clock.now(),
        )

    async def _stored_wave(self, state: RepoState) -> Wave | None:
        return await self.live.stored_wave(state.name, state.meta.wave)

    async def _updated(self, api: RepoAPI, known: int | None, body: str) -> int | None:
        """The dashboard issue, now showing `body` (and open, if a person closed it); None
        when there is none to update. One deleted or transferred (404) is looked for anew."""
        if known is not None:
            try:
                await api.update_issue(int(known), body)
                return int(known)
            except NotFound:
                log.info("dashboard.gone", issue=known)
        found = await self._find(api)
        if found is not None:
            await api.update_issue(found, body)
        return found

    async def _find(self, api: RepoAPI) -> int | None:
        for login in self.app_logins():
            issue = await api.find_issue(TITLE, login)
            if issue is not None:
                return issue.number
        return None

    def app_logins(self) -> list[str]:
        """The logins an App's issues are created by (`<slug>[bot]`)."""
        return [login for login in self.live.bot_logins if login.endswith("[bot]")]

    # -- ticked boxes --------------------------------------------------------------------

    async def on_issue_edited(self, state: RepoState, event: IssuesEvent) -> int:
        """Act on the boxes a person ticked; returns how many acted."""
        if event.issue.number != state.meta.dashboard.get("issue") or self.live.is_bot(event.sender.login):
            return 0
        # Every box ticked now, not only those this edit ticked: Klaud renders them all
        # unticked, so one ticked before is an edit whose webhook was lost, not acted on yet
        # (the re-render below would untick it unseen). That one is as old as the render it
        # was ticked on; this edit's own are fresh words, as a command written now.
        # GitHub sends `changes.body` only when the body changed: an edit of the title alone
        # ticked nothing, and every box ticked in the body is an earlier edit's.
        changed = event.changes.body if event.changes else None
        before = (changed.before if changed else event.issue.body) or ""
        fresh = ticked(before, event.issue.body or "")
        carried = [box for box in ticked("", event.issue.body or "") if box not in fresh]
        if not fresh and not carried:
            return 0
        api, person = self.live.api(state), event.sender.login or ""
        # On time: as the command written now (a hold renewed since the render, which the
        # box still shows held, is released as `/klaud unhold` now would).
        acted = await self._act_on(state, api, fresh, person, None)
        if carried:
            # Ticked by whoever edited since the render, not necessarily this editor.
            acted += await self._act_late(state, api, carried, person, await api.edited_issue(event.issue.number))
        # The answer is the re-render: the box unticked, the hold gone or the retry noted.
        await self.publish(state.name, force=True)
        return acted

    async def _lost_ticks(self, state: RepoState, api: RepoAPI, number: int) -> int:
        """Act on boxes ticked on GitHub whose `issues` webhook never came, before a render
        unticks them unseen: Klaud renders every box unticked, so one ticked is a person's
        (its last editor's) not taken yet. One its webhook brings later acts again, the same."""
        edited = await api.edited_issue(number)
        if edited is None or edited.editor is None or not edited.editor.login or self.live.is_bot(edited.editor.login):
            return 0
        boxes = ticked("", edited.body)
        if not boxes:
            return 0
        log.info("dashboard.lost_ticks", repo=state.name, issue=number, boxes=len(boxes), by=edited.editor.login)
        return await self._act_late(state, api, boxes, edited.editor.login, edited)

    async def _act_late(
        self, state: RepoState, api: RepoAPI, boxes: list[tuple[BoxVerb, str]], person: str, edited: EditedIssue | None
    ) -> int:
        """Act on boxes ticked since the last render by someone: GitHub says who edited the
        issue, not who ticked which box, so they act (as `person`, the last editor) only when
        every person who edited it since the render may do what they ask. A reader's tick,
        its webhook lost, once acted as the writer's who edited after it."""
        rendered_at = self._rendered_at(state)
        editors = edited.editors_since(rendered_at) if edited is not None else None
        if editors is None:
            log.info("dashboard.late_boxes_refused", repo=state.name, boxes=len(boxes), why="editors unknown")
            return 0
        people = [login for login in editors if not self.live.is_bot(login)]
        if not people:
            # Nobody edited since the last render: these boxes were ticked before it, and it
            # looked at them then (`_lost_ticks`). Acted as this editor's now, a reader's
            # tick carried by a writer's late webhook acted as the writer's.
            log.info("dashboard.late_boxes_refused", repo=state.name, boxes=len(boxes), why="ticked before the render")
            return 0
        allowed = []
        for verb, family in boxes:
            if all([await self.permissions.allows(api, state, login, verb) for login in people]):
                allowed.append((verb, family))
            else:
                log.info("dashboard.box_refused", family=family, verb=verb, editors=people)
        return await self._act_on(state, api, allowed, person, rendered_at)

    @staticmethod
    def _rendered_at(state: RepoState) -> datetime | None:
        return parse_time(state.meta.dashboard.get("rendered_at"))

    async def _act_on(
        self, state: RepoState, api: RepoAPI, boxes: list[tuple[BoxVerb, str]], person: str, asked_at: datetime | None
    ) -> int:
        """Do what `person`'s ticked boxes ask, as far as they may; how many acted. A box
        ticked on a render at `asked_at` (one found late, or carried by a later edit) is about
        what that render showed: it releases no hold placed, and clears no cooldown begun,
        after it; a fresh one (None) acts as a command written now."""
        acted = 0
        for verb, family_id in boxes:
            family = state.catalog.get(family_id)
            # A hold outlives its family leaving the configs: its box still releases it.
            known = family is not None or (verb == "unhold" and family_id in state.holds)
            if not known or not await self.permissions.allows(api, state, person, verb):
                log.info("dashboard.box_refused", family=family_id, verb=verb, by=person)
                continue
            if verb == "retry" and family is not None:
                await controls.approve_retry(self.live, state, family, person, self.clock.now(), asked_at=asked_at)
            elif not controls.held_after(state, family_id, asked_at):
                await controls.release(self.live, state, family_id, asked_at or self.clock.now())
            acted += 1
        return acted

    # -- restoring -----------------------------------------------------------------------

    async def restore(self, state: RepoState, api: RepoAPI, change: Change) -> Remembered | None:
        """A repository first heard of: its holds and retries come back from the dashboard."""
        if not state.policy.dashboard:
            return None
        for login in self.app_logins():
            issue = await api.find_issue(TITLE, login)
            if issue is None:
                continue
            remembered = parse_marker(issue.body or "")
            state.meta.dashboard = {"issue": issue.number}
            if remembered is None:
                return None
            for hold in remembered.holds:
                if hold.family in state.catalog and hold.family not in state.holds:
                    change.extend(state.hold(hold))
            for retry in remembered.retries:
                # Only a current candidate's: an approval of an image since replaced clears nothing.
                family = state.family_by_hash(retry.candidate[:16])
                if retry.candidate not in state.retries and family is not None and family.candidate == retry.candidate:
                    change.extend(state.approve_retry(retry))
            log.info("dashboard.restored", repo=state.name, holds=len(remembered.holds), retries=len(remembered.retries))
            return remembered
        return None
