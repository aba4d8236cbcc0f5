"""Everything Klaud asks of a repository, as named operations over the GitHub client.

`GitHubRepo` is the one place that knows GitHub's REST routes, media types and answer
shapes; services see `bot.services.api.RepoAPI` (which this class implements) and typed
models from `bot.core.events`. Errors are those of `bot.github.errors`.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError

from bot.core.domain import stamp
from bot.core.events import (
    Artifact,
    BlameRange,
    Comment,
    EditedIssue,
    Issue,
    Job,
    ListedComment,
    PullFile,
    PullRequest,
    RefActivity,
    Repository,
    WorkflowRun,
)
from bot.github.client import MAX_LISTED, RAW_MEDIA_TYPE, GitHubApp, InstallationClient
from bot.github.errors import BadRequest, Conflict, NotFound, RefClash, TooLarge

# Both ends of the body's edit history (GitHub does not document its order): whichever is
# the newest holds the edits since Klaud's last render, unless there were more (`totalCount`).
ISSUE_EDIT_QUERY = """
fragment edits on UserContentEditConnection { totalCount nodes { editedAt editor { __typename login } } }
query($owner: String!, $name: String!, $number: Int!) {
  repository(owner: $owner, name: $name) {
    issue(number: $number) {
      body editor { __typename login }
      firstEdits: userContentEdits(first: 20) { ...edits }
      lastEdits: userContentEdits(last: 20) { ...edits }
    }
  }
}
"""

PER_PAGE = "per_page=100"
ACTIVITY_PAGE = 10
COMPARE_MAX_FILES = 300  # GitHub lists at most this many files of a comparison
CONTENTS_MAX_ENTRIES = 1000  # GitHub lists at most this many entries of a folder's contents
BLAME_QUERY = """
query($owner: String!, $name: String!, $ref: String!, $path: String!) {
  repository(owner: $owner, name: $name) {
    object(expression: $ref) {
      ... on Commit {
        blame(path: $path) { ranges { startingLine endingLine commit { committedDate } } }
      }
    }
  }
}
"""


# GitHub lists at most this many runs of a listing filtered by `created` or `status` (a
# search): "This endpoint will return up to 1,000 results for each search when using the
# following parameters: actor, branch, check_suite_id, created, event, head_sha, status."
RUN_SEARCH_MAX = 1000
# Narrower searches that reach past that cap, at most: as many runs as any listing may hold.
MAX_RUN_SEARCHES = MAX_LISTED // RUN_SEARCH_MAX


@dataclass
class _RunSearch:
    """What one search of runs listed: how many, and the oldest creation time among them."""

    listed: int = 0
    oldest: datetime | None = None

    def saw(self, run: WorkflowRun) -> None:
        self.listed += 1
        if run.created_at is not None and (self.oldest is None or run.created_at < self.oldest):
            self.oldest = run.created_at

    def narrower(self, created_since: date) -> str | None:
        """The `created` filter of the runs this search left out at GitHub's cap, None when it
        was not cut off: from the bound to its oldest run, whose second is listed again (GitHub's
        ranges include both ends), as there may be more runs of that second."""
        if self.listed < RUN_SEARCH_MAX or self.oldest is None:
            return None
        return f"{created_since.isoformat()}T00:00:00Z..{self.oldest.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


class GitHubRepo:
    """One repository as one installation of the App sees it."""

    def __init__(self, client: InstallationClient, full_name: str) -> None:
        self.client = client
        self.name = full_name
        owner, _, repo = full_name.partition("/")
        self._vars = {"owner": owner, "repo": repo}

    def _at(self, **extra: Any) -> dict[str, Any]:
        return {**self._vars, **extra}

    def _at_path(self, path: str) -> dict[str, Any]:
        """The variables of a `{+path}` route: each segment percent-encoded, so a file whose
        name holds `#`, `?` or `%` is asked for by that name (reserved expansion would pass
        them on as they are: the rest of the URL a fragment, `%41` an `A`)."""
        return self._at(path="/".join(quote(segment, safe="") for segment in path.split("/")))

    # -- repository and contents ---------------------------------------------------------

    async def repository(self) -> Repository:
        return Repository.model_validate(await self.client.getitem("/repos/{owner}/{repo}", self._at()))

    async def head_sha(self, branch: str) -> str:
        commit = await self.client.getitem("/repos/{owner}/{repo}/commits/{ref}", self._at(ref=branch))
        return str(commit["sha"])

    async def moved_to_at(self, branch: str, sha: str) -> datetime | None:
        # The branch's head is its newest move but for moves made since it was read: a
        # page of ten holds it. GitHub Enterprise Server before 3.10 has no activity API
        # (404); a refusal (403) says nothing of when the branch moved either.
        ref = f"refs/heads/{branch}"
        try:
            items = await self.client.getitem(
                "/repos/{owner}/{repo}/activity", self._at(), params={"ref": ref, "per_page": str(ACTIVITY_PAGE)}
            )
        except (NotFound, BadRequest):
            return None
        for item in items if isinstance(items, list) else ():
            try:
                activity = RefActivity.model_validate(item)
            # An entry of another shape (a proxy's, an older server's) dates nothing: the
            # caller falls back to the repository's pushed_at, as when the API is absent.
            except ValidationError:
                continue
            if activity.after == sha and activity.ref == ref:
                return activity.timestamp
        return None

    async def file_text(self, path: str, ref: str) -> str | None:
        """A file's text at `ref`, or None when it does not exist there."""
        try:
            item = await self.client.getitem(
                "/repos/{owner}/{repo}/contents/{+path}", self._at_path(path), params={"ref": ref}
            )
        except NotFound:
            return None
        if not isinstance(item, dict) or item.get("type") != "file":
            return None
        if item.get("encoding") == "none":
            # GitHub leaves the content of files over 1 MB out of the JSON; the raw media
            # type still returns it (up to 100 MB).
            raw = await self.client.getitem(
                "/repos/{owner}/{repo}/contents/{+path}",
                self._at_path(path),
                params={"ref": ref},
                accept=RAW_MEDIA_TYPE,
            )
            return str(raw or "")
        # Undecodable bytes become U+FFFD: the YAML parser then reports the file as invalid
        # (keeping the last good state) instead of the delivery failing over and over.
        return base64.b64decode(item.get("content") or "").decode("utf-8", errors="replace")

    async def directory(self, path: str, ref: str, *, nested: bool = False) -> list[str]:
        """Paths of the files directly in `path` at `ref` ([] when there is no such folder);
        with `nested`, of the files in its folders too (one recursive tree read)."""
        if nested:
            return await self._tree_files(path, ref, recursive=True)
        try:
            items = await self.client.getitem(
                "/repos/{owner}/{repo}/contents/{+path}", self._at_path(path), params={"ref": ref}
            )
        except NotFound:
            return []
        if not isinstance(items, list):
            return []
        if len(items) >= CONTENTS_MAX_ENTRIES:
            # The listing may stop there without saying so: the folder's tree lists it whole.
            return await self._tree_files(path, ref)
        return [str(item["path"]) for item in items if item.get("type") == "file"]

    async def _tree_files(self, path: str, ref: str, *, recursive: bool = False) -> list[str]:
        """Paths of the files in `path` at `ref` (at any depth if `recursive`), from the Git
        Trees API: the commit's tree, then each folder's down to `path`, one request each."""
        tree = ref
        try:
            for segment in [part for part in path.split("/") if part]:
                entries = await self._tree_entries(tree, path)
                folder = next((e for e in entries if e.get("type") == "tree" and e.get("path") == segment), None)
                if folder is None:
                    return []
                tree = str(folder["sha"])
            entries = await self._tree_entries(tree, path, recursive=recursive)
        except NotFound:
            return []
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        return [prefix + str(e["path"]) for e in entries if e.get("type") == "blob"]

    async def _tree_entries(self, tree: str, path: str, *, recursive: bool = False) -> list[dict[str, Any]]:
        found = await self.client.getitem(
            "/repos/{owner}/{repo}/git/trees/{tree}", self._at(tree=tree), params={"recursive": "1"} if recursive else None
        )
        if not isinstance(found, dict) or not isinstance(found.get("tree"), list):
            raise BadRequest(None, f"git/trees/{tree}: not a tree")
        if found.get("truncated"):
            # Only past 100,000 entries: a part of the folder must not pass for all of it.
            raise TooLarge(None, f"{path}: GitHub lists only part of its tree")
        return [entry for entry in found["tree"] if isinstance(entry, dict)]

    async def changed_paths(self, base: str, head: str) -> set[str] | None:
        """Paths changed from `base` to `head` (renames give both); None when a comparison
        cannot say: `base` unknown; `head` not built on `base` (a force-push: GitHub diffs
        from their merge base, so what only the dropped commits changed is not listed); or
        as many files as GitHub lists of a comparison (at most 300, the rest unsaid)."""
        try:
            compare = await self.client.getitem(
                "/repos/{owner}/{repo}/compare/{base}...{head}", self._at(base=base, head=head)
            )
        except NotFound:
            return None
        files = compare.get("files") or []
        if compare.get("status") not in ("ahead", "identical") or len(files) >= COMPARE_MAX_FILES:
            return None
        changed: set[str] = set()
        for item in files:
            changed.add(item["filename"])
            if item.get("previous_filename"):
                changed.add(item["previous_filename"])
        return changed

    async def merge_base(self, base: str, head: str) -> str | None:
        """The merge base of `base` and `head`, which GitHub diffs a pull request's head from
        (None when it cannot say). One commit a page: the comparison's commits are not read."""
        try:
            compare = await self.client.getitem(
                "/repos/{owner}/{repo}/compare/{base}...{head}?per_page=1", self._at(base=base, head=head)
            )
        except NotFound:
            return None
        found = (compare.get("merge_base_commit") or {}).get("sha")
        return str(found) if found else None

    # -- pull requests -------------------------------------------------------------------

    async def open_pulls(self) -> AsyncIterator[PullRequest]:
        async for item in self.client.getiter(f"/repos/{{owner}}/{{repo}}/pulls?state=open&{PER_PAGE}", self._at()):
            yield PullRequest.model_validate(item)

    async def pull(self, number: int) -> PullRequest | None:
        try:
            answer = await self.client.getitem("/repos/{owner}/{repo}/pulls/{number}", self._at(number=number))
        except NotFound:
            return None
        return PullRequest.model_validate(answer)

    async def pull_files(self, number: int) -> AsyncIterator[PullFile]:
        async for item in self.client.getiter(
            f"/repos/{{owner}}/{{repo}}/pulls/{{number}}/files?{PER_PAGE}", self._at(number=number)
        ):
            yield PullFile.model_validate(item)

    # -- refs ----------------------------------------------------------------------------

    async def branches(self, prefix: str) -> AsyncIterator[tuple[str, str]]:
        """(branch name, commit sha) of every branch whose name starts with `prefix`."""
        async for ref in self.client.getiter(
            "/repos/{owner}/{repo}/git/matching-refs/{+ref}", self._at(ref=f"heads/{prefix}")
        ):
            yield str(ref["ref"]).removeprefix("refs/heads/"), str(ref["object"]["sha"])

    async def create_branch(self, branch: str, sha: str) -> bool:
        """Create `branch` at `sha`; False when it already exists elsewhere (someone else's)."""
        full = f"refs/heads/{branch}"

        async def made_by_us() -> Any:
            found = await self.client.getitem("/repos/{owner}/{repo}/git/ref/{+ref}", self._at(ref=full[5:]))
            # Ours only if it points at our commit; otherwise another writer won the race.
            return found if found.get("object", {}).get("sha") == sha else None

        try:
            await self.client.post(
                "/repos/{owner}/{repo}/git/refs", self._at(), data={"ref": full, "sha": sha}, verify=made_by_us
            )
        except Conflict as exc:
            # Only this says another writer holds it. A ruleset refusing the name, or an
            # unknown commit, is an error of its own: taken for a lost race, every wave
            # recorded a claim that does not exist and dispatched nothing, saying why nowhere.
            if "already exists" in exc.message:
                return False
            clash = await self._branch_in_the_way(branch) if "Reference update failed" in exc.message else None
            if clash is None:
                raise
            raise RefClash(exc.status, f"branch {clash!r} exists, and git keeps branches as paths: no branch "
                                       f"{branch!r} can be made beside it (rename or delete {clash!r})") from exc
        return True

    async def _branch_in_the_way(self, branch: str) -> str | None:
        """The existing branch that names a folder of `branch` (`klaud` for `klaud/claim-…`)."""
        parts = branch.split("/")
        for end in range(1, len(parts)):
            folder = "/".join(parts[:end])
            try:
                await self.client.getitem("/repos/{owner}/{repo}/git/ref/{+ref}", self._at(ref=f"heads/{folder}"))
            except NotFound:
                continue
            return folder
        return None

    async def delete_branch(self, branch: str) -> bool:
        """Delete `branch`; False when it was already gone."""
        try:
            await self.client.delete("/repos/{owner}/{repo}/git/refs/{+ref}", self._at(ref=f"heads/{branch}"))
        except NotFound:
            return False
        except Conflict as exc:
            # GitHub answers a ref already gone with 422 "Reference does not exist"; any other
            # 422 (a ruleset forbidding deletions) is a refusal, not a ref already released.
            if "does not exist" not in exc.message:
                raise
            return False
        return True

    # -- actions -------------------------------------------------------------------------

    async def dispatch(self, workflow: str, branch: str, inputs: dict[str, str]) -> int | None:
        """Start `workflow` on `branch`; the new run's id when GitHub says it (200), else None."""
        answer = await self.client.post(
            "/repos/{owner}/{repo}/actions/workflows/{workflow}/dispatches",
            self._at(workflow=workflow),
            data={"ref": branch, "inputs": inputs, "return_run_details": True},
        )
        run_id = answer.get("workflow_run_id") if isinstance(answer, dict) else None
        return int(run_id) if isinstance(run_id, int) else None

    async def workflow_runs(
        self, workflow: str, *, created_since: date, active: bool = False
    ) -> AsyncIterator[WorkflowRun]:
        """Runs of `workflow` created on or after `created_since`: the completed ones, or with
        `active` those not completed yet; none when the workflow does not exist."""
        # GitHub filters by one status at a time; "not completed" is several, so the active
        # ones are picked from the unfiltered list (recent runs only: a few pages).
        status = "" if active else "&status=completed"
        created = f">={created_since.isoformat()}"
        seen: set[int] = set()
        for _ in range(MAX_RUN_SEARCHES):
            search = _RunSearch()
            url = f"/repos/{{owner}}/{{repo}}/actions/workflows/{{workflow}}/runs?{PER_PAGE}{status}&created={created}"
            try:
                async for run in self._search_runs(url, workflow, search):
                    # A narrower search lists the runs of its last second again.
                    if run.id not in seen and (not active or run.status != "completed"):
                        yield run
                    seen.add(run.id)
            except NotFound:
                return
            narrower = search.narrower(created_since)
            if narrower is None:
                return
            if narrower == created:
                break  # a thousand runs in one second: no narrower search can split them
            created = narrower
        # Said, not passed over: a reconcile or a keeper missing runs would decide wrongly.
        raise BadRequest(None, f"the runs of {workflow} since {created_since.isoformat()} do not fit in "
                               f"{MAX_RUN_SEARCHES} searches of {RUN_SEARCH_MAX}; stopped")

    async def _search_runs(self, url: str, workflow: str, search: _RunSearch) -> AsyncIterator[WorkflowRun]:
        """The runs one search lists, up to GitHub's cap (no page past it is asked for: what
        GitHub links to after it is not documented)."""
        async for item in self.client.getiter(url, self._at(workflow=workflow), iterable_key="workflow_runs"):
            run = WorkflowRun.model_validate(item)
            search.saw(run)
            yield run
            if search.listed >= RUN_SEARCH_MAX:
                return

    async def run(self, run_id: int) -> WorkflowRun | None:
        try:
            answer = await self.client.getitem("/repos/{owner}/{repo}/actions/runs/{run_id}", self._at(run_id=run_id))
        except NotFound:
            return None
        return WorkflowRun.model_validate(answer)

    async def run_jobs(self, run_id: int) -> list[Job]:
        return [
            Job.model_validate(job)
            async for job in self.client.getiter(
                f"/repos/{{owner}}/{{repo}}/actions/runs/{{run_id}}/jobs?{PER_PAGE}",
                self._at(run_id=run_id),
                iterable_key="jobs",
            )
        ]

    async def run_artifacts(self, run_id: int) -> AsyncIterator[Artifact]:
        async for artifact in self.client.getiter(
            f"/repos/{{owner}}/{{repo}}/actions/runs/{{run_id}}/artifacts?{PER_PAGE}",
            self._at(run_id=run_id),
            iterable_key="artifacts",
        ):
            yield Artifact.model_validate(artifact)

    async def artifacts(self) -> AsyncIterator[Artifact]:
        async for artifact in self.client.getiter(
            f"/repos/{{owner}}/{{repo}}/actions/artifacts?{PER_PAGE}", self._at(), iterable_key="artifacts"
        ):
            yield Artifact.model_validate(artifact)

    async def artifact(self, artifact_id: int) -> Artifact | None:
        try:
            answer = await self.client.getitem(
                "/repos/{owner}/{repo}/actions/artifacts/{artifact_id}", self._at(artifact_id=artifact_id)
            )
        except NotFound:
            return None
        return Artifact.model_validate(answer)

    async def download(self, artifact: Artifact, *, max_bytes: int) -> bytes:
        if artifact.archive_download_url is None:
            raise NotFound(None, f"artifact {artifact.id} has no download URL")
        return await self.client.download(artifact.archive_download_url, max_bytes=max_bytes)

    # -- check runs ----------------------------------------------------------------------

    async def create_check_run(self, payload: dict[str, Any]) -> int | None:
        created = await self.client.post("/repos/{owner}/{repo}/check-runs", self._at(), data=payload)
        check_id = (created or {}).get("id")
        return int(check_id) if isinstance(check_id, int) else None

    async def update_check_run(self, check_run_id: int, payload: dict[str, Any]) -> None:
        await self.client.patch("/repos/{owner}/{repo}/check-runs/{id}", self._at(id=check_run_id), data=payload)

    async def check_run_on(self, head_sha: str, name: str) -> int | None:
        url = "/repos/{owner}/{repo}/commits/{ref}/check-runs?check_name={name}&filter=latest"
        mine = self.client.app_id
        async for check in self.client.getiter(url, self._at(ref=head_sha, name=name), iterable_key="check_runs"):
            if not isinstance(check, dict) or not isinstance(check.get("id"), int):
                continue
            # GitHub lists every App's runs of that name: another Klaud's (a staging one on
            # the same repository) is not this App's to update (GitHub would refuse it).
            app = check.get("app")
            if mine is not None and (not isinstance(app, dict) or app.get("id") != mine):
                continue
            return int(check["id"])
        return None

    # -- comments and people -------------------------------------------------------------

    async def react(self, comment_id: int, content: str) -> None:
        await self.client.post(
            "/repos/{owner}/{repo}/issues/comments/{id}/reactions", self._at(id=comment_id), data={"content": content}
        )

    async def comments(self, number: int) -> AsyncIterator[Comment]:
        async for comment in self.client.getiter(
            f"/repos/{{owner}}/{{repo}}/issues/{{number}}/comments?{PER_PAGE}", self._at(number=number)
        ):
            yield Comment.model_validate(comment)

    async def comments_since(self, since: datetime) -> AsyncIterator[ListedComment]:
        """The comments of every issue and PR updated at or after `since`, by update time,
        oldest first (a reader that stops part-way goes on from the last one it read)."""
        url = f"/repos/{{owner}}/{{repo}}/issues/comments?{PER_PAGE}&sort=updated&direction=asc&since={{since}}"
        async for comment in self.client.getiter(url, self._at(since=stamp(since))):
            yield ListedComment.model_validate(comment)

    async def post_comment(self, number: int, body: str) -> None:
        await self.client.post(
            "/repos/{owner}/{repo}/issues/{number}/comments", self._at(number=number), data={"body": body}
        )

    async def permission(self, user: str) -> tuple[str | None, str | None]:
        """(permission, role_name) of `user` on the repository; ("none", None) for a stranger."""
        try:
            answer = await self.client.getitem(
                "/repos/{owner}/{repo}/collaborators/{user}/permission", self._at(user=user)
            )
        except NotFound:
            return "none", None
        return answer.get("permission"), answer.get("role_name")


    async def blame(self, path: str, ref: str) -> list[BlameRange]:
        data = await self.client.graphql(
            BLAME_QUERY, owner=self._vars["owner"], name=self._vars["repo"], ref=ref, path=path
        )
        found = ((data or {}).get("repository") or {}).get("object") or {}
        ranges = (found.get("blame") or {}).get("ranges") or []
        return [
            BlameRange.model_validate({**item, "committed": item["commit"]["committedDate"]}) for item in ranges
        ]

    # -- issues --------------------------------------------------------------------------

    async def edited_issue(self, number: int) -> EditedIssue | None:
        try:
            data = await self.client.graphql(
                ISSUE_EDIT_QUERY, owner=self._vars["owner"], name=self._vars["repo"], number=number
            )
        except NotFound:
            return None
        issue = ((data or {}).get("repository") or {}).get("issue")
        return EditedIssue.model_validate(issue) if issue is not None else None

    async def find_issue(self, title: str, creator: str) -> Issue | None:
        """The issue `creator` opened with `title`: an open one, else the newest closed one (a
        person may close the dashboard: it is still the dashboard, with the holds it remembers)."""
        closed = None
        async for item in self.client.getiter(
            f"/repos/{{owner}}/{{repo}}/issues?state=all&{PER_PAGE}&creator={{creator}}", self._at(creator=creator)
        ):
            issue = Issue.model_validate(item)
            if issue.title != title or "pull_request" in item:
                continue
            if issue.state == "open":
                return issue
            closed = closed or issue  # newest first, as GitHub lists them
        return closed

    async def create_issue(self, title: str, body: str) -> int | None:
        """The new issue's number; None when none was made (a dry run logs the write)."""
        created = await self.client.post("/repos/{owner}/{repo}/issues", self._at(), data={"title": title, "body": body})
        number = (created or {}).get("number")
        return int(number) if isinstance(number, int) else None

    async def update_issue(self, number: int, body: str) -> None:
        await self.client.patch(
            "/repos/{owner}/{repo}/issues/{number}", self._at(number=number), data={"body": body, "state": "open"}
        )


