"""GitHub's JSON objects, built from the sandbox state.

The REST routes and the webhook payloads share these builders, so a pull request looks
the same in `GET /pulls/{n}` and in a `pull_request` event, as it does on GitHub. Key sets
follow GitHub's real answers (see the octokit-webhooks examples); values we do not model
are GitHub's defaults.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bot.core.domain import stamp
from bot.sandbox.permissions import AppManifest, Installation, Suspension
from bot.sandbox.scenario import owner_of
from bot.sandbox.state import (
    Artifact,
    ChangedFile,
    CheckRun,
    Commit,
    IssueComment,
    Job,
    PullRequest,
    Reaction,
    RefMove,
    RepoState,
    WorkflowRun,
    workflow_display_name,
)

APP_SLUG = "klaud-cold"
APP_NAME = "Klaud Cold"
BOT_LOGIN = f"{APP_SLUG}[bot]"
REACTIONS = ("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes")
WRITE_LEVELS = frozenset({"admin", "maintain", "write"})


def ts(value: datetime | None) -> str | None:
    """GitHub's timestamps: whole seconds, `Z` suffix."""
    return stamp(value.replace(microsecond=0)) if value is not None else None


def number_for(text: str, base: int = 10_000_000) -> int:
    """A stable numeric id for a name (user, organization) that has none in the scenario."""
    return base + int(hashlib.sha1(text.lower().encode()).hexdigest()[:7], 16)


def fork_id(full_name: str) -> int:
    """A fork's repository id: stable, and apart from the scenario's (500,000,001 on)."""
    return number_for(full_name, 700_000_000)


def node_id(kind: str, number: int) -> str:
    return base64.b64encode(f"0{len(kind)}:{kind}{number}".encode()).decode()


def is_bot(login: str) -> bool:
    return login.endswith("[bot]")


