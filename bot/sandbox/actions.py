"""Control actions (DESIGN §5): change the state, say which webhooks GitHub would send.

`apply` is synchronous and does no I/O; the sandbox delivers the returned events.
"""

from __future__ import annotations

from typing import Any

from bot.sandbox import installations, issues
from bot.sandbox import scenario as sc
from bot.sandbox.events import Payloads
from bot.sandbox.issues import IssueEdit
from bot.sandbox.shapes import ts
from bot.sandbox.state import PullRequest, RepoState, SandboxError, apply_files
from bot.sandbox.world import Event, Outcome, World


def apply(world: World, action: sc.Action) -> Outcome:
    handler = HANDLERS[type(action)]
    return handler(world, action)


def _pull(repo: RepoState, number: int) -> PullRequest:
    pull = repo.pulls.get(number)
    if pull is None:
        raise SandboxError(f"{repo.full_name} has no pull request #{number}", 404)
    return pull


def open_pull(world: World, action: sc.OpenPull) -> Outcome:
    repo = world.repo(action.repo)
    spec = action.pull
    if spec.created_at is None:
        spec = spec.model_copy(update={"created_at": world.now()})
    pull = repo.add_pull(spec, world.now())
    event = Payloads(world).pull_request(repo, pull, "opened", pull.user)
    return {"number": pull.number, "head_sha": pull.head_sha}, [event]


def push_pull(world: World, action: sc.PushPull) -> Outcome:
    repo = world.repo(action.repo)
    pull = _pull(repo, action.number)
    before = repo.push_pull(pull, action.files, action.head_sha, world.now())
    event = Payloads(world).pull_request(
        repo, pull, "synchronize", pull.user, before=before, after=pull.head_sha
    )
    return {"number": pull.number, "head_sha": pull.head_sha}, [event]


def edit_pull(world: World, action: sc.EditPull) -> Outcome:
    """One event per kind of change, as GitHub sends them (edited, draft moves, labels)."""
    repo = world.repo(action.repo)
    pull = _pull(repo, action.number)
    changes: dict[str, Any] = {}
    # The base first: GitHub refuses the whole edit (422) when it refuses the new base, and
    # changes nothing else of the pull request.
    if action.base is not None and action.base != pull.base_ref:
        old_ref, old_sha = pull.base_ref, pull.base_sha
        repo.retarget(pull, action.base)
        changes["base"] = {"ref": {"from": old_ref}, "sha": {"from": old_sha}}
    if action.title is not None and action.title != pull.title:
        changes["title"] = {"from": pull.title}
        pull.title = action.title
    if action.body is not None and action.body != pull.body:
        changes["body"] = {"from": pull.body}
        pull.body = action.body
    draft_move = None
    if action.draft is not None and action.draft != pull.draft:
        pull.draft = action.draft
        draft_move = "converted_to_draft" if action.draft else "ready_for_review"
    wanted = pull.labels if action.labels is None else action.labels
    removed = [name for name in pull.labels if name not in wanted]
    added = [name for name in wanted if name not in pull.labels]
    pull.labels = list(wanted)
    if changes or draft_move or removed or added:
        pull.updated_at = world.now()

    sender = action.user or pull.user
    payloads = Payloads(world)
    events: list[Event] = []
    if changes:
        events.append(payloads.pull_request(repo, pull, "edited", sender, changes=changes))
    if draft_move:
        events.append(payloads.pull_request(repo, pull, draft_move, sender))
    for kind, names in (("unlabeled", removed), ("labeled", added)):
        events += [payloads.pull_request(repo, pull, kind, sender,
                                         label=payloads.shapes.label(repo, name))
                   for name in names]
    return {"number": pull.number}, events


def close_pull(world: World, action: sc.ClosePull) -> Outcome:
    repo = world.repo(action.repo)
    pull = _pull(repo, action.number)
    if pull.state != "open":
        raise SandboxError(f"{repo.full_name}#{pull.number} is already closed", 409)
    now = world.now()
    sender = action.user or (repo.first_admin() if action.merged else pull.user)
    merge = repo.merge_pull(pull, sender, now) if action.merged else None
    pull.state = "closed"
    pull.closed_at = pull.updated_at = now
    payloads = Payloads(world)
    events = [payloads.pull_request(repo, pull, "closed", sender)]
    answer: dict[str, Any] = {"number": pull.number, "merged": pull.merged}
    if merge is not None:
        before, after = merge
        events.append(payloads.push(repo, before, after, sender))
        answer["merge_commit_sha"] = after.sha
    return answer, events


def comment(world: World, action: sc.AddComment) -> Outcome:
    repo = world.repo(action.repo)
    made = world.add_comment(repo, action.number, action.user, action.body, via_app=False)
    return {"comment_id": made.id}, [Payloads(world).issue_comment(repo, made)]


