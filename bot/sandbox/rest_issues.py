"""GitHub's issue routes: issues, their comments and the comments' reactions.

Pull requests are issues too: their numbers are shared, their comments are issue comments,
and the issue side of a pull request can be read and edited here.
"""

from __future__ import annotations

from typing import Any

from bot.sandbox import actions
from bot.sandbox import scenario as sc
from bot.sandbox.events import Payloads
from bot.sandbox.gate import ApiError
from bot.sandbox.issues import IssueEdit, edit_issue
from bot.sandbox.permissions import ISSUES_READ, ISSUES_WRITE, Needs, grants
from bot.sandbox.rest import Call, Reply, parse_when, validation_failed
from bot.sandbox.shapes import BOT_LOGIN, REACTIONS
from bot.sandbox.state import IssueComment, Reaction, RepoState
from bot.sandbox.world import Event, World

# --- issues ----------------------------------------------------------------------------

ISSUE_SORTS = {"created": "created_at", "updated": "updated_at", "comments": "comments"}


def list_issues(call: Call) -> Reply:
    """Issues and pull requests alike, as GitHub lists them (pull requests carry a
    `pull_request` key), filtered by `state`, `creator`, `labels` and `since`."""
    repo = call.repo()
    state = call.query.get("state", "open")
    sort = call.query.get("sort", "created")
    if state not in ("open", "closed", "all") or sort not in ISSUE_SORTS:
        raise validation_failed("Validation Failed")
    shaped = [call.shapes.issue(repo, n) for n in sorted(set(repo.pulls) | set(repo.issues))]
    shaped = [i for i in shaped if state == "all" or i["state"] == state]
    if "creator" in call.query:
        shaped = [i for i in shaped if i["user"]["login"].lower() == call.query["creator"].lower()]
    if call.query.get("labels"):
        wanted = {name.strip() for name in call.query["labels"].split(",")}
        shaped = [i for i in shaped if wanted <= {label["name"] for label in i["labels"]}]
    if "since" in call.query:
        since = parse_when(call.query["since"])[0]
        shaped = [i for i in shaped if parse_when(i["updated_at"])[0] >= since]
    key = ISSUE_SORTS[sort]
    shaped.sort(key=lambda i: (i[key], i["number"]),
                reverse=call.query.get("direction", "desc") == "desc")
    return Reply(items=shaped)


def create_issue(call: Call) -> Reply:
    repo = call.repo()
    title, body, labels = call.field("title"), call.field("body"), call.field("labels")
    if isinstance(title, int):
        title = str(title)
    if not isinstance(title, str) or not title:
        raise validation_failed("Validation Failed", errors=[
            {"resource": "Issue", "code": "missing_field", "field": "title"}])
    if body is not None and not isinstance(body, str):
        raise validation_failed("Invalid request.\n\nFor 'properties/body', is not a string.")
    refuse_long_body(body, "Issue")
    issue = call.world.open_issue(repo, title, BOT_LOGIN)
    issue.body = body
    issue.labels = label_names(labels)
    call.announce.append(Payloads(call.world).issues(repo, issue.number, "opened", BOT_LOGIN))
    shaped = call.shapes.issue(repo, issue.number)
    return Reply(201, shaped, headers={"location": shaped["url"]})


# GitHub refuses a longer issue or comment body with 422.
BODY_MAX_CHARACTERS = 65_536


def refuse_long_body(body: Any, resource: str) -> None:
    if isinstance(body, str) and len(body) > BODY_MAX_CHARACTERS:
        raise validation_failed("Validation Failed", errors=[{
            "resource": resource, "code": "custom", "field": "body",
            "message": f"body is too long (maximum is {BODY_MAX_CHARACTERS} characters)",
        }])


def label_names(labels: Any) -> list[str]:
    """`labels` of an issue write: names, or objects with a `name`."""
    if labels is None:
        return []
    names: list[str] = []
    for label in labels if isinstance(labels, list) else [None]:
        name = label.get("name") if isinstance(label, dict) else label
        if not isinstance(name, str) or not name:
            raise validation_failed("Invalid request.\n\nFor 'properties/labels', is not an "
                                    "array of label names.")
        names.append(name)
    return list(dict.fromkeys(names))


def issue_number_or_404(call: Call, repo: RepoState, needs: Needs) -> int:
    """A pull request's number, or a plain issue's: for those the App needs `issues`
    (`pull_requests` covers only the issue side of a pull request)."""
    number = call.number("issue_number")
    if number in repo.issues:
        call.require(repo, needs)
    elif number not in repo.pulls:
        raise ApiError(404, "Not Found")
    return number


def get_issue(call: Call) -> Reply:
    repo = call.repo()
    return Reply(body=call.shapes.issue(repo, issue_number_or_404(call, repo, ISSUES_READ)))


def update_issue(call: Call) -> Reply:
    repo = call.repo()
    number = issue_number_or_404(call, repo, ISSUES_WRITE)
    edit = issue_edit(call)
    if number in repo.issues:
        call.announce += edit_issue(call.world, repo, repo.issues[number], edit, BOT_LOGIN)
    else:
        call.announce += edit_pull_as_issue(call.world, repo, number, edit)
    return Reply(body=call.shapes.issue(repo, number))