@dataclass(frozen=True)
class Shapes:
    api: str  # the REST API root, e.g. http://127.0.0.1:8080/_sandbox/github
    app_id: int
    manifest: AppManifest
    web: str = "https://github.com"

    # --- people and installations ------------------------------------------------------

    def user(self, login: str, kind: str | None = None) -> dict[str, Any]:
        uid = number_for(login)
        kind = kind or ("Bot" if is_bot(login) else "User")
        return {
            "login": login,
            "id": uid,
            "node_id": node_id(kind, uid),
            "avatar_url": f"https://avatars.githubusercontent.com/u/{uid}?v=4",
            "gravatar_id": "",
            "url": f"{self.api}/users/{login}",
            "html_url": f"{self.web}/{login}",
            "followers_url": f"{self.api}/users/{login}/followers",
            "following_url": f"{self.api}/users/{login}/following{{/other_user}}",
            "gists_url": f"{self.api}/users/{login}/gists{{/gist_id}}",
            "starred_url": f"{self.api}/users/{login}/starred{{/owner}}{{/repo}}",
            "subscriptions_url": f"{self.api}/users/{login}/subscriptions",
            "organizations_url": f"{self.api}/users/{login}/orgs",
            "repos_url": f"{self.api}/users/{login}/repos",
            "events_url": f"{self.api}/users/{login}/events{{/privacy}}",
            "received_events_url": f"{self.api}/users/{login}/received_events",
            "type": kind,
            "site_admin": False,
        }

    def owner(self, repo: RepoState) -> dict[str, Any]:
        return self.user(repo.owner, repo.owner_type)

    def organization(self, repo: RepoState) -> dict[str, Any]:
        oid = number_for(repo.owner)
        org = f"{self.api}/orgs/{repo.owner}"
        return {
            "login": repo.owner,
            "id": oid,
            "node_id": node_id("Organization", oid),
            "url": org,
            "repos_url": f"{org}/repos",
            "events_url": f"{org}/events",
            "hooks_url": f"{org}/hooks",
            "issues_url": f"{org}/issues",
            "members_url": f"{org}/members{{/member}}",
            "public_members_url": f"{org}/public_members{{/member}}",
            "avatar_url": f"https://avatars.githubusercontent.com/u/{oid}?v=4",
            "description": "",
        }

    def app(self) -> dict[str, Any]:
        return {
            "id": self.app_id,
            "slug": APP_SLUG,
            "node_id": node_id("App", self.app_id),
            "client_id": f"Iv1.{self.app_id:016x}",
            "owner": self.user("klaud-admins", "Organization"),
            "name": APP_NAME,
            "description": "Plans container-image refresh waves",
            "external_url": "https://example.invalid/klaud",
            "html_url": f"{self.web}/apps/{APP_SLUG}",
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
            "permissions": dict(self.manifest.permissions),
            "events": list(self.manifest.events),
        }

    def installation(self, installed: Installation, repo: RepoState,
                     suspended: Suspension | None = None) -> dict[str, Any]:
        """An installation, on the account that owns `repo`."""
        installation_id = installed.id
        return {
            "id": installation_id,
            "client_id": f"Iv1.{self.app_id:016x}",
            "account": self.owner(repo),
            "repository_selection": "selected",
            "access_tokens_url": f"{self.api}/app/installations/{installation_id}/access_tokens",
            "repositories_url": f"{self.api}/installation/repositories",
            "html_url": f"{self.web}/organizations/{repo.owner}/settings/installations/{installation_id}",
            "app_id": self.app_id,
            "app_slug": APP_SLUG,
            "target_id": number_for(repo.owner),
            "target_type": repo.owner_type,
            "permissions": dict(installed.permissions),
            "events": list(installed.events),
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
            "single_file_name": None,
            "has_multiple_single_files": False,
            "single_file_paths": [],
            "suspended_by": self.user(suspended.by) if suspended else None,
            "suspended_at": ts(suspended.at) if suspended else None,
        }

    @staticmethod
    def installation_ref(installation_id: int) -> dict[str, Any]:
        """The `installation` object every App webhook carries."""
        return {"id": installation_id, "node_id": node_id("Installation", installation_id)}

    def author_association(self, repo: RepoState, login: str) -> str:
        level = repo.collaborators.get(login)
        if login == repo.owner or (level == "admin" and repo.owner_type == "User"):
            return "OWNER"
        if level in WRITE_LEVELS:
            return "MEMBER"
        if level is not None and level != "none":
            return "COLLABORATOR"
        return "NONE" if is_bot(login) else "CONTRIBUTOR"

    # --- repositories ------------------------------------------------------------------

    def repo_urls(self, full_name: str) -> dict[str, Any]:
        base = f"{self.api}/repos/{full_name}"
        return {
            "forks_url": f"{base}/forks",
            "keys_url": f"{base}/keys{{/key_id}}",
            "collaborators_url": f"{base}/collaborators{{/collaborator}}",
            "teams_url": f"{base}/teams",
            "hooks_url": f"{base}/hooks",
            "issue_events_url": f"{base}/issues/events{{/number}}",
            "events_url": f"{base}/events",
            "assignees_url": f"{base}/assignees{{/user}}",
            "branches_url": f"{base}/branches{{/branch}}",
            "tags_url": f"{base}/tags",
            "blobs_url": f"{base}/git/blobs{{/sha}}",
            "git_tags_url": f"{base}/git/tags{{/sha}}",
            "git_refs_url": f"{base}/git/refs{{/sha}}",
            "trees_url": f"{base}/git/trees{{/sha}}",
            "statuses_url": f"{base}/statuses/{{sha}}",
            "languages_url": f"{base}/languages",
            "stargazers_url": f"{base}/stargazers",
            "contributors_url": f"{base}/contributors",
            "subscribers_url": f"{base}/subscribers",
            "subscription_url": f"{base}/subscription",
            "commits_url": f"{base}/commits{{/sha}}",
            "git_commits_url": f"{base}/git/commits{{/sha}}",
            "comments_url": f"{base}/comments{{/number}}",
            "issue_comment_url": f"{base}/issues/comments{{/number}}",
            "contents_url": f"{base}/contents/{{+path}}",
            "compare_url": f"{base}/compare/{{base}}...{{head}}",
            "merges_url": f"{base}/merges",
            "archive_url": f"{base}/{{archive_format}}{{/ref}}",
            "downloads_url": f"{base}/downloads",
            "issues_url": f"{base}/issues{{/number}}",
            "pulls_url": f"{base}/pulls{{/number}}",
            "milestones_url": f"{base}/milestones{{/number}}",
            "notifications_url": f"{base}/notifications{{?since,all,participating}}",
            "labels_url": f"{base}/labels{{/name}}",
            "releases_url": f"{base}/releases{{/id}}",
            "deployments_url": f"{base}/deployments",
        }

    def minimal_repository(self, repo: RepoState, fork: str | None = None) -> dict[str, Any]:
        """The short repository form inside `workflow_run` (`repository`, `head_repository`).

        `fork` names another account's fork of `repo` (a pull request's head): a repository
        of its own, with its own id and owner, that holds what `repo` held.
        """
        full_name = fork or repo.full_name
        repo_id = fork_id(fork) if fork else repo.id
        return {
            "id": repo_id,
            "node_id": node_id("Repository", repo_id),
            "name": full_name.split("/")[1],
            "full_name": full_name,
            "private": repo.private,
            "owner": self.user(owner_of(full_name), "User") if fork else self.owner(repo),
            "html_url": f"{self.web}/{full_name}",
            "description": None,
            "fork": fork is not None,
            "url": f"{self.api}/repos/{full_name}",
            **self.repo_urls(full_name),
        }

    def repository(self, repo: RepoState, fork: str | None = None) -> dict[str, Any]:
        full_name = fork or repo.full_name
        # A fork's issues and pull requests are its own (none here).
        open_count = 0 if fork else sum(1 for p in repo.pulls.values() if p.state == "open")
        return {
            **self.minimal_repository(repo, fork),
            "created_at": ts(repo.created_at),
            "updated_at": ts(repo.head.at),
            "pushed_at": ts(repo.pushed_at or repo.head.at),
            "git_url": f"git://github.com/{full_name}.git",
            "ssh_url": f"git@github.com:{full_name}.git",
            "clone_url": f"{self.web}/{full_name}.git",
            "svn_url": f"{self.web}/{full_name}",
            "homepage": None,
            "size": sum(len(text) for text in repo.head.tree.values()) // 1024,
            "stargazers_count": 0,
            "watchers_count": 0,
            "language": "Python",
            "has_issues": True,
            "has_projects": True,
            "has_downloads": True,
            "has_wiki": False,
            "has_pages": False,
            "forks_count": 0,
            "mirror_url": None,
            "archived": False,
            "disabled": False,
            "open_issues_count": open_count,
            "license": None,
            "forks": 0,
            "open_issues": open_count,
            "watchers": 0,
            "default_branch": repo.default_branch,
            "is_template": False,
            "topics": [],
            "visibility": "private" if repo.private else "public",
            "web_commit_signoff_required": False,
            "custom_properties": {},
        }

    def push_repository(self, repo: RepoState) -> dict[str, Any]:
        """`push` events spell a few repository fields differently (epoch seconds)."""
        shaped = self.repository(repo)
        shaped["created_at"] = int(repo.created_at.timestamp())
        shaped["pushed_at"] = int((repo.pushed_at or repo.head.at).timestamp())
        shaped["stargazers"] = 0
        shaped["master_branch"] = repo.default_branch
        owner = shaped["owner"]
        shaped["owner"] = {"name": repo.owner, "email": None, **owner}
        return shaped

    # --- pull requests and issues ------------------------------------------------------

    def label(self, repo: RepoState, name: str) -> dict[str, Any]:
        lid = number_for(f"{repo.full_name}:{name}", 1_000_000_000)
        return {
            "id": lid,
            "node_id": node_id("Label", lid),
            "url": f"{self.api}/repos/{repo.full_name}/labels/{name}",
            "name": name,
            "color": hashlib.sha1(name.encode()).hexdigest()[:6],
            "default": False,
            "description": None,
        }

    def branch(self, repo: RepoState, ref: str, sha: str, fork: str | None = None) -> dict[str, Any]:
        """A pull request's `head` or `base`; `fork` names the fork a head branch is in."""
        owner = owner_of(fork) if fork else repo.owner
        return {
            "label": f"{owner}:{ref}",
            "ref": ref,
            "sha": sha,
            "user": self.user(owner, "User") if fork else self.owner(repo),
            "repo": self.repository(repo, fork),
        }

    def pull_request(self, repo: RepoState, pull: PullRequest, full: bool = True) -> dict[str, Any]:
        """A pull request; `full=False` gives the shorter form of `GET /pulls` lists."""
        base = f"{self.api}/repos/{repo.full_name}"
        html = f"{self.web}/{repo.full_name}/pull/{pull.number}"
        shaped: dict[str, Any] = {
            "url": f"{base}/pulls/{pull.number}",
            "id": pull.id,
            "node_id": node_id("PullRequest", pull.id),
            "html_url": html,
            "diff_url": f"{html}.diff",
            "patch_url": f"{html}.patch",
            "issue_url": f"{base}/issues/{pull.number}",
            "number": pull.number,
            "state": pull.state,
            "locked": False,
            "title": pull.title,
            "user": self.user(pull.user),
            "body": pull.body,
            "created_at": ts(pull.created_at),
            "updated_at": ts(pull.updated_at),
            "closed_at": ts(pull.closed_at),
            "merged_at": ts(pull.merged_at),
            "merge_commit_sha": pull.merge_commit_sha,
            "assignee": None,
            "assignees": [],
            "requested_reviewers": [],
            "requested_teams": [],
            "labels": [self.label(repo, name) for name in pull.labels],
            "milestone": None,
            "draft": pull.draft,
            "commits_url": f"{base}/pulls/{pull.number}/commits",
            "review_comments_url": f"{base}/pulls/{pull.number}/comments",
            "review_comment_url": f"{base}/pulls/comments{{/number}}",
            "comments_url": f"{base}/issues/{pull.number}/comments",
            "statuses_url": f"{base}/statuses/{pull.head_sha}",
            "head": self.branch(repo, pull.head_ref, pull.head_sha, pull.head_repo),
            "base": self.branch(repo, pull.base_ref, pull.base_sha),
            "_links": {
                "self": {"href": f"{base}/pulls/{pull.number}"},
                "html": {"href": html},
                "issue": {"href": f"{base}/issues/{pull.number}"},
                "comments": {"href": f"{base}/issues/{pull.number}/comments"},
                "review_comments": {"href": f"{base}/pulls/{pull.number}/comments"},
                "review_comment": {"href": f"{base}/pulls/comments{{/number}}"},
                "commits": {"href": f"{base}/pulls/{pull.number}/commits"},
                "statuses": {"href": f"{base}/statuses/{pull.head_sha}"},
            },
            "author_association": self.author_association(repo, pull.user),
            "auto_merge": None,
            "active_lock_reason": None,
        }
        if full:
            shaped.update(
                {
                    "merged": pull.merged,
                    "mergeable": None if pull.state == "closed" else True,
                    "rebaseable": None if pull.state == "closed" else True,
                    "mergeable_state": "unknown" if pull.state == "closed" else "clean",
                    "merged_by": self.user(pull.merged_by) if pull.merged_by else None,
                    "comments": sum(
                        1 for c in repo.comments.values() if c.issue_number == pull.number
                    ),
                    "review_comments": 0,
                    "maintainer_can_modify": False,
                    "commits": len(pull.head_shas),
                    "additions": sum(f.additions for f in pull.files),
                    "deletions": sum(f.deletions for f in pull.files),
                    "changed_files": len(pull.files),
                }
            )
        return shaped

    def pull_reference(self, repo: RepoState, pull: PullRequest) -> dict[str, Any]:
        """The short pull-request form inside workflow runs and check runs."""
        short_repo = {"id": repo.id, "url": f"{self.api}/repos/{repo.full_name}", "name": repo.name}
        return {
            "url": f"{self.api}/repos/{repo.full_name}/pulls/{pull.number}",
            "id": pull.id,
            "number": pull.number,
            "head": {"ref": pull.head_ref, "sha": pull.head_sha, "repo": short_repo},
            "base": {"ref": pull.base_ref, "sha": pull.base_sha, "repo": short_repo},
        }

    def pull_file(self, repo: RepoState, changed: ChangedFile, head_sha: str) -> dict[str, Any]:
        blob = f"{self.web}/{repo.full_name}/blob/{head_sha}/{changed.filename}"
        shaped: dict[str, Any] = {
            "sha": changed.sha,
            "filename": changed.filename,
            "status": changed.status,
            "additions": changed.additions,
            "deletions": changed.deletions,
            "changes": changed.additions + changed.deletions,
            "blob_url": blob,
            "raw_url": blob.replace("/blob/", "/raw/"),
            "contents_url": f"{self.api}/repos/{repo.full_name}/contents/{changed.filename}?ref={head_sha}",
        }
        if changed.patch is not None:
            shaped["patch"] = changed.patch
        if changed.previous_filename:
            shaped["previous_filename"] = changed.previous_filename
        return shaped

    def reactions_summary(self, url: str, reactions: list[Reaction]) -> dict[str, Any]:
        summary: dict[str, Any] = {"url": url, "total_count": len(reactions)}
        for content in ("+1", "-1", "laugh", "hooray", "confused", "heart", "rocket", "eyes"):
            summary[content] = sum(1 for r in reactions if r.content == content)
        return summary

    def issue(self, repo: RepoState, number: int) -> dict[str, Any]:
        """The issue side of a pull request or plain issue (as in `issue_comment` events)."""
        base = f"{self.api}/repos/{repo.full_name}/issues/{number}"
        pull = repo.pulls.get(number)
        plain = repo.issues.get(number)
        if pull is not None:
            iid, title, login, body = pull.id, pull.title, pull.user, pull.body
            created, updated, closed = pull.created_at, pull.updated_at, pull.closed_at
            state, labels, draft = pull.state, pull.labels, pull.draft
        elif plain is not None:
            iid, title, login, body = plain.id, plain.title, plain.user, plain.body
            created, updated, closed = plain.created_at, plain.last_change, plain.closed_at
            state, labels, draft = plain.state, plain.labels, False
        else:
            raise KeyError(number)
        shaped: dict[str, Any] = {
            "url": base,
            "repository_url": f"{self.api}/repos/{repo.full_name}",
            "labels_url": f"{base}/labels{{/name}}",
            "comments_url": f"{base}/comments",
            "events_url": f"{base}/events",
            "html_url": f"{self.web}/{repo.full_name}/{'pull' if pull else 'issues'}/{number}",
            "id": iid,
            "node_id": node_id("Issue", iid),
            "number": number,
            "title": title,
            "user": self.user(login),
            "labels": [self.label(repo, name) for name in labels],
            "state": state,
            "locked": False,
            "assignee": None,
            "assignees": [],
            "milestone": None,
            "comments": sum(1 for c in repo.comments.values() if c.issue_number == number),
            "created_at": ts(created),
            "updated_at": ts(updated),
            "closed_at": ts(closed),
            "author_association": self.author_association(repo, login),
            "active_lock_reason": None,
            "body": body,
            "reactions": self.reactions_summary(f"{base}/reactions", []),
            "draft": draft,
        }
        if pull is not None:
            html = f"{self.web}/{repo.full_name}/pull/{number}"
            shaped["pull_request"] = {
                "url": f"{self.api}/repos/{repo.full_name}/pulls/{number}",
                "html_url": html,
                "diff_url": f"{html}.diff",
                "patch_url": f"{html}.patch",
                "merged_at": ts(pull.merged_at),
            }
        return shaped

    def comment(self, repo: RepoState, comment: IssueComment) -> dict[str, Any]:
        url = f"{self.api}/repos/{repo.full_name}/issues/comments/{comment.id}"
        kind = "pull" if comment.issue_number in repo.pulls else "issues"
        return {
            "url": url,
            "html_url": f"{self.web}/{repo.full_name}/{kind}/{comment.issue_number}#issuecomment-{comment.id}",
            "issue_url": f"{self.api}/repos/{repo.full_name}/issues/{comment.issue_number}",
            "id": comment.id,
            "node_id": node_id("IssueComment", comment.id),
            "user": self.user(comment.user),
            "created_at": ts(comment.created_at),
            "updated_at": ts(comment.updated_at),
            "author_association": self.author_association(repo, comment.user),
            "body": comment.body,
            "reactions": self.reactions_summary(
                f"{url}/reactions", repo.comment_reactions(comment.id)
            ),
            "performed_via_github_app": self.app() if comment.via_app else None,
        }

    def reaction(self, reaction: Reaction) -> dict[str, Any]:
        return {
            "id": reaction.id,
            "node_id": node_id("Reaction", reaction.id),
            "user": self.user(reaction.user),
            "content": reaction.content,
            "created_at": ts(reaction.created_at),
        }

    # --- git ---------------------------------------------------------------------------

    def git_person(self, login: str, at: datetime) -> dict[str, Any]:
        return {"name": login, "email": f"{login}@users.noreply.github.com", "date": ts(at)}

    def commit(
        self, repo: RepoState, commit: Commit, files: list[ChangedFile] | None = None
    ) -> dict[str, Any]:
        base = f"{self.api}/repos/{repo.full_name}"
        shaped: dict[str, Any] = {
            "sha": commit.sha,
            "node_id": node_id("Commit", commit.seq),
            "commit": {
                "author": self.git_person(commit.author, commit.at),
                "committer": self.git_person(commit.author, commit.at),
                "message": commit.message,
                "tree": {"sha": tree_sha(commit), "url": f"{base}/git/trees/{tree_sha(commit)}"},
                "url": f"{base}/git/commits/{commit.sha}",
                "comment_count": 0,
                "verification": {"verified": False, "reason": "unsigned", "signature": None,
                                 "payload": None, "verified_at": None},
            },
            "url": f"{base}/commits/{commit.sha}",
            "html_url": f"{self.web}/{repo.full_name}/commit/{commit.sha}",
            "comments_url": f"{base}/commits/{commit.sha}/comments",
            "author": self.user(commit.author),
            "committer": self.user(commit.author),
            "parents": [
                {"sha": p, "url": f"{base}/commits/{p}",
                 "html_url": f"{self.web}/{repo.full_name}/commit/{p}"}
                for p in commit.parents
            ],
        }
        if files is not None:
            additions = sum(f.additions for f in files)
            deletions = sum(f.deletions for f in files)
            shaped["stats"] = {"total": additions + deletions, "additions": additions,
                               "deletions": deletions}
            shaped["files"] = [self.pull_file(repo, f, commit.sha) for f in files]
        return shaped

    def push_commit(
        self, repo: RepoState, commit: Commit, changes: list[tuple[str, str]]
    ) -> dict[str, Any]:
        """A commit as the `push` event lists it; `changes` are (path, status) pairs."""
        person = {"name": commit.author, "email": f"{commit.author}@users.noreply.github.com",
                  "username": commit.author}
        return {
            "id": commit.sha,
            "tree_id": tree_sha(commit),
            "distinct": True,
            "message": commit.message,
            "timestamp": ts(commit.at),
            "url": f"{self.web}/{repo.full_name}/commit/{commit.sha}",
            "author": person,
            "committer": person,
            "added": [path for path, status in changes if status == "added"],
            "removed": [path for path, status in changes if status == "removed"],
            "modified": [path for path, status in changes if status == "modified"],
        }

    def activity(self, move: RefMove) -> dict[str, Any]:
        """An entry of `GET /repos/{owner}/{repo}/activity`."""
        return {
            "id": move.id,
            "node_id": node_id("RepositoryActivity", move.id),
            "before": move.before,
            "after": move.after,
            "ref": move.ref,
            "timestamp": ts(move.at),
            "activity_type": move.kind,
            "actor": self.user(move.actor),
        }

    def ref(self, repo: RepoState, name: str, sha: str) -> dict[str, Any]:
        base = f"{self.api}/repos/{repo.full_name}"
        return {
            "ref": name,
            "node_id": node_id("Ref", number_for(f"{repo.full_name}:{name}")),
            "url": f"{base}/git/{name}",
            "object": {"sha": sha, "type": "commit", "url": f"{base}/git/commits/{sha}"},
        }

    def content_entry(self, repo: RepoState, path: str, ref: str, kind: str,
                      sha: str, size: int) -> dict[str, Any]:
        base = f"{self.api}/repos/{repo.full_name}"
        url = f"{base}/contents/{path}?ref={ref}"
        git_url = f"{base}/git/{'blobs' if kind == 'file' else 'trees'}/{sha}"
        html = f"{self.web}/{repo.full_name}/{'blob' if kind == 'file' else 'tree'}/{ref}/{path}"
        return {
            "type": kind,
            "size": size,
            "name": path.rsplit("/", 1)[-1],
            "path": path,
            "sha": sha,
            "url": url,
            "git_url": git_url,
            "html_url": html,
            "download_url": (
                f"https://raw.githubusercontent.com/{repo.full_name}/{ref}/{path}"
                if kind == "file" else None
            ),
            "_links": {"self": url, "git": git_url, "html": html},
        }

    # --- actions and checks ------------------------------------------------------------

    def workflow(self, repo: RepoState, file: str) -> dict[str, Any]:
        wid = repo.workflow_id(file)
        base = f"{self.api}/repos/{repo.full_name}"
        return {
            "id": wid,
            "node_id": node_id("Workflow", wid),
            "name": workflow_display_name(file, repo.workflow_text(file)),
            "path": f".github/workflows/{file}",
            "state": "active",
            "created_at": ts(repo.created_at),
            "updated_at": ts(repo.created_at),
            "url": f"{base}/actions/workflows/{wid}",
            "html_url": f"{self.web}/{repo.full_name}/blob/{repo.default_branch}/.github/workflows/{file}",
            "badge_url": f"{self.web}/{repo.full_name}/workflows/{file}/badge.svg",
        }

    def workflow_run(self, repo: RepoState, run: WorkflowRun) -> dict[str, Any]:
        base = f"{self.api}/repos/{repo.full_name}"
        run_url = f"{base}/actions/runs/{run.id}"
        # GitHub lists no pull request whose head is in a fork.
        pulls = [repo.pulls[n] for n in run.pull_requests
                 if n in repo.pulls and repo.pulls[n].head_repo is None]
        wid = repo.workflow_id(run.workflow)
        suite = number_for(f"suite:{run.id}", 8_000_000_000)
        return {
            "id": run.id,
            "name": run.name,
            "node_id": node_id("WorkflowRun", run.id),
            "head_branch": run.head_branch,
            "head_sha": run.head_sha,
            "path": f".github/workflows/{run.workflow}",
            "display_title": run.display_title,
            "run_number": run.run_number,
            "event": run.event,
            "status": run.status,
            "conclusion": run.conclusion,
            "workflow_id": wid,
            "check_suite_id": suite,
            "check_suite_node_id": node_id("CheckSuite", suite),
            "url": run_url,
            "html_url": f"{self.web}/{repo.full_name}/actions/runs/{run.id}",
            "pull_requests": [self.pull_reference(repo, p) for p in pulls],
            "created_at": ts(run.created_at),
            "updated_at": ts(run.updated_at),
            "actor": self.user(run.actor),
            "run_attempt": run.run_attempt,
            "run_started_at": ts(run.run_started_at),
            "triggering_actor": self.user(run.actor),
            "jobs_url": f"{run_url}/jobs",
            "logs_url": f"{run_url}/logs",
            "check_suite_url": f"{base}/check-suites/{suite}",
            "artifacts_url": f"{run_url}/artifacts",
            "cancel_url": f"{run_url}/cancel",
            "rerun_url": f"{run_url}/rerun",
            "previous_attempt_url": (
                f"{run_url}/attempts/{run.run_attempt - 1}" if run.run_attempt > 1 else None
            ),
            "workflow_url": f"{base}/actions/workflows/{wid}",
            "head_commit": self.head_commit(repo, run.head_sha, run.actor, run.created_at),
            "repository": self.minimal_repository(repo),
            "head_repository": self.minimal_repository(repo, run.head_repository),
        }

    def head_commit(self, repo: RepoState, sha: str, actor: str,
                    fallback: datetime) -> dict[str, Any]:
        """The short commit inside workflow runs and check suites (an unknown sha, which
        a scenario may name, gets the actor and the fallback time)."""
        commit = repo.commits.get(sha)
        author = commit.author if commit else actor
        person = {"name": author, "email": f"{author}@users.noreply.github.com"}
        return {
            "id": sha,
            "tree_id": tree_sha(commit) if commit else sha,
            "message": commit.message if commit else "",
            "timestamp": ts(commit.at if commit else fallback),
            "author": person,
            "committer": person,
        }

    def job(self, repo: RepoState, run: WorkflowRun, job: Job) -> dict[str, Any]:
        base = f"{self.api}/repos/{repo.full_name}"
        # A hosted runner is assigned once the job starts.
        runner = job.status != "queued"
        return {
            "id": job.id,
            "run_id": run.id,
            "workflow_name": run.name,
            "head_branch": run.head_branch,
            "run_url": f"{base}/actions/runs/{run.id}",
            "run_attempt": run.run_attempt,
            "node_id": node_id("CheckRun", job.id),
            "head_sha": run.head_sha,
            "url": f"{base}/actions/jobs/{job.id}",
            "html_url": f"{self.web}/{repo.full_name}/actions/runs/{run.id}/job/{job.id}",
            "status": job.status,
            "conclusion": job.conclusion,
            "created_at": ts(run.created_at),
            "started_at": ts(job.started_at),
            "completed_at": ts(job.completed_at),
            "name": job.name,
            "steps": [
                {"name": step.name, "status": step.status, "conclusion": step.conclusion,
                 "number": step.number, "started_at": ts(job.started_at),
                 "completed_at": ts(job.completed_at)}
                for step in job.steps
            ],
            "check_run_url": f"{base}/check-runs/{job.id}",
            "labels": ["ubuntu-latest"],
            "runner_id": 1 if runner else None,
            "runner_name": "GitHub Actions 1" if runner else None,
            "runner_group_id": 0 if runner else None,
            "runner_group_name": "GitHub Actions" if runner else None,
        }

    def artifact(self, repo: RepoState, artifact: Artifact, run: WorkflowRun,
                 now: datetime) -> dict[str, Any]:
        url = f"{self.api}/repos/{repo.full_name}/actions/artifacts/{artifact.id}"
        return {
            "id": artifact.id,
            "node_id": node_id("Artifact", artifact.id),
            "name": artifact.name,
            "size_in_bytes": len(artifact.data),
            "url": url,
            "archive_download_url": f"{url}/zip",
            "expired": artifact.expired(now),
            "digest": "sha256:" + hashlib.sha256(artifact.data).hexdigest(),
            "created_at": ts(artifact.created_at),
            "updated_at": ts(artifact.created_at),
            "expires_at": ts(artifact.expires_at),
            "workflow_run": {
                "id": run.id,
                "repository_id": repo.id,
                "head_repository_id": fork_id(run.head_repository) if run.head_repository else repo.id,
                "head_branch": run.head_branch,
                "head_sha": run.head_sha,
            },
        }

    def check_run(self, repo: RepoState, check: CheckRun) -> dict[str, Any]:
        url = f"{self.api}/repos/{repo.full_name}/check-runs/{check.id}"
        pulls = [self.pull_reference(repo, p) for p in repo.find_pull_by_sha(check.head_sha)]
        head_branch = next(
            (p.head_ref for p in repo.find_pull_by_sha(check.head_sha)), repo.default_branch
        )
        output = {
            "title": check.output.get("title"),
            "summary": check.output.get("summary"),
            "text": check.output.get("text"),
            "annotations_count": len(check.output.get("annotations", [])),
            "annotations_url": f"{url}/annotations",
        }
        return {
            "id": check.id,
            "node_id": node_id("CheckRun", check.id),
            "head_sha": check.head_sha,
            "external_id": check.external_id,
            "url": url,
            "html_url": f"{self.web}/{repo.full_name}/runs/{check.id}",
            "details_url": check.details_url,
            "status": check.status,
            "conclusion": check.conclusion,
            "started_at": ts(check.started_at),
            "completed_at": ts(check.completed_at),
            "output": output,
            "name": check.name,
            "check_suite": {
                "id": check.check_suite_id,
                "node_id": node_id("CheckSuite", check.check_suite_id),
                "head_branch": head_branch,
                "head_sha": check.head_sha,
                "status": check.status,
                "conclusion": check.conclusion,
                "url": f"{self.api}/repos/{repo.full_name}/check-suites/{check.check_suite_id}",
                "before": None,
                "after": check.head_sha,
                "pull_requests": pulls,
                "app": self.app(),
                "created_at": ts(check.started_at),
                "updated_at": ts(check.completed_at or check.started_at),
            },
            "app": self.app(),
            "pull_requests": pulls,
        }

    def check_suite(self, repo: RepoState, checks: list[CheckRun]) -> dict[str, Any]:
        """The App's check suite of one commit, as `check_suite` events carry it."""
        first = min(checks, key=lambda c: c.id)
        status, conclusion = suite_state(checks)
        sha = first.head_sha
        url = f"{self.api}/repos/{repo.full_name}/check-suites/{first.check_suite_id}"
        pulls = repo.find_pull_by_sha(sha)
        return {
            "id": first.check_suite_id,
            "node_id": node_id("CheckSuite", first.check_suite_id),
            "head_branch": pulls[0].head_ref if pulls else repo.default_branch,
            "head_sha": sha,
            "status": status,
            "conclusion": conclusion,
            "url": url,
            "before": None,
            "after": sha,
            "pull_requests": [self.pull_reference(repo, p) for p in pulls],
            "app": self.app(),
            "created_at": ts(first.started_at),
            "updated_at": ts(max(c.completed_at or c.started_at for c in checks)),
            "latest_check_runs_count": len({c.name for c in checks}),
            "check_runs_url": f"{url}/check-runs",
            "head_commit": self.head_commit(repo, sha, repo.first_admin(), first.started_at),
        }


# The suite's conclusion is the first of these its check runs have (GitHub's order).
SUITE_CONCLUSIONS = ("action_required", "cancelled", "timed_out", "failure", "stale",
                     "neutral", "success", "skipped")


def suite_state(checks: list[CheckRun]) -> tuple[str, str | None]:
    """A check suite's (status, conclusion) from its check runs."""
    if any(c.status != "completed" for c in checks):
        started = any(c.status == "in_progress" for c in checks)
        return ("in_progress" if started else "queued"), None
    found = {c.conclusion for c in checks}
    return "completed", next((c for c in SUITE_CONCLUSIONS if c in found), None)


def tree_sha(commit: Commit) -> str:
    return folder_sha(commit.tree, "")


def folder_sha(tree: dict[str, str], folder: str) -> str:
    """The tree id of `folder` ("" for the root) in a commit's `tree`: like git's, it
    changes with what the folder holds and only with that."""
    prefix = f"{folder}/" if folder else ""
    held = sorted((path[len(prefix):], text) for path, text in tree.items() if path.startswith(prefix))
    return hashlib.sha1(repr(held).encode()).hexdigest()