def edit_issue(world: World, action: sc.EditIssue) -> Outcome:
    repo = world.repo(action.repo)
    issue = repo.issues.get(action.number)
    if issue is None:
        kind = "a pull request (use edit_pull)" if action.number in repo.pulls else "no issue"
        raise SandboxError(f"{repo.full_name}#{action.number} is {kind}", 404)
    edit = IssueEdit(title=action.title, body=action.body)
    return {"number": issue.number}, issues.edit_issue(world, repo, issue, edit, action.user)


def rerequest_check(world: World, action: sc.RerequestCheck) -> Outcome:
    """Someone clicks "Re-run" on one check run; GitHub asks its App to run it again."""
    repo = world.repo(action.repo)
    check = repo.check_runs.get(action.check_run_id)
    if check is None:
        raise SandboxError(f"{repo.full_name} has no check run {action.check_run_id}", 404)
    event = Payloads(world).check_run(repo, check, "rerequested", action.user)
    return {"check_run_id": check.id}, [event]


def rerequest_suite(world: World, action: sc.RerequestSuite) -> Outcome:
    """Someone clicks "Re-run all checks" on a commit with the App's check runs."""
    repo = world.repo(action.repo)
    checks = [c for c in repo.check_runs.values() if c.head_sha == action.head_sha]
    if not checks:
        raise SandboxError(f"{repo.full_name} has no check suite on {action.head_sha}", 404)
    event = Payloads(world).check_suite(repo, checks, "rerequested", action.user)
    return {"check_suite_id": checks[0].check_suite_id}, [event]


def complete_run(world: World, action: sc.CompleteRun) -> Outcome:
    repo = world.repo(action.repo)
    run = repo.complete_run(action.run, world.now())
    return {"run_id": run.id}, [Payloads(world).workflow_run(repo, run, "completed")]


def start_run(world: World, action: sc.StartRun) -> Outcome:
    repo = world.repo(action.repo)
    run = repo.start_run(action.run.id, world.now())
    return {"run_id": run.id}, [Payloads(world).workflow_run(repo, run, "in_progress")]


def push_default(world: World, action: sc.PushDefault) -> Outcome:
    repo = world.repo(action.repo)
    if action.onto is not None and action.onto not in repo.commits:
        raise SandboxError(f"{repo.full_name} has no commit {action.onto}", 404)
    base = repo.commits[action.onto] if action.onto is not None else repo.head
    tree = apply_files(base.tree, action.files)
    author = action.user or repo.first_admin()
    message = action.message or "Update " + ", ".join(sorted(action.files))
    before, after = repo.advance_default(tree, message, author, world.now(), onto=action.onto)
    return {"sha": after.sha, "before": before.sha}, [
        Payloads(world).push(repo, before, after, author)
    ]


def repository_dispatch(world: World, action: sc.RepositoryDispatch) -> Outcome:
    repo = world.repo(action.repo)
    sender = action.user or repo.first_admin()
    event = Payloads(world).repository_dispatch(
        repo, action.event_type, action.client_payload, sender
    )
    return {}, [event]


def rename_repository(world: World, action: sc.RenameRepository) -> Outcome:
    repo = world.repo(action.repo)
    old_name = repo.name
    world.rename(repo, action.name)
    sender = action.user or repo.first_admin()
    changes = {"repository": {"name": {"from": old_name}}}
    return {"full_name": repo.full_name}, [Payloads(world).repository(repo, "renamed", sender, changes=changes)]


def delete_repository(world: World, action: sc.DeleteRepository) -> Outcome:
    """Both events GitHub sends an App on selected repositories (the payloads are built
    while the repository still exists)."""
    repo = world.repo(action.repo)
    sender = action.user or repo.first_admin()
    payloads = Payloads(world)
    # An App not installed on the repository hears nothing of it.
    events = [payloads.repository(repo, "deleted", sender),
              payloads.installation_repositories("removed", sender, [], [repo])] if repo.installed else []
    world.delete(repo)
    return {}, events


def set_capacity(world: World, action: sc.SetCapacity) -> Outcome:
    world.capacity = action.capacity
    return {}, []


def advance_clock(world: World, action: sc.AdvanceClock) -> Outcome:
    world.clock.advance(action.seconds)
    return {"now": ts(world.now())}, []


HANDLERS: dict[type, Any] = {
    sc.OpenPull: open_pull,
    sc.PushPull: push_pull,
    sc.EditPull: edit_pull,
    sc.ClosePull: close_pull,
    sc.AddComment: comment,
    sc.EditIssue: edit_issue,
    sc.RerequestCheck: rerequest_check,
    sc.RerequestSuite: rerequest_suite,
    sc.CompleteRun: complete_run,
    sc.StartRun: start_run,
    sc.PushDefault: push_default,
    sc.RepositoryDispatch: repository_dispatch,
    sc.RenameRepository: rename_repository,
    sc.DeleteRepository: delete_repository,
    sc.InstallApp: installations.install_app,
    sc.AddRepositories: installations.add_repositories,
    sc.RemoveRepositories: installations.remove_repositories,
    sc.UninstallApp: installations.uninstall_app,
    sc.SuspendApp: installations.suspend_app,
    sc.SetCapacity: set_capacity,
    sc.AdvanceClock: advance_clock,
}