def issue_edit(call: Call) -> IssueEdit:
    title, body, state = call.field("title"), call.field("body"), call.field("state")
    if title is not None and (not isinstance(title, str) or not title):
        raise validation_failed("Invalid request.\n\nFor 'properties/title', is not a string.")
    if body is not None and not isinstance(body, str):
        raise validation_failed("Invalid request.\n\nFor 'properties/body', is not a string.")
    refuse_long_body(body, "Issue")
    if state not in (None, "open", "closed"):
        raise validation_failed("Validation Failed", errors=[
            {"resource": "Issue", "code": "invalid", "field": "state"}])
    labels = call.field("labels")
    return IssueEdit(title, body, state, None if labels is None else label_names(labels))


def edit_pull_as_issue(world: World, repo: RepoState, number: int,
                       edit: IssueEdit) -> list[Event]:
    """The issue side of a pull request: GitHub sends `pull_request` events for it."""
    pull = repo.pulls[number]
    if edit.state == "open" and pull.state == "closed":
        raise validation_failed("The sandbox cannot reopen pull requests.")
    _, events = actions.edit_pull(world, sc.EditPull(
        action="edit_pull", repo=repo.full_name, number=number, title=edit.title,
        body=edit.body, labels=edit.labels, user=BOT_LOGIN))
    if edit.state == "closed" and pull.state == "open":
        events += actions.close_pull(world, sc.ClosePull(
            action="close_pull", repo=repo.full_name, number=number, user=BOT_LOGIN))[1]
    return events


# --- issues: comments and reactions ----------------------------------------------------


def list_comments(call: Call) -> Reply:
    repo = call.repo()
    number = issue_number_or_404(call, repo, ISSUES_READ)
    comments = sorted((c for c in repo.comments.values() if c.issue_number == number),
                      key=lambda c: c.id)
    if "since" in call.query:
        since = parse_when(call.query["since"])[0]
        comments = [c for c in comments if c.updated_at >= since]
    return Reply(items=[call.shapes.comment(repo, c) for c in comments])


COMMENT_SORTS = {"created": "created_at", "updated": "updated_at"}


def list_repo_comments(call: Call) -> Reply:
    """The comments of every issue and PR of the repository: by ascending id, or by `sort`
    in `direction` (descending unless asked); `since` keeps those updated at or after it. A
    plain issue's comments are listed only to a token with the `issues` permission."""
    repo = call.repo()
    sort, direction = call.query.get("sort"), call.query.get("direction", "desc")
    if (sort is not None and sort not in COMMENT_SORTS) or direction not in ("asc", "desc"):
        raise validation_failed("Validation Failed")
    sees_issues = grants(call.world.permissions_for(call.token, repo), ISSUES_READ)
    comments = [c for c in repo.comments.values() if sees_issues or c.issue_number not in repo.issues]
    if "since" in call.query:
        since = parse_when(call.query["since"])[0]
        comments = [c for c in comments if c.updated_at >= since]
    if sort is None:
        comments.sort(key=lambda c: c.id)
    else:
        comments.sort(key=lambda c: (getattr(c, COMMENT_SORTS[sort]), c.id), reverse=direction == "desc")
    return Reply(items=[call.shapes.comment(repo, c) for c in comments])


def create_comment(call: Call) -> Reply:
    repo = call.repo()
    number = issue_number_or_404(call, repo, ISSUES_WRITE)
    body = call.field("body")
    if not isinstance(body, str) or not body:
        raise validation_failed('Invalid request.\n\n"body" wasn\'t supplied.')
    refuse_long_body(body, "IssueComment")
    comment = call.world.add_comment(repo, number, BOT_LOGIN, body, via_app=True)
    call.announce.append(Payloads(call.world).issue_comment(repo, comment))
    shaped = call.shapes.comment(repo, comment)
    return Reply(201, shaped, headers={"location": shaped["url"]})


def comment_or_404(call: Call, repo: RepoState, needs: Needs) -> IssueComment:
    """The comment; on a plain issue the App needs `issues` (`needs`), as for the issue."""
    comment = repo.comments.get(call.number("comment_id"))
    if comment is None:
        raise ApiError(404, "Not Found")
    if comment.issue_number in repo.issues:
        call.require(repo, needs)
    return comment


def get_comment(call: Call) -> Reply:
    repo = call.repo()
    return Reply(body=call.shapes.comment(repo, comment_or_404(call, repo, ISSUES_READ)))


def update_comment(call: Call) -> Reply:
    repo = call.repo()
    comment = comment_or_404(call, repo, ISSUES_WRITE)
    body = call.field("body")
    if not isinstance(body, str) or not body:
        raise validation_failed('Invalid request.\n\n"body" wasn\'t supplied.')
    refuse_long_body(body, "IssueComment")
    comment.body = body
    comment.updated_at = call.now
    return Reply(body=call.shapes.comment(repo, comment))


def create_reaction(call: Call) -> Reply:
    repo = call.repo()
    comment = comment_or_404(call, repo, ISSUES_WRITE)
    content = call.field("content")
    if content not in REACTIONS:
        raise validation_failed("Validation Failed", errors=[
            {"resource": "Reaction", "code": "custom", "field": "content",
             "message": f"content is not one of {', '.join(REACTIONS)}"}])
    existing = next((r for r in repo.comment_reactions(comment.id)
                     if r.user == BOT_LOGIN and r.content == content), None)
    if existing is not None:
        return Reply(200, call.shapes.reaction(existing))
    reaction = Reaction(call.world.ids.next("reaction"), comment.id, content, BOT_LOGIN, call.now)
    repo.reactions.append(reaction)
    return Reply(201, call.shapes.reaction(reaction))


def list_reactions(call: Call) -> Reply:
    repo = call.repo()
    comment = comment_or_404(call, repo, ISSUES_READ)
    return Reply(items=[call.shapes.reaction(r) for r in repo.comment_reactions(comment.id)])
