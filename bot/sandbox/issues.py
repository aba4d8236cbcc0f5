"""Editing a plain issue, by a person (`edit_issue`) or by the App (`PATCH …/issues/{n}`).

One webhook per kind of change, as GitHub sends them: `edited` (with `changes` holding
the old title and body), `closed` / `reopened`, then `unlabeled` / `labeled`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.sandbox.events import Payloads
from bot.sandbox.state import Issue, RepoState
from bot.sandbox.world import Event, World


@dataclass(frozen=True)
class IssueEdit:
    """The fields to set; None leaves one as it is."""

    title: str | None = None
    body: str | None = None
    state: str | None = None
    labels: list[str] | None = None


def edit_issue(world: World, repo: RepoState, issue: Issue, edit: IssueEdit,
               sender: str) -> list[Event]:
    changes = text_changes(issue, edit)
    state_move = move_state(world, issue, edit.state)
    wanted = issue.labels if edit.labels is None else edit.labels
    removed = [name for name in issue.labels if name not in wanted]
    added = [name for name in wanted if name not in issue.labels]
    issue.labels = list(wanted)
    if changes or state_move or removed or added:
        issue.updated_at = world.now()
    if "body" in changes:
        issue.editor, issue.last_edited_at = sender, world.now()
        issue.edits.append((sender, world.now()))
    payloads = Payloads(world)
    events = []
    if changes:
        events.append(payloads.issues(repo, issue.number, "edited", sender, changes=changes))
    if state_move:
        events.append(payloads.issues(repo, issue.number, state_move, sender))
    for kind, names in (("unlabeled", removed), ("labeled", added)):
        events += [payloads.issues(repo, issue.number, kind, sender,
                                   label=payloads.shapes.label(repo, name)) for name in names]
    return events


def text_changes(issue: Issue, edit: IssueEdit) -> dict[str, Any]:
    """Set the title and body; GitHub's `changes`: what each changed field was before."""
    changes: dict[str, Any] = {}
    if edit.title is not None and edit.title != issue.title:
        changes["title"] = {"from": issue.title}
        issue.title = edit.title
    if edit.body is not None and edit.body != issue.body:
        changes["body"] = {"from": issue.body}
        issue.body = edit.body
    return changes


def move_state(world: World, issue: Issue, state: str | None) -> str | None:
    """Close or reopen; answers the webhook action, None when the state stays."""
    if state is None or state == issue.state:
        return None
    issue.state = state
    issue.closed_at = world.now() if state == "closed" else None
    return "closed" if state == "closed" else "reopened"