class GitHubRepos:
    """The App's installations and a `GitHubRepo` for each of their repositories."""

    def __init__(self, app: GitHubApp) -> None:
        self.app = app

    async def installations(self) -> list[int]:
        return [int(installation["id"]) for installation in await self.app.installations()]

    async def repositories(self, installation: int) -> list[Repository]:
        return [Repository.model_validate(repo) for repo in await self.app.installation(installation).repositories()]

    def repo(self, full_name: str, installation: int) -> GitHubRepo:
        return GitHubRepo(self.app.installation(installation), full_name)

    async def repository_by_id(self, installation: int, repository_id: int) -> Repository | None:
        try:
            answer = await self.app.installation(installation).getitem(
                "/repositories/{repository_id}", {"repository_id": repository_id}
            )
        except NotFound:
            return None
        return Repository.model_validate(answer)

    def forget_installation(self, installation: int) -> None:
        self.app.forget_installation(installation)

    async def installation_of(self, full_name: str) -> int | None:
        try:
            answer = await self.app.repo_installation(full_name)
        except NotFound:
            return None
        return int(answer["id"])

    async def granted(self, full_name: str, installation: int) -> tuple[dict[str, str], list[str]]:
        answer = await self.app.repo_installation(full_name)
        return dict(answer.get("permissions") or {}), list(answer.get("events") or [])
